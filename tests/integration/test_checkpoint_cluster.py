"""A 2-node Slurm job saves with peer replication; restores come from the peer, then disk.

The job runs one task per node through ``srun``; each task hosts its node's replica server
(HYPERPOD_CHECKPOINT_SERVE=1). On one machine every node's "/dev/shm" is a directory of its
own, chosen by node name, so wiping one node's memory tier is deleting one directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

PEER_PORTS = (24847, 24848)

TASK = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    from hyperpod_agent.checkpoint import Checkpointer

    mode, base = sys.argv[1], Path(sys.argv[2])
    node = os.environ["SLURMD_NODENAME"]
    os.environ["HYPERPOD_CHECKPOINT_MEMORY_DIR"] = str(base / "shm" / node)
    ckpt = Checkpointer.from_env()

    def state(rank, step):
        return {"w": np.full((256, 256), rank * 1000 + step, np.float32), "step": step}

    def barrier(name):
        # Keep this task's replica server up until every task is done with it.
        (base / f"{name}-{ckpt.rank}").touch()
        deadline = time.monotonic() + 60
        while not all((base / f"{name}-{r}").exists() for r in range(ckpt.world_size)):
            if time.monotonic() > deadline:
                sys.exit("barrier timed out")
            time.sleep(0.05)

    out = {"rank": ckpt.rank, "node": node}
    if mode == "save":
        for step in (1, 2, 3):
            ckpt.save(step, state(ckpt.rank, step))
        ckpt.wait()
    else:
        step, value = ckpt.load_latest(state(ckpt.rank, 0))
        info = ckpt.last_restore
        out.update(step=step, tier=info.tier, source=info.source,
                   exact=bool(np.array_equal(value["w"], state(ckpt.rank, step)["w"])))
    barrier(mode + "-" + sys.argv[3])
    print("RESULT " + json.dumps(out), flush=True)
    ckpt.close()
    """
)


def _run_job(cluster: Any, base: Path, mode: str, tag: str) -> list[dict[str, Any]]:
    nodes = cluster.nodes[:2]
    peers = ",".join(f"{n}=127.0.0.1:{p}" for n, p in zip(nodes, PEER_PORTS, strict=True))
    out = base / f"{tag}.out"
    script = base / f"{tag}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export HYPERPOD_CHECKPOINT_DIR={base / 'persistent'}\n"
        f"export HYPERPOD_CHECKPOINT_PEERS={peers}\n"
        "export HYPERPOD_CHECKPOINT_SERVE=1\n"
        f"export PYTHONPATH={Path(__file__).parents[2]}\n"
        f"srun -N2 --ntasks-per-node=1 {sys.executable} {base / 'task.py'} {mode} {base} {tag}\n"
    )
    job = (
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N2",
                "--ntasks-per-node=1",
                "-w",
                ",".join(nodes),
                "-o",
                str(out),
                "-t",
                "5",
                str(script),
            ],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    deadline = time.monotonic() + 120
    state = ""
    while time.monotonic() < deadline:
        show = subprocess.run(
            ["scontrol", "show", "job", job],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        state = show.split("JobState=")[1].split()[0] if "JobState=" in show else "GONE"
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
            break
        time.sleep(0.5)
    text = out.read_text() if out.exists() else ""
    if state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
        subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=30)
    assert state == "COMPLETED", f"job {job} ended {state}: {text[-2000:]}"
    results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2, text[-2000:]
    return sorted(results, key=lambda r: r["rank"])


def test_two_node_job_restores_from_peer_then_persistent(
    local_cluster: Any, tmp_path: Path
) -> None:
    local_cluster.wait_idle(local_cluster.nodes[:2], timeout=30)  # fail fast on a down node
    base = Path("/var/tmp/hp-ckpt") / tmp_path.name
    base.mkdir(parents=True, exist_ok=True)
    try:
        (base / "task.py").write_text(TASK)
        saved = _run_job(local_cluster, base, "save", "save")
        assert [r["rank"] for r in saved] == [0, 1]
        node1, node2 = local_cluster.nodes[:2]

        shutil.rmtree(base / "shm" / node1)  # node1 lost its memory (e.g. replaced)
        got = _run_job(local_cluster, base, "load", "peer")
        assert got[0]["step"] == got[1]["step"] == 3
        assert (got[0]["tier"], got[0]["source"]) == ("peer", node2)
        assert got[1]["tier"] == "memory"
        assert all(r["exact"] for r in got)

        shutil.rmtree(base / "shm")  # every node lost its memory
        got = _run_job(local_cluster, base, "load", "disk")
        assert [r["tier"] for r in got] == ["persistent", "persistent"]
        assert all(r["step"] == 3 and r["exact"] for r in got)
    finally:
        shutil.rmtree(base, ignore_errors=True)
