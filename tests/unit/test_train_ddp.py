"""examples/train_ddp.py as real processes: two ranks on 127.0.0.1 (torch.distributed on
gloo, the checkpoint library with its replica servers, the progress records), no Slurm.

A run interrupted (both ranks exit at once after step K, as a lost node's job would) and
resumed ends with the parameters of an unbroken run, bit for bit, and computes the same
loss at every step; a rank whose memory tier is gone (a new node) restores from the
replica on its peer, at most one step behind."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperpod_agent.progress import format as fmt

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "examples" / "train_ddp.py"
STEPS, CRASH = 20, 9
ARGS = ("--steps", str(STEPS), "--persistent-every", "5", "--eval-every", "10")
LAUNCH_TIMEOUT_S = 90.0  # a launch takes about 5 s here; a hung rendezvous is bounded too
JOB = 4242


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 now (held together while chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Launch:
    codes: list[int]
    logs: list[str]

    def restored(self, rank: int) -> tuple[int, str]:
        """(step, tier) the rank restored, from its ``rank=R restored ...`` line."""
        for line in self.logs[rank].splitlines():
            if line.startswith(f"rank={rank} restored "):
                fields = dict(f.split("=", 1) for f in line.split()[2:])
                return int(fields["step"]), fields["tier"]
        raise AssertionError(f"rank {rank} restored nothing:\n{self.logs[rank][-2000:]}")


def launch(base: Path, *extra: str, record_progress: bool = False) -> Launch:
    """Both ranks of one launch, waited for (bounded)."""
    store, *peers = free_ports(3)
    base.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in (0, 1):
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(base),
            "PYTHONPATH": str(REPO),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store),
            "SLURMD_NODENAME": f"n{rank}",
            "HYPERPOD_CHECKPOINT_DIR": str(base / "persistent"),
            "HYPERPOD_CHECKPOINT_MEMORY_DIR": str(base / "shm" / f"n{rank}"),
            "HYPERPOD_CHECKPOINT_PEERS": f"n0=127.0.0.1:{peers[0]},n1=127.0.0.1:{peers[1]}",
            "HYPERPOD_CHECKPOINT_SERVE": "1",
        }
        if record_progress:
            env.update({"SLURM_JOB_ID": str(JOB), fmt.ROOT_ENV: str(base / "progress")})
        log = open(base / f"rank{rank}.log", "a")  # noqa: SIM115 - closed below
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(SCRIPT), "--out", str(base / "out"), *ARGS, *extra],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=base,
                ),
                log,
            )
        )
    codes = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=LAUNCH_TIMEOUT_S))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
    return Launch(codes, [(base / f"rank{r}.log").read_text() for r in (0, 1)])


def losses(base: Path) -> dict[int, str]:
    """Step -> loss (hex) from losses.txt; a step computed twice (before an interruption
    and again after the resume) must have had the same loss both times."""
    out: dict[int, str] = {}
    for line in (base / "out" / "losses.txt").read_text().splitlines():
        step, value = line.split()
        assert out.setdefault(int(step), value) == value, (
            f"step {step}: {value} != {out[int(step)]}"
        )
    return out


def final(base: Path) -> tuple[str, dict[str, object]]:
    digest = (base / "out" / "params.sha256").read_text().strip()
    return digest, torch.load(base / "out" / "final.pt")


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("unbroken")
    run = launch(base, record_progress=True)
    assert run.codes == [0, 0], run.logs
    assert f"done step={STEPS}" in run.logs[0]
    return base


def same_as_unbroken(base: Path, unbroken: Path, resumed_from: int) -> None:
    digest, params = final(base)
    want_digest, want = final(unbroken)
    assert digest == want_digest
    assert params.keys() == want.keys()
    assert all(torch.equal(params[k], want[k]) for k in want)  # type: ignore[arg-type]
    got, ref = losses(base), losses(unbroken)
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert got == ref  # every step, before the interruption and after the resume
    after = [s for s in got if s > resumed_from]
    assert after == list(range(resumed_from + 1, STEPS + 1))


class Crashed:
    """One run interrupted after step CRASH, kept aside: ``fresh()`` puts a copy of it
    back at the same path for each resume (a run's fast tiers are named after its
    persistent directory's path, so a copy elsewhere would be another run)."""

    def __init__(self, base: Path) -> None:
        self.base, self.kept = base / "run", base / "kept"
        run = launch(self.base, "--crash-after", str(CRASH))
        # Each rank leaves once step CRASH is handed to the library; the other may see
        # its peer's sockets close first, and fail on its own.
        assert all(code != 0 for code in run.codes), run.logs
        assert f"step={CRASH} loss=" in run.logs[0] and "done step" not in run.logs[0]
        shutil.copytree(self.base, self.kept, symlinks=True)

    def fresh(self) -> Path:
        shutil.rmtree(self.base)
        shutil.copytree(self.kept, self.base, symlinks=True)
        return self.base


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Crashed:
    return Crashed(tmp_path_factory.mktemp("crashed"))


def test_the_unbroken_run_records_compute_time_apart(unbroken: Path) -> None:
    for rank in (0, 1):
        rec = fmt.decode(fmt.record_path(unbroken / "progress", JOB, rank).read_bytes())
        assert rec.step == STEPS and rec.compute_total >= STEPS - 2
        recent = rec.durations[-len(rec.compute) :]
        pairs = [(c, d) for c, d in zip(rec.compute, recent, strict=True) if not math.isnan(c)]
        assert pairs and all(0 < c <= d for c, d in pairs), "compute is part of the step"


def test_interrupted_and_resumed_equals_unbroken(crashed: Crashed, unbroken: Path) -> None:
    base = crashed.fresh()
    run = launch(base)
    assert run.codes == [0, 0], run.logs
    step, tier = run.restored(0)
    assert run.restored(1)[0] == step
    assert CRASH - 1 <= step <= CRASH, "the memory tier holds the last save or the one before"
    assert tier == "memory"
    same_as_unbroken(base, unbroken, step)


def test_a_rank_without_its_memory_tier_restores_from_its_peer(
    crashed: Crashed, unbroken: Path
) -> None:
    base = crashed.fresh()
    shutil.rmtree(base / "shm" / "n1")  # rank 1 comes back on a new node
    run = launch(base)
    assert run.codes == [0, 0], run.logs
    step, tier = run.restored(1)
    assert tier == "peer", run.logs[1]
    assert CRASH - 1 <= step <= CRASH and run.restored(0)[0] == step
    same_as_unbroken(base, unbroken, step)
