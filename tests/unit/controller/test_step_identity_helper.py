"""``hyperpod step-retry`` with a controller that checks the job against its own view
of Slurm: a job that has just started is not in it until the next pass (404), and the
helper asks again meanwhile instead of failing the step or warning."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hyperpod_agent.client import ControllerError
from hyperpod_agent.step_retry import StepRetry

NOT_SEEN = ControllerError(404, "not_found", "job 12 is not in the controller's view of Slurm")


class NotSeenYet:
    """A controller whose next pass comes after the first ``misses`` requests of each kind."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.watches: list[tuple[Any, ...]] = []
        self.retries: list[tuple[Any, ...]] = []

    def step_watch(self, *args: Any) -> Any:
        self.watches.append(args)
        if len(self.watches) <= self.misses:
            raise NOT_SEEN
        return {"end": False, "cause": "", "renew_every_s": 0.5}

    def step_retry(self, *args: Any) -> Any:
        self.retries.append(args)
        if len(self.retries) <= self.misses:
            raise NOT_SEEN
        return {"decision": "FAIL", "done": True, "cause": "on healthy nodes node[1-2]"}

    def step_retry_state(self, retry_id: int) -> Any:
        raise AssertionError("no surgery here")


def helper(controller: NotSeenYet, seconds: float, said: list[str]) -> StepRetry:
    srun = [sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit(1)"]
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin:/bin"}
    return StepRetry(
        srun,
        env,
        controller,  # type: ignore[arg-type]  # the calls the helper makes, nothing more
        reach_s=10.0,
        poll_s=0.01,
        say=said.append,
    )


def test_a_job_the_controller_has_not_seen_yet_is_watched_and_asked_about_again() -> None:
    said: list[str] = []
    controller = NotSeenYet(misses=2)
    code = helper(controller, 2.4, said).run()
    assert code == 1
    # watched at once, then every second until the controller knew the job
    assert len(controller.watches) >= 3
    # the failure was asked about again, and the controller's answer followed
    assert len(controller.retries) == 3
    assert not any("cannot" in m for m in said), said
    assert said[-1].startswith("FAIL: on healthy nodes"), said


def test_a_job_never_seen_fails_the_step_as_srun_would() -> None:
    said: list[str] = []
    controller = NotSeenYet(misses=10**6)
    h = helper(controller, 0.1, said)
    h.reach_s = 1.0
    assert h.run() == 1
    assert any("could not ask the controller" in m for m in said), said


class KeepsTheBatchHost:
    """A controller whose surgery kept the bad batch host node1 in the job."""

    def step_watch(self, *args: Any) -> Any:
        return {"end": False, "cause": "", "renew_every_s": 0.5}

    def step_retry(self, *args: Any) -> Any:
        return {
            "id": 7, "decision": "RETRYSTEP", "done": True, "cause": "gpu0 xid79 on node1",
            "nodelist": "node[2,5]", "nnodes": 2, "rdzv_host": "node2", "exclude": "node1",
        }  # fmt: skip

    def step_retry_state(self, retry_id: int) -> Any:
        raise AssertionError("answered at once")


def test_the_relaunch_excludes_the_batch_host_the_job_keeps(tmp_path: Path) -> None:
    """srun is run again with --exclude first (a user's own --exclude still wins) and
    the new node list in its environment."""
    calls = tmp_path / "calls"
    srun = tmp_path / "srun"
    srun.write_text(
        "#!/bin/sh\n"
        f'echo "$* | $SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES" >> {calls}\n'
        f'[ "$(wc -l < {calls})" -ge 2 ]\n'
    )
    srun.chmod(0o755)
    said: list[str] = []
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin:/bin"}
    h = StepRetry(
        [str(srun), "-N2", "train.py"],
        env,
        KeepsTheBatchHost(),  # type: ignore[arg-type]
        reach_s=5.0,
        poll_s=0.01,
        say=said.append,
    )
    assert h.run() == 0
    assert calls.read_text().splitlines() == [
        "-N2 train.py | node[1-2] ",
        "--exclude=node1 -N2 train.py | node[2,5] 2",
    ], said
