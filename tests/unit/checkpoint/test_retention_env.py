"""Per-tier frequency and retention, and settings from the environment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import CheckpointConfigError, Checkpointer, layout
from hyperpod_agent.checkpoint.env import parse_peers, settings_from_env


def test_persistent_every_m_and_keep_k_per_tier(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt(persistent_every=3, keep_memory=2, keep_persistent=2)
    for step in range(10, 17):
        ckpt.save(step, {"x": np.full(10, step)}).wait()
    assert ckpt.memory_dir is not None
    assert sorted(layout.scan(ckpt.memory_dir)) == [15, 16]
    assert sorted(layout.scan(tiers["persistent"])) == [13, 16]
    got = ckpt.load_latest()
    assert got is not None and got[0] == 16


def test_prune_never_touches_steps_newer_than_the_kept_ones(tmp_path: Path) -> None:
    for s in (1, 2, 3, 4):
        layout.write_json(
            layout.step_dir(tmp_path, s) / layout.meta_name(0), {"format": 1, "world_size": 2}
        )
    for s in (1, 2, 3):
        layout.write_json(
            layout.step_dir(tmp_path, s) / layout.meta_name(1), {"format": 1, "world_size": 2}
        )
    assert layout.prune(tmp_path, keep=1, world_size=2) == [1, 2]
    assert sorted(layout.scan(tmp_path)) == [3, 4]


ENV = {
    "HYPERPOD_CHECKPOINT_DIR": "/ckpt/job7",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURMD_NODENAME": "node2",
    "SLURM_JOB_ID": "77",
}


def test_slurm_environment() -> None:
    kw = settings_from_env(ENV)
    assert (kw["rank"], kw["world_size"], kw["local_rank"], kw["node"]) == (3, 4, 1, "node2")
    assert kw["memory_dir"] is None and kw["job_id"] == "77"  # /dev/shm/hyperpod-ckpt/77
    assert kw["serve"] is False and kw["peers"] == {}
    assert kw["secret"] is None and kw["peer_streams"] == 4
    kw = settings_from_env(
        dict(ENV, HYPERPOD_CHECKPOINT_SECRET="s" * 32, HYPERPOD_CHECKPOINT_PEER_STREAMS="2")
    )
    assert kw["secret"] == "s" * 32 and kw["peer_streams"] == 2
    assert settings_from_env(dict(ENV, HYPERPOD_CHECKPOINT_TOKEN="t" * 32))["secret"] == "t" * 32


def test_every_task_of_one_launch_tags_its_saves_alike() -> None:
    a = settings_from_env(ENV)["attempt"]
    assert a == settings_from_env(dict(ENV, SLURM_PROCID="0", SLURMD_NODENAME="node1"))["attempt"]
    assert a != settings_from_env(dict(ENV, SLURM_RESTART_COUNT="1"))["attempt"]
    assert a != settings_from_env(dict(ENV, SLURM_STEP_ID="2"))["attempt"]


def test_torchrun_variables_win_and_overrides_apply() -> None:
    env = dict(
        ENV,
        RANK="0",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        HYPERPOD_CHECKPOINT_MEMORY_DIR="/dev/shm/x",
        HYPERPOD_CHECKPOINT_SERVE="1",
        HYPERPOD_CHECKPOINT_PEERS="node1=10.0.0.1:7000, node2=[::1]:7001",
        HYPERPOD_CHECKPOINT_PERSISTENT_EVERY="5",
        HYPERPOD_CHECKPOINT_REPLICATED="model,",
    )
    kw = settings_from_env(env)
    assert (kw["rank"], kw["world_size"], kw["serve"]) == (0, 2, True)
    assert kw["memory_dir"] == "/dev/shm/x" and kw["persistent_every"] == 5
    assert kw["peers"] == {"node1": ("10.0.0.1", 7000), "node2": ("::1", 7001)}
    assert kw["replicated"] == ["model"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, r"HYPERPOD_CHECKPOINT_DIR is not set"),
        (dict(ENV, SLURM_NTASKS="many"), r"SLURM_NTASKS='many': expected an integer"),
        (dict(ENV, SLURM_PROCID="9"), r"rank 9 is outside world size 4"),
        (dict(ENV, HYPERPOD_CHECKPOINT_KEEP_MEMORY="0"), r"KEEP_MEMORY='0': must be at least 1"),
        (dict(ENV, HYPERPOD_CHECKPOINT_SERVE="yes"), r"SERVE='yes': expected 0 or 1"),
        (dict(ENV, HYPERPOD_CHECKPOINT_PEER_STREAMS="0"), r"PEER_STREAMS='0': must be at least 1"),
    ],
)
def test_bad_environment_is_one_precise_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(CheckpointConfigError, match=message):
        settings_from_env(env)


@pytest.mark.parametrize(
    "text", ["node1", "node1=host", "node1=host:x", "=h:1", "a=h:70000", "a=h:1,a=h:2"]
)
def test_bad_peer_lists_are_refused(text: str) -> None:
    with pytest.raises(CheckpointConfigError, match="HYPERPOD_CHECKPOINT_PEERS"):
        parse_peers(text)


def test_from_env_builds_a_working_checkpointer(tmp_path: Path) -> None:
    env = {
        "HYPERPOD_CHECKPOINT_DIR": str(tmp_path / "p"),
        "HYPERPOD_CHECKPOINT_MEMORY_DIR": str(tmp_path / "m"),
    }
    ckpt = Checkpointer.from_env(env, keep_memory=1)
    try:
        ckpt.save(1, {"a": 1}).wait()
        assert ckpt.load_latest() == (1, {"a": 1})
        assert ckpt.keep_memory == 1
    finally:
        ckpt.close()


def test_node_missing_from_peer_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointConfigError, match=r"node 'node9' is not in the peer list"):
        Checkpointer(
            tmp_path / "p",
            memory_dir=tmp_path / "m",
            node="node9",
            peers={"node1": ("127.0.0.1", 1)},
        )


def test_a_resume_is_recorded_for_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import numpy as np

    from hyperpod_agent.checkpoint import Checkpointer

    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    ck = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m")
    ck.save(5, {"w": np.arange(4)}).wait()
    assert not (tmp_path / "p" / "resume.json").exists()  # nothing resumed yet
    restored = ck.load_latest()
    ck.close()
    assert restored is not None and restored[0] == 5
    doc = json.loads((tmp_path / "p" / "resume.json").read_text())
    assert doc["step"] == 5 and doc["restart_count"] == 2 and doc["job_id"] == 41
