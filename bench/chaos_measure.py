"""What the campaign's workload measured, beside the checker's verdict: each fault's
recovery (fault -> the hit job running again) and the workload's effective training
time. Read from the jobs' own outputs and Slurm's samples, never from the product."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.chaos_evidence import Injection, JobSample, Recovery, TrainOutput


@dataclass(frozen=True)
class Goodput:
    """Productive step time over wall time, summed over the training jobs."""

    ettr: float
    productive_s: float
    wall_s: float
    jobs: int


def running_at(jobs: Sequence[JobSample], t: float) -> dict[int, tuple[str, ...]]:
    """The jobs Slurm showed RUNNING in the last sweep at or before ``t``, with nodes."""
    before = [j.t for j in jobs if j.t <= t]
    if not before:
        return {}
    sweep = max(before)
    return {j.job_id: j.nodes for j in jobs if j.t == sweep and j.state == "RUNNING"}


def recoveries(
    injections: Sequence[Injection],
    jobs: Sequence[JobSample],
    outputs: Mapping[int, TrainOutput],
) -> list[Recovery]:
    """One record per (fault, training job on the faulted node): running again is the
    first attempt the job's output starts after the fault. A job that finished its run
    without a new attempt was not hit (an agent killed under it); one that never ran
    again is a recovery that never came (``running_at`` None)."""
    found: list[Recovery] = []
    for inj in sorted(injections, key=lambda i: i.t):
        for job_id, nodes in running_at(jobs, inj.t).items():
            out = outputs.get(job_id)
            if out is None or inj.target not in nodes:
                continue
            later = [a.started_at for a in out.attempts if a.started_at > inj.t]
            if later:
                found.append(Recovery(inj.kind, inj.t, min(later)))
            elif out.done_step is None:
                found.append(Recovery(inj.kind, inj.t, None))
    return found


def step_time(out: TrainOutput) -> float | None:
    """The median gap between consecutive steps of one attempt, over all attempts."""
    gaps = [
        b[1] - a[1]
        for att in out.attempts
        for a, b in zip(att.steps, att.steps[1:], strict=False)
        if b[0] == a[0] + 1
    ]
    return statistics.median(gaps) if gaps else None


def workload_goodput(outputs: Mapping[int, TrainOutput]) -> Goodput | None:
    """Each job's distinct steps at its median step time, over its wall time (first
    attempt's start to its last line); None when no job printed two steps in a row."""
    productive = wall = 0.0
    n = 0
    for out in outputs.values():
        step_s = step_time(out)
        if step_s is None or not out.attempts:
            continue
        productive += len(set(out.steps)) * step_s
        wall += max(a.last_at for a in out.attempts) - out.attempts[0].started_at
        n += 1
    if n == 0 or wall <= 0:
        return None
    return Goodput(productive / wall, productive, wall, n)
