"""The checkpoint library reports through the progress record: the time a save or a load
blocks the caller is a paused phase, and ``save(step)`` records the step."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent import progress
from hyperpod_agent.checkpoint import Checkpointer, CheckpointError
from hyperpod_agent.progress import format as fmt

from .conftest import read, read_consistent


class Probe(dict[str, Any]):
    """A state or template the library walks while it blocks the caller: each time it is
    walked, it reads the progress record (through the file, as the agent would)."""

    def __init__(self, path: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.path = path
        self.seen: list[fmt.Record] = []

    def items(self) -> Any:
        self.seen.append(read(self.path))
        return super().items()

    def __getitem__(self, key: str) -> Any:
        self.seen.append(read(self.path))
        return super().__getitem__(key)


@pytest.fixture
def ckpt(tmp_path: Path, job: Path) -> Iterator[Checkpointer]:
    c = Checkpointer(tmp_path / "persistent", memory_dir=tmp_path / "memory")
    yield c
    c.close()


def test_save_records_its_step_and_pauses_while_it_blocks(ckpt: Checkpointer, job: Path) -> None:
    progress.step(6)
    probe = Probe(job, w=np.arange(8.0))
    ckpt.save(7, probe)
    assert probe.seen, "the library walked the state"
    for rec in probe.seen:
        assert (rec.paused, rec.pause_reason, rec.step) == (True, "checkpoint save", 7)
    rec = read(job)
    assert (rec.paused, rec.step, rec.total) == (False, 7, 1)


def test_load_pauses_while_it_blocks(ckpt: Checkpointer, job: Path) -> None:
    ckpt.save(3, {"w": np.arange(8.0)}).wait()
    for load in (lambda t: ckpt.load_latest(template=t), lambda t: ckpt.load(3, template=t)):
        template = Probe(job, w=np.zeros(8))
        assert load(template) is not None
        assert template.seen, "the library walked the template"
        for rec in template.seen:
            assert (rec.paused, rec.pause_reason) == (True, "checkpoint load")
        assert not read(job).paused


def test_a_checkpointer_alone_feeds_the_durations_at_save_cadence(
    ckpt: Checkpointer, job: Path
) -> None:
    for step in (5, 10, 15):
        ckpt.save(step, {"w": np.full(4, float(step))})
    rec = read(job)
    assert (rec.step, rec.total, len(rec.durations)) == (15, 2, 2)


def test_saves_in_a_loop_that_records_steps_add_no_durations(ckpt: Checkpointer, job: Path) -> None:
    for step in range(1, 7):
        progress.step(step)
        if step % 3 == 0:
            ckpt.save(step, {"w": np.full(4, float(step))})
    rec = read(job)
    assert (rec.step, rec.total) == (6, 5), "one duration per step, none for the saves"


def test_a_refused_save_records_nothing(ckpt: Checkpointer, job: Path) -> None:
    progress.step(2)
    with pytest.raises(CheckpointError, match="step must be"):
        ckpt.save(-1, {"w": np.zeros(2)})
    rec = read(job)
    assert (rec.step, rec.paused) == (2, False)


@pytest.fixture
def stalled_peer(tmp_path: Path, job: Path) -> Iterator[tuple[Checkpointer, socket.socket]]:
    """A Checkpointer whose replica peer accepts a connection and never answers, so the
    background write of a save hangs until the test closes that connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(30)
    port = listener.getsockname()[1]
    c = Checkpointer(
        tmp_path / "persistent",
        memory_dir=tmp_path / "memory",
        node="a",
        peers={"a": ("127.0.0.1", 1), "b": ("127.0.0.1", port)},
        peer_timeout=60,
    )
    try:
        yield c, listener
    finally:
        listener.close()
        c.close()


def wait_paused(job: Path, reason: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec = read_consistent(job)
        if rec.paused:
            assert rec.pause_reason == reason
            return
        time.sleep(0.01)
    raise AssertionError(f"{job}: never paused")


@pytest.mark.parametrize("call", ["handle", "wait", "close"])
def test_waiting_for_a_save_is_paused_too(
    stalled_peer: tuple[Checkpointer, socket.socket], job: Path, call: str
) -> None:
    ckpt, listener = stalled_peer
    handle = ckpt.save(1, {"w": np.arange(4.0)})
    assert not read(job).paused, "staging is over: the caller is training again"
    block = {"handle": handle.wait, "wait": ckpt.wait, "close": ckpt.close}[call]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            block()
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    conn, _ = listener.accept()  # the save's write is now waiting for the peer's hello
    wait_paused(job, "checkpoint save")
    conn.close()  # the peer goes away: the write fails, the caller is let go
    t.join(timeout=60)
    assert not t.is_alive()
    assert not read(job).paused
    if call != "close":
        assert len(errors) == 1 and "peer" in str(errors[0])
