"""Ranks agree on the restore step; a given step can be loaded explicitly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hyperpod_agent.checkpoint import Checkpointer, CheckpointError, layout

from .conftest import assert_same, free_port, sample_state


def test_load_a_given_step(make_ckpt: Callable[..., Checkpointer]) -> None:
    ckpt = make_ckpt()
    ckpt.save(1, sample_state(1)).wait()
    ckpt.save(2, sample_state(2)).wait()
    assert_same(sample_state(1), ckpt.load(1))
    with pytest.raises(CheckpointError, match=r"step 99 rank 0: cannot be restored: no tier"):
        ckpt.load(99)


RANK = """
import sys
import torch.distributed as dist
from hyperpod_agent.checkpoint import Checkpointer, layout
from tests.unit.checkpoint.conftest import sample_state

rank, port, base = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
ckpt = Checkpointer(base + "/p", memory_dir=f"{base}/m{rank}", rank=rank, world_size=2)
for step in (1, 2):
    ckpt.save(step, sample_state(step)).wait()
dist.barrier()
if rank == 1:  # rank 1's step 2 is damaged in every tier it has
    for root in (ckpt.memory_dir, ckpt.persistent_dir):
        (layout.step_dir(root, 2) / layout.data_name(1)).write_bytes(b"torn")
dist.barrier()
step, _ = ckpt.load_latest()
print(f"rank {rank} step {step}", flush=True)
ckpt.close()
dist.destroy_process_group()
"""


def test_ranks_agree_on_the_oldest_restorable_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    port = str(free_port())
    root = Path(__file__).parents[3]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), port, str(tmp_path)],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        assert p.returncode == 0, err[-2000:]
        outs.append(out.strip())
    assert outs == ["rank 0 step 1", "rank 1 step 1"]
    assert layout.scan(tmp_path / "p")[2].committed  # rank 0 alone would have taken step 2
