"""Test data for provisioning: valid parameters, a small source tree, a tree lister,
the problems parameters give, and a controller that only answers /v1/healthz.

The source tree stands in for the repository: systemd units and a spank_plugin/Makefile
that "builds" auto_resume.so by copying a file, so the build step runs real ``make``
without a C compiler or Slurm headers.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisionError

AGENT_UNIT = """[Unit]
Description=hyperpod node health agent

[Service]
ExecStart=/opt/hyperpod/venv/bin/hyperpod-agent

[Install]
WantedBy=multi-user.target
"""
CONTROLLER_UNIT = AGENT_UNIT.replace("node health agent", "controller").replace(
    "hyperpod-agent", "hyperpod-controller"
)
MAKEFILE = "auto_resume.so: auto_resume.c\n\tcp auto_resume.c auto_resume.so\n"
PLUGIN_BYTES = b"\x7fELF not really a plugin\n"


def base_params() -> dict[str, Any]:
    """A small valid cluster: head, two login nodes, four GPU workers, one spare."""
    return {
        "cluster_name": "test",
        "controller": {"nodes": ["head"]},
        "login_groups": [{"name": "login", "nodes": "login[1-2]"}],
        "worker_groups": [
            {"name": "gpu", "nodes": "node[1-5]", "partitions": ["main"], "gpus": 8},
            {"name": "cpu", "nodes": ["cpu1"], "partitions": "dev", "gpus": 0},
        ],
        "partitions": [{"name": "main", "default": True}, {"name": "dev"}],
        "spare_pool": {"nodes": ["node5"], "partition": "main"},
        "controller_url": "http://127.0.0.1:28899",
        "slurm": {"auto_resume": {"checkpoint_root": "/fsx/ckpt"}},
    }


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> "dir 0755", "file 0644" or "link -> target"."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"link -> {path.readlink()}"
        elif path.is_dir():
            out[rel] = f"dir {path.stat().st_mode & 0o7777:04o}"
        else:
            out[rel] = f"file {path.stat().st_mode & 0o7777:04o}"
    return out


def problems(data: Any, source: str = "params.json") -> list[str]:
    """The one-line problems parse_parameters reports for ``data``."""
    with pytest.raises(ProvisionError) as info:
        parse_parameters(data, source)
    return info.value.problems


class Healthz(BaseHTTPRequestHandler):
    """A controller's /v1/healthz and nothing else."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/v1/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass
