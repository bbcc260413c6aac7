"""The running slurmctld's version, and whether the job expansion step retry needs is
known to be safe on it.

Step retry merges a spare into a running job (slurm/resize.py). On Slurm 25.11 (and
26.05) ``scontrol update jobid=<helper> NumNodes=0`` crashes slurmctld with a
segmentation fault: the expansion check added for hierarchical resources walks each
job's license list, which is NULL for a job that asked for no license
(``_valid_license_job_expansion`` in job_mgr.c). Slurm 22.05 to 24.11 have no such
check. A resilience tool that takes down the cluster's controller is the worst outcome
there is, so the recipe runs only on versions it was shown safe on by a drill, never
on one merely believed safe; anywhere else a step retry is answered with the
job-level requeue.
"""

from __future__ import annotations

import re

# (major, minor) releases the drills ran the whole recipe on (tests/integration:
# test_step_retry_drills.py, test_train_ddp_drill.py).
EXPANSION_SHOWN_SAFE = frozenset({(22, 5)})
# From here on it crashes slurmctld (read in the source, seen in a core's backtrace on
# 25.11.7 and 26.05.3).
EXPANSION_CRASHES_FROM = (25, 11)

_CONFIG_LINE = re.compile(r"^SLURM_VERSION\s*=\s*(\S+)\s*$", re.MULTILINE)
_VERSION = re.compile(r"(\d{1,4})\.(\d{1,2})\.(\d{1,4})(?:[-.][0-9A-Za-z.-]*)?", re.ASCII)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, micro) from a version string such as ``22.05.8`` or
    ``25.11.0-0rc1``; None when it is not one."""
    m = _VERSION.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def version_from_config(text: str) -> str | None:
    """``SLURM_VERSION`` from ``scontrol show config`` (slurmctld's own, not the
    command's); None when the output has none."""
    m = _CONFIG_LINE.search(text)
    return m.group(1) if m else None


def expansion_refusal(version: str | None) -> str:
    """Why a running job must not be expanded on slurmctld ``version`` ("" when the
    recipe was shown safe there)."""
    if version is None:
        return "job expansion refused: slurmctld's version is not known"
    parsed = parse_version(version)
    if parsed is None:
        return f"job expansion refused: slurmctld's version {version!r} is not one we know"
    release = parsed[:2]
    if release in EXPANSION_SHOWN_SAFE:
        return ""
    if release >= EXPANSION_CRASHES_FROM:
        return (
            f"job expansion refused: it crashes slurmctld {version} (NULL license list "
            "in the expansion check)"
        )
    return f"job expansion refused: not shown safe on Slurm {version}"
