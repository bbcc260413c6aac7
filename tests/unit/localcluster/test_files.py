"""What ``local-cluster up`` writes afresh: nothing of a previous run's hyperpod state
survives into the next (the controller's database, its logs, the nodes' own roots)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import files
from hyperpod_agent.localcluster.shape import Shape


@pytest.fixture
def shape(tmp_path: Path) -> Iterator[Shape]:
    s = Shape(tmp_path / "c", nodes=2, spares=0, port_base=24017)
    yield s
    shutil.rmtree(s.memory_root, ignore_errors=True)
    shutil.rmtree(s.progress_root, ignore_errors=True)


def test_a_new_up_starts_without_the_last_runs_state(shape: Shape) -> None:
    left = [
        shape.dir / "var/lib/hyperpod/controller.db",  # the head's controller.toml names it
        shape.dir / "var/log/hyperpod/job_end.log",
        shape.dir / "nodes/node1/etc/hyperpod/agent.toml",
        shape.dir / "state/controller.db",
    ]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from the last run\n")
    files.write_files(shape)
    assert [p for p in left if p.exists()] == []
    assert shape.slurm_conf.is_file()
