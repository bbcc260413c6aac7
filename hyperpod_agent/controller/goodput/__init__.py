"""Measured goodput: how much of a job's wall time its training kept, and where the rest
went, from the records the controller already keeps (docs/goodput.md, "Measured
goodput").

``model`` holds what the computation reads and answers, ``incidents`` turns the event
log into recoveries, ``timeline`` shares a job's wall time out among causes and
``compute`` puts them together. No I/O here: ``controller/api/goodput.py`` reads the
store and Slurm's view and calls ``job_goodput`` or ``cluster_goodput``.
"""

from __future__ import annotations

from hyperpod_agent.controller.goodput.compute import cluster_goodput, job_goodput
from hyperpod_agent.controller.goodput.model import (
    CAUSES,
    ClusterGoodput,
    JobGoodput,
    JobRecord,
    Lost,
    ProgressMark,
)

__all__ = [
    "CAUSES",
    "ClusterGoodput",
    "JobGoodput",
    "JobRecord",
    "Lost",
    "ProgressMark",
    "cluster_goodput",
    "job_goodput",
]
