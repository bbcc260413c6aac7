"""Hang judgement at the shipped cadences (agents every 5 s, passes every 10 s, the
shipped hang limits), on a local cluster of its own started with them: a healthy
2-node job with 0.3 s steps runs for ``HEALTHY_S`` with no hang finding, and in the
same cluster a job with one SIGSTOPped rank, on a node chosen at random (the batch
host included), is declared hung with that node named.

The bound a hang must be declared within, as shipped: 2 x p95 step + 10 s + one agent
cycle (5 s). A single trial may land anywhere in its pass and cycle, so the drill
allows twice that; bench/hang.py measures the median against the bound itself.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hang_drills import cancel, events, steps_done, sync_dir

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.localcluster import drill
from hyperpod_agent.localcluster.cluster import LocalCluster

DIR = Path("/var/tmp/hyperpod-hang-shipped")
PORT_BASE = 19017
STEP_S = 0.3
HEALTHY_S = float(os.environ.get("HYPERPOD_HANG_HEALTHY_S", "600"))
AGENT_CYCLE_S = AgentConfig.model_fields["cycle_s"].default or 5.0
BOUND_S = 2 * STEP_S * 1.1 + 10 + AGENT_CYCLE_S
# The healthy job's course, the cluster's start and the job's end, bounded. Its own
# cluster and a lane of its own (scripts/test.sh): mostly waiting, it runs beside the
# others.
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.soak,
    pytest.mark.timeout(int(HEALTHY_S) + 600),
]


@pytest.fixture(scope="module")
def shipped() -> Iterator[LocalCluster]:
    cluster = LocalCluster(DIR, nodes=4, spares=1, port_base=PORT_BASE, shipped_cadences=True)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


def test_no_false_hang_in_a_healthy_job_and_a_frozen_rank_declared_at_shipped_cadences(
    shipped: LocalCluster,
) -> None:
    seed = int(os.environ.get("HYPERPOD_DRILL_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    healthy_steps = int(HEALTHY_S / STEP_S)
    healthy, healthy_out = drill.submit_training(
        shipped,
        steps=healthy_steps,
        step_time=STEP_S,
        ckpt_every=50,
        train_args=("--sync", sync_dir(shipped)),
    )
    hung, hung_out = drill.submit_training(
        shipped,
        steps=healthy_steps,
        step_time=STEP_S,
        ckpt_every=50,
        auto_resume=None,  # the finding is the point: the job stays for the look
        env={"HYPERPOD_CHECKPOINT_DIR": str(shipped.dir / "checkpoints" / f"t{time.time_ns()}")},
        train_args=("--sync", sync_dir(shipped)),
    )
    started = time.monotonic()
    try:
        job = steps_done(shipped, hung, hung_out, 30)
        victim = rng.choice(sorted(job.nodes))
        print(f"seed {seed} (HYPERPOD_DRILL_SEED={seed} replays): frozen rank on {victim}")
        drill.freeze_ranks(shipped, hung, victim)
        frozen_at = time.monotonic()
        [hang] = drill.wait_for(
            "the hang declared", 2 * BOUND_S, lambda: events(shipped, "hang", hung), 0.5
        )
        took = time.monotonic() - frozen_at
        print(f"hang declared {took:.1f} s after the freeze (bound {BOUND_S:.1f} s)")
        assert f"suspect {victim}" in hang["message"], hang
        # The healthy job runs its whole course beside it, never judged hung.
        left = HEALTHY_S - (time.monotonic() - started)
        done = drill.wait_job_end(shipped, healthy, timeout=left + 300)
        assert done.state == "COMPLETED" and done.restart_count == 0, done
        assert drill.parse_train_log(healthy_out.read_text()).last_step >= healthy_steps - 1
        assert events(shipped, "hang", healthy) == []
        assert [e for e in events(shipped, "straggler") if e.get("job_id") == healthy] == []
    finally:
        cancel(shipped, hung)
        cancel(shipped, healthy)
