"""The local cluster's directory: its subdirectories, the machine's and site's files
(slurm.conf, the site's hooks) and cluster.json, all written afresh by ``up``.
hyperpod's part is provisioning's (provisioned.py)."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

from hyperpod_agent.localcluster import render
from hyperpod_agent.localcluster.shape import Shape
from hyperpod_agent.shared_root import prepare_shared_root


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
    # The first head's state and logs (its controller.toml names DIR/var/lib/hyperpod)
    # and the other nodes' own roots: provisioning writes them again.
    for sub in ("var", "nodes"):
        shutil.rmtree(d / sub, ignore_errors=True)
    for sub in ("state", "spool", "autoresume", "log", "checkpoints"):
        shutil.rmtree(d / sub, ignore_errors=True)
        (d / sub).mkdir()
    (d / "autoresume").chmod(0o755)  # only slurmstepd (root) writes markers
    (d / "checkpoints").chmod(0o1777)
    (d / "out").chmod(0o1777)
    # The site's own files; provisioning adds hyperpod's (below).
    for stale in ("plugstack.conf", "job_submit.lua", "hyperpod.conf"):
        (d / "etc" / stale).unlink(missing_ok=True)
    files = {
        shape.slurm_conf: render.slurm_conf(shape, socket.gethostname()),
        d / "etc" / "plugstack.conf": "",
        d / "hooks" / "reboot.sh": render.reboot_sh(shape, sys.executable),
        d / "hooks" / "task_prolog.sh": render.task_prolog_sh(shape),
    }
    if shape.site_hooks:
        (d / "site").mkdir(exist_ok=True)
        files[d / "etc" / "job_submit.lua"] = render.SITE_JOB_SUBMIT
        for hook in render.SITE_HOOKS:
            files[d / "site" / f"{hook}.sh"] = render.site_hook_sh(shape, hook)
    for path, text in files.items():
        path.write_text(text)
        if path.suffix == ".sh":
            path.chmod(0o755)
    meta = asdict(shape)
    meta["dir"] = str(d)
    meta["host_boot_epoch"] = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    (d / "cluster.json").write_text(json.dumps(meta, indent=2) + "\n")
