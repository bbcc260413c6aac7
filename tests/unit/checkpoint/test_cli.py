"""``hyperpod checkpoint`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.checkpoint.cli import checkpoint


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m", keep_persistent=10)
    try:
        for step in (1, 2, 3):
            ckpt.save(step, {"w": np.ones((2, 3), np.float32), "n": step}).wait()
    finally:
        ckpt.close()
    return tmp_path / "p"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(checkpoint, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_ls_human_and_json(root: Path) -> None:
    code, out, _ = run("ls", str(root))
    assert code == 0 and out.splitlines()[0].split()[:3] == ["STEP", "RANKS", "COMMITTED"]
    assert len(out.splitlines()) == 4
    code, out, _ = run("ls", str(root), "--json")
    steps = json.loads(out)
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["complete"] for s in steps)


def test_show(root: Path) -> None:
    code, out, _ = run("show", str(root), "2")
    assert code == 0 and "w  np <f4 (2, 3)" in out
    code, out, _ = run("show", str(root), "2", "--json")
    assert json.loads(out)["ranks"][0]["leaves"][0]["shape"] == [2, 3]


def test_verify_ok_then_corrupt(root: Path) -> None:
    assert run("verify", str(root))[0] == 0
    shard = layout.step_dir(root, 3) / layout.data_name(0)
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    code, out, _ = run("verify", str(root), "3")
    assert code == 1 and "CORRUPT" in out and f"{shard}: checksum mismatch in leaf 'w'" in out
    code, out, _ = run("verify", str(root), "--json")
    assert code == 1 and [v["ok"] for v in json.loads(out)] == [True, True, False]


def test_prune(root: Path) -> None:
    code, out, _ = run("prune", str(root), "--keep", "1", "--json")
    assert code == 0 and json.loads(out) == {"removed": [1, 2]}
    assert sorted(layout.scan(root)) == [3]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ls", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such directory"),
        (["show", "{root}", "99"], "no step 99"),
        (["verify", "{root}", "42"], "no step 42"),
    ],
)
def test_errors_are_one_line_and_non_zero(root: Path, args: list[str], message: str) -> None:
    code, out, err = run(*[a.format(root=root) for a in args])
    assert code != 0 and out == ""
    assert err.startswith("hyperpod checkpoint: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_prune_needs_keep(root: Path) -> None:
    code, _, err = run("prune", str(root))
    assert code == 2 and "--keep" in err


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run("serve", "--dir", str(tmp_path / "m"), "--port", str(port))
    assert code == 6 and err.startswith("hyperpod checkpoint: error: replica server: couldn't")


@pytest.mark.parametrize(
    ("content", "option", "message", "exit_code"),
    [
        (None, "--secret-file", "cannot read", 6),
        ("\n", "--secret-file", "empty secret file", 6),
        ("s3cret\n", "--secret-file", "6 bytes is too short; use at least 16", 3),
        ("s3cret\n", "--token-file", "6 bytes is too short", 3),  # the option's earlier name
    ],
)
def test_serve_with_a_bad_secret_file_is_one_line(
    tmp_path: Path, content: str | None, option: str, message: str, exit_code: int
) -> None:
    secret = tmp_path / "secret"
    if content is not None:
        secret.write_text(content)
    code, _, err = run("serve", "--dir", str(tmp_path / "m"), "--port", "1", option, str(secret))
    assert code == exit_code and err.startswith("hyperpod checkpoint: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_serve_beyond_loopback_needs_a_secret(tmp_path: Path) -> None:
    code, _, err = run("serve", "--dir", str(tmp_path / "m"), "--host", "0.0.0.0", "--port", "1")
    assert code == 6 and "refusing to listen on 0.0.0.0 without a secret" in err


def test_show_names_the_writer_of_deduplicated_leaves(tmp_path: Path) -> None:
    ranks = [
        Checkpointer(
            tmp_path / "p",
            memory_dir=tmp_path / f"m{r}",
            rank=r,
            world_size=2,
            replicated={"model"},
        )
        for r in (0, 1)
    ]
    try:
        handles = [c.save(1, {"model": {"a": np.ones(100), "b": np.ones(10)}}) for c in ranks]
        for h in handles:
            h.wait(timeout=60)
    finally:
        for c in ranks:
            c.close()
    code, out, _ = run("show", str(tmp_path / "p"), "1")
    assert code == 0 and "model/b  np <f8 (10,)  80 B  (written by rank 1)" in out
    assert run("verify", str(tmp_path / "p"), "1")[0] == 0


def test_verify_reports_an_incomplete_step(tmp_path: Path) -> None:
    layout.write_json(
        layout.step_dir(tmp_path, 4) / layout.meta_name(0),
        {
            "format": 1,
            "step": 4,
            "rank": 0,
            "world_size": 2,
            "entries": [],
            "data_size": 0,
            "skeleton": {"t": "val", "v": None},
        },
    )
    (layout.step_dir(tmp_path, 4) / layout.data_name(0)).write_bytes(b"")
    code, out, _ = run("verify", str(tmp_path), "4")
    assert code == 1 and "step 4: incomplete" in out and "no shard for ranks [1]" in out


def test_malformed_metadata_is_a_problem_or_one_line_never_a_traceback(root: Path) -> None:
    meta = layout.step_dir(root, 2) / layout.meta_name(0)
    doc = json.loads(meta.read_text())
    doc["entries"] = [{"path": "w"}]  # no kind, dtype, shape...
    meta.write_text(json.dumps(doc))
    code, out, _ = run("verify", str(root), "2")
    assert code == 1 and "CORRUPT" in out and "leaf 'w': unknown kind None" in out
    code, out, err = run("show", str(root), "2")
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("hyperpod checkpoint: error: ") and "bad metadata" in err
