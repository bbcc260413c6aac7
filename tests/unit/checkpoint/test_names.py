"""Names are parsed whole and in ASCII: no trailing newline, no Unicode digits."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperpod_agent.checkpoint import CheckpointConfigError, Checkpointer, layout
from hyperpod_agent.checkpoint.env import parse_peers

ODD_DIGITS = ("\u0661", "\u00b2", "\uff11")  # Arabic-Indic one, superscript two, fullwidth one


@pytest.mark.parametrize(
    "name",
    [
        "rank-00001.bin\n",
        "rank-00001.json\n",
        *(f"rank-0000{d}.bin" for d in ODD_DIGITS),
        "rank-00001.bin.json",
        "xrank-00001.bin",
    ],
)
def test_only_exact_shard_names_are_valid(name: str) -> None:
    assert not layout.valid_shard_name(name)


def test_valid_shard_names() -> None:
    assert layout.valid_shard_name("rank-00001.bin") and layout.valid_shard_name("rank-99999.json")


def test_scan_ignores_step_and_shard_names_that_are_almost_right(tmp_path: Path) -> None:
    good = layout.step_dir(tmp_path, 7)
    good.mkdir()
    (good / "rank-00000.json").write_text("{}")
    (good / "rank-00001.json\n").write_text("{}")
    (good / "rank-0000\u00b2.json").write_text("{}")
    for odd in ("step-0000000008\n", "step-000000000\u0661", "step-000000000\u00b2"):
        (tmp_path / odd).mkdir()
        (tmp_path / odd / "rank-00000.json").write_text("{}")
    assert {s: i.ranks for s, i in layout.scan(tmp_path).items()} == {7: {0}}


@pytest.mark.parametrize("port", ["\u00b2", "\u0661\u0662", "7\u0660"])
def test_a_peer_port_in_odd_digits_is_a_config_error(port: str) -> None:
    with pytest.raises(CheckpointConfigError, match="expected node=host:port"):
        parse_peers(f"node1=10.0.0.1:{port}")


def test_odd_digits_in_slurm_variables_never_break_a_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_RESTART_COUNT", "\u00b2")
    monkeypatch.setenv("SLURM_JOB_ID", "\u00b2")
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m")
    try:
        ckpt.save(1, {"a": 1}).wait()
        assert ckpt.load_latest() == (1, {"a": 1})
    finally:
        ckpt.close()
