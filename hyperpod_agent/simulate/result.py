"""What one simulation run tells: ETTR, GPU-hours lost by cause and by phase, spares
over time, incidents. Plain data, JSON-ready."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hyperpod_agent.simulate.ledger import PHASES, Incident


class Strategy(enum.StrEnum):
    """How the job recovers from a node fault."""

    SLURM = "slurm"  # Slurm alone, defaults: the job fails, the user resubmits
    REQUEUE = "requeue"  # our job-level requeue (sbatch --auto-resume)
    STEP_RETRY = "step_retry"  # our in-place step retry with a spare (srun --auto-resume)
    MEMCKPT = "step_retry_memckpt"  # step retry plus a memory checkpoint every step


@dataclass(frozen=True)
class Scenario:
    """One run: the cluster, the job, the recovery strategy."""

    nodes: int  # all nodes: the job's and the spare pool
    spares: int = 0
    gpus_per_node: int = 8
    days: float = 30.0
    checkpoint_interval_s: float = 1800.0
    strategy: Strategy = Strategy.REQUEUE
    seed: int = 0
    # --auto-resume=N of the job (the SPANK option's maximum): a spent budget means the
    # user resubmits, as they would a job that failed
    auto_resume_cap: int = 1000

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if not 0 <= self.spares < self.nodes:
            raise ValueError(f"spares must be in 0..nodes-1 ({self.nodes - 1}), got {self.spares}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus per node must be >= 1, got {self.gpus_per_node}")
        if not self.days > 0:
            raise ValueError(f"days must be > 0, got {self.days}")
        if not self.checkpoint_interval_s > 0:
            raise ValueError(f"checkpoint interval must be > 0 s, got {self.checkpoint_interval_s}")

    @property
    def job_nodes(self) -> int:
        return self.nodes - self.spares


@dataclass
class Result:
    scenario: Scenario
    wall_s: float
    kept_s: float
    by_phase: dict[str, float]
    by_cause: dict[str, float]
    incidents: list[Incident]
    # (day, spares in the pool, of them ready, nodes out of service)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    faults: int = 0
    decide_calls: int = 0
    step_decisions: int = 0
    incident_mode_passes: int = 0
    events: int = 0

    @property
    def ettr(self) -> float:
        """Effective training time ratio: progress kept over wall time."""
        return self.kept_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def lost_s(self) -> float:
        return sum(self.by_phase.values())

    def gpu_hours(self, seconds: float) -> float:
        """Job-seconds to GPU-hours of the job's GPUs."""
        return seconds * self.scenario.job_nodes * self.scenario.gpus_per_node / 3600.0

    def to_dict(self, incidents: int = 20) -> dict[str, Any]:
        s = self.scenario
        outcomes = Counter(i.outcome for i in self.incidents)
        return {
            "strategy": s.strategy.value,
            "nodes": s.nodes,
            "job_nodes": s.job_nodes,
            "spares": s.spares,
            "gpus_per_node": s.gpus_per_node,
            "days": s.days,
            "checkpoint_interval_s": s.checkpoint_interval_s,
            "seed": s.seed,
            "ettr": round(self.ettr, 6),
            "job_gpu_hours": round(self.gpu_hours(self.wall_s), 1),
            "gpu_hours_lost": round(self.gpu_hours(self.lost_s), 1),
            "gpu_hours_lost_by_phase": {
                p: round(self.gpu_hours(self.by_phase.get(p, 0.0)), 1) for p in PHASES
            },
            "gpu_hours_lost_by_cause": {
                c: round(self.gpu_hours(v), 1) for c, v in sorted(self.by_cause.items())
            },
            "spare_gpu_hours": round(s.spares * s.gpus_per_node * self.wall_s / 3600.0, 1),
            "faults": self.faults,
            "incidents": len(self.incidents),
            "incidents_by_outcome": dict(sorted(outcomes.items())),
            "incident_mode_passes": self.incident_mode_passes,
            "policy_calls": {"decide": self.decide_calls, "decide_step": self.step_decisions},
            "events": self.events,
            "spares_timeline": [list(row) for row in self.timeline],
            "first_incidents": [vars(i) for i in self.incidents[:incidents]],
        }
