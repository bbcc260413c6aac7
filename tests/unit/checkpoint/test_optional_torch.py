"""The library works with NumPy alone and never imports torch on its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import sys
sys.modules["torch"] = None  # any 'import torch' now fails, as on a machine without torch
import numpy as np
from hyperpod_agent.checkpoint import Checkpointer
ckpt = Checkpointer(sys.argv[1] + "/p", memory_dir=sys.argv[1] + "/m")
ckpt.save(1, {"w": np.arange(4.0), "n": 1}).wait()
step, state = ckpt.load_latest()
assert step == 1 and state["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
ckpt.close()
print("ok")
"""


def test_numpy_only_without_torch(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
