"""The check job of a deep-check run: its name, which jobs are ours, its script.

A run's name (``CheckRun.reservation``, ``hyperpod-check-<id>-<created>``) is public
(``GET /v1/checks``) and any user may submit a job under it: a job is the run's only
with that whole name, submitted by this controller's user (Slurm records the uid) and,
when the run's nodes are given, on none but those.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.store.checks import CheckRun
from hyperpod_agent.slurm.models import Job

# the whole of a run's name, ASCII digits only (CheckRun.reservation)
RUN_NAME = re.compile(r"hyperpod-check-[0-9]{1,12}-[0-9]{1,12}", re.ASCII)


def is_ours(job: Job, run_name: str, uid: int, nodes: Sequence[str] | None = None) -> bool:
    """``job`` is the check job of run ``run_name``: that name, submitted by ``uid``
    (this controller's) and, when ``nodes`` are given, on none but those (a job inside
    the run's reservation can run nowhere else; Job does not carry its reservation)."""
    if job.name != run_name or job.uid is None or job.uid != uid:
        return False
    return nodes is None or set(job.nodes) <= set(nodes)


def script(run: CheckRun, deep: DeepCheckConfig, out: Path) -> str:
    """The batch script of ``run``: one task per node running the suite, results to
    ``out``."""
    assert deep.suite is not None
    argv = [
        *deep.command, "run", "--suite", str(deep.suite),
        "--level", run.level, "--out", str(out),
    ]  # fmt: skip
    lines = ["#!/bin/sh", f"# deep check run {run.id}: {run.purpose} {','.join(run.nodes)}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(deep.env.items())]
    srun = ["srun", f"--nodes={len(run.nodes)}", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    lines.append("exec " + shlex.join(srun + argv))
    return "\n".join(lines) + "\n"
