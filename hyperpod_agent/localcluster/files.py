"""The local cluster's directory: its subdirectories, the files rendered into it
(slurm.conf, plugstack.conf, job_submit.lua, the hooks), cluster.json and the SPANK
plugin, all written afresh by ``up``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import render
from hyperpod_agent.localcluster.shape import Shape
from hyperpod_agent.provision.render import JOB_SUBMIT
from hyperpod_agent.shared_root import prepare_shared_root

SPANK_SOURCE = Path(__file__).resolve().parents[2] / "spank_plugin"


def install_spank_plugin(lib: Path) -> None:
    """Build spank_plugin/ (or take $HYPERPOD_SPANK_PLUGIN) and install it atomically
    as ``lib/auto_resume.so``, so running daemons never load a half-written file."""
    built = os.environ.get("HYPERPOD_SPANK_PLUGIN")
    if built:
        so = Path(built)
    else:
        if not (SPANK_SOURCE / "Makefile").exists():
            raise LocalClusterError(
                "SPANK plugin source not found: set HYPERPOD_SPANK_PLUGIN to a built auto_resume.so"
            )
        res = subprocess.run(
            ["make", "-s", "-C", str(SPANK_SOURCE)], capture_output=True, text=True, timeout=120
        )
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:]
            raise LocalClusterError(f"building the SPANK plugin failed: {' '.join(tail)}")
        so = SPANK_SOURCE / "auto_resume.so"
    if not so.exists():
        raise LocalClusterError(f"SPANK plugin {so} does not exist")
    tmp = lib / "auto_resume.so.new"
    shutil.copyfile(so, tmp)
    os.replace(tmp, lib / "auto_resume.so")


def write_files(shape: Shape) -> None:
    """Create the cluster's directory under ``shape.dir`` and write every file the
    daemons read."""
    d = shape.dir
    for sub in (
        "etc",
        "run",
        "log",
        "state",
        "spool",
        "munge",
        "hooks",
        "lib",
        "autoresume",
        "checkpoints",
        "out",
    ):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # A fresh start: no old jobs, job ids from 1, clean logs.
    shutil.rmtree(shape.memory_root, ignore_errors=True)
    shutil.rmtree(shape.progress_root, ignore_errors=True)
    # Each node's roots, as its agent makes them (root's, 1777): the plugstack names
    # them, and slurmstepd makes each job's directory in them.
    for name in shape.all_names:
        prepare_shared_root(shape.memory_root / name)
        prepare_shared_root(shape.progress_root / name)
    for sub in ("state", "spool", "autoresume", "log", "checkpoints"):
        shutil.rmtree(d / sub, ignore_errors=True)
        (d / sub).mkdir()
    (d / "autoresume").chmod(0o755)  # only slurmstepd (root) writes markers
    (d / "checkpoints").chmod(0o1777)
    (d / "out").chmod(0o1777)
    files = {
        shape.slurm_conf: render.slurm_conf(shape, socket.gethostname()),
        d / "etc" / "plugstack.conf": render.plugstack_conf(shape),
        d / "etc" / "job_submit.lua": JOB_SUBMIT,
        d / "hooks" / "reboot.sh": render.reboot_sh(shape, sys.executable),
        d / "hooks" / "epilog_ctld.sh": render.epilog_ctld_sh(shape, sys.executable),
        d / "hooks" / "task_prolog.sh": render.task_prolog_sh(shape),
    }
    for path, text in files.items():
        path.write_text(text)
        if path.suffix == ".sh":
            path.chmod(0o755)
    meta = asdict(shape)
    meta["dir"] = str(d)
    meta["host_boot_epoch"] = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    (d / "cluster.json").write_text(json.dumps(meta, indent=2) + "\n")
    install_spank_plugin(d / "lib")
