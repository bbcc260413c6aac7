"""A run never restores another run's state: the fast tiers belong to the persistent directory."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.checkpoint import identity as ident

from .conftest import assert_same, free_port, sample_state

REPORTED = """
HYPERPOD_CHECKPOINT_DIR=$(mktemp -d) SLURM_PROCID=0 SLURM_NTASKS=1 python - <<'PY'
import numpy as np
from hyperpod_agent.checkpoint import Checkpointer
c = Checkpointer.from_env()
c.save(2, {"w": np.arange(1000, dtype=np.float32)}).wait()
PY
HYPERPOD_CHECKPOINT_DIR=$(mktemp -d) SLURM_PROCID=0 SLURM_NTASKS=1 python - <<'PY'
import numpy as np
from hyperpod_agent.checkpoint import Checkpointer
print(Checkpointer.from_env().load_latest())   # a brand-new directory: expected None
PY
"""


def _clean_env(tmp: Path) -> dict[str, str]:
    """The environment of a user outside Slurm and torchrun, with this checkout's python."""
    drop = ("SLURM_", "HYPERPOD_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(Path(__file__).parents[3])
    env["TMPDIR"] = str(tmp)  # mktemp -d makes the persistent directories here
    return env


@pytest.fixture
def default_memory_tiers(tmp_path: Path) -> Iterator[Path]:
    """Persistent directories of runs that use the default memory root; their memory tiers
    (under /dev/shm) are removed afterwards."""
    made_root = not ident.DEFAULT_MEMORY_ROOT.exists()
    yield tmp_path
    for p in tmp_path.iterdir():
        if (p / ident.RUN_FILE).exists():
            run = ident.load_or_create(p)
            job = ident.default_job_dir(None)
            shutil.rmtree(job / run.dir_name, ignore_errors=True)
            try:
                job.rmdir()  # only if no other run is left there
            except OSError:
                pass
    if made_root:
        try:
            ident.DEFAULT_MEMORY_ROOT.rmdir()
        except OSError:
            pass


def test_the_reported_reproduction_restores_nothing_in_a_new_directory(
    default_memory_tiers: Path,
) -> None:
    out = subprocess.run(
        ["bash", "-c", REPORTED],
        env=_clean_env(default_memory_tiers),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines() == ["None"], out.stdout + out.stderr


def _save(ckpt: Checkpointer, step: int, state: dict[str, object]) -> None:
    assert "memory" in ckpt.save(step, state).wait()


def test_two_runs_in_one_job_with_different_directories_keep_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = tmp_path / "shm" / "4242"  # both runs get the job's memory directory
    pretrain = Checkpointer(tmp_path / "pretrain", memory_dir=job, keep_persistent=1)
    _save(pretrain, 7, sample_state(7))
    pretrain.close()
    with caplog.at_level(logging.WARNING):
        finetune = Checkpointer(tmp_path / "finetune", memory_dir=job)
    try:
        assert finetune.load_latest() is None
        assert "ignoring the checkpoints of 1 other run(s)" in caplog.text
        _save(finetune, 1, sample_state(101))
        got = finetune.load_latest()
        assert got is not None and got[0] == 1 and finetune.last_restore is not None
        assert finetune.last_restore.tier == "memory"
        assert_same(got[1], sample_state(101))
    finally:
        finetune.close()
    again = Checkpointer(tmp_path / "pretrain", memory_dir=job)
    try:
        got = again.load_latest()
        assert got is not None and got[0] == 7 and again.last_restore is not None
        assert again.last_restore.tier == "memory", "each run still finds its own tier"
        assert_same(got[1], sample_state(7))
    finally:
        again.close()


def test_a_reused_job_id_with_a_fresh_directory_starts_fresh(tmp_path: Path) -> None:
    # Slurm's state was reset: job 17 runs again, with the same checkpoint path, which the
    # site emptied; the old job's memory tier is still on the node.
    persistent, job = tmp_path / "ckpt" / "17", tmp_path / "shm" / "17"
    old = Checkpointer(persistent, memory_dir=job)
    _save(old, 300, {"w": np.full(10, 300.0)})
    old.close()
    shutil.rmtree(persistent)
    new = Checkpointer(persistent, memory_dir=job)
    try:
        assert new.load_latest() is None
        assert new.memory_dir != old.memory_dir
    finally:
        new.close()


def test_the_memory_tier_and_every_rank_metadata_record_the_run(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m")
    try:
        _save(ckpt, 3, {"w": np.ones(4)})
        run = ident.load_or_create(tmp_path / "p")
        assert ckpt.memory_dir == tmp_path / "m" / run.dir_name
        assert layout.read_json(ckpt.memory_dir / ident.RUN_FILE)["run"] == run.run
        for root in (ckpt.memory_dir, ckpt.persistent_dir):
            meta = layout.read_json(layout.step_dir(root, 3) / layout.meta_name(0))
            assert meta["run"] == run.run and meta["save"]
        assert os.stat(tmp_path / "p" / ident.RUN_FILE).st_mode & 0o777 == 0o600
    finally:
        ckpt.close()


def test_concurrent_first_use_agrees_on_one_run(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; "
        "from hyperpod_agent.checkpoint import identity; "
        "print(identity.load_or_create(Path(sys.argv[1])).run)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[3],
        )
        for _ in range(6)
    ]
    runs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(runs) == 1 and all(len(r) == 32 for r in runs)


def test_a_memory_tier_of_another_run_is_refused_by_its_metadata(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = Checkpointer(tmp_path / "a", memory_dir=tmp_path / "m")
    b = Checkpointer(tmp_path / "b", memory_dir=tmp_path / "m")
    try:
        _save(a, 5, {"w": np.full(4, 1.0)})
        _save(b, 4, {"w": np.full(4, 2.0)})
        # Run a's step 5 copied into run b's memory tier (by hand, or by a bug).
        assert a.memory_dir is not None and b.memory_dir is not None
        shutil.copytree(layout.step_dir(a.memory_dir, 5), layout.step_dir(b.memory_dir, 5))
        with caplog.at_level(logging.WARNING):
            got = b.load_latest()
        assert got is not None and got[0] == 4
        assert_same(got[1], {"w": np.full(4, 2.0)})
        assert "belongs to another run" in caplog.text
    finally:
        a.close()
        b.close()


def test_peers_never_serve_another_runs_replicas(tmp_path: Path) -> None:
    peers = {"n1": ("127.0.0.1", free_port()), "n2": ("127.0.0.1", free_port())}

    def pair(persistent: str) -> list[Checkpointer]:
        return [
            Checkpointer(
                tmp_path / persistent,
                memory_dir=tmp_path / node / "99",
                rank=r,
                world_size=2,
                node=node,
                peers=peers,
                serve=True,
            )
            for r, node in enumerate(("n1", "n2"))
        ]

    first = pair("first")
    try:
        for c in first:
            c.save(1, {"w": np.full(3, float(c.rank))})
        for c in first:
            assert c.wait() is None
    finally:
        for c in first:
            c.close()
    second = pair("second")
    try:
        shutil.rmtree(tmp_path / "n1")  # n1 lost its memory: only peers could help
        assert second[0].load_latest() is None, "n2 holds only the first run's replicas"
    finally:
        for c in second:
            c.close()
