"""The agent daemon stays small: it loads neither numpy nor the checkpoint library.

Checked in a fresh interpreter, so that what other tests imported does not count.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import hyperpod_agent.agent.cli, hyperpod_agent.agent.daemon
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.daemon import build_probes
build_probes(AgentConfig())
heavy = ("numpy", "torch", "hyperpod_agent.checkpoint", "hyperpod_agent.controller")
print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))
"""


def test_the_agent_daemon_imports_neither_numpy_nor_the_checkpoint_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
