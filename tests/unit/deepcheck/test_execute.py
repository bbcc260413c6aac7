"""Running one tool: argv only, bounded output, a time limit that takes the whole
process group down, a missing binary named. Real processes (/bin/sh), no mocks."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hyperpod_agent.deepcheck.execute import group_members, run, start

ENV = {"PATH": "/usr/bin:/bin"}


def test_captures_stdout_stderr_and_exit_status() -> None:
    result = run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10, env=ENV)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and result.error is None
    assert result.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")


def test_arguments_never_go_through_a_shell() -> None:
    result = run(["echo", "$HOME; echo injected"], timeout_s=10, env=ENV)
    assert result.stdout == "$HOME; echo injected\n"


def test_environment_is_the_one_given() -> None:
    result = run(["sh", "-c", 'echo "$DEEPCHECK_X"'], timeout_s=10, env={**ENV, "DEEPCHECK_X": "7"})
    assert result.stdout == "7\n"


def test_missing_binary_is_an_error_naming_it(tmp_path: Path) -> None:
    result = run(["dcgmi", "diag", "-r", "1", "-j"], timeout_s=10, env={"PATH": str(tmp_path)})
    assert result.error == "dcgmi: not found on PATH"
    assert result.returncode is None and not result.timed_out


def test_missing_absolute_path_and_not_executable_file(tmp_path: Path) -> None:
    assert run([str(tmp_path / "nope")], timeout_s=10, env=ENV).error == (
        f"{tmp_path / 'nope'}: no such file"
    )
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\necho hi\n")
    assert run([str(plain)], timeout_s=10, env=ENV).error == f"{plain}: not executable"


def test_output_is_bounded_and_the_tool_is_not_blocked() -> None:
    # 1 MB of output against a 4 KiB limit: the rest is read and dropped, so the
    # writer finishes instead of blocking on a full pipe.
    argv = ["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2"]
    result = run(argv, timeout_s=30, env=ENV, output_limit=4096)
    assert result.returncode == 0 and not result.timed_out
    assert result.stdout == "x" * 4096
    assert result.truncated
    assert result.stderr == "done\n"


def test_time_limit_kills_the_whole_process_group(
    tmp_path: Path, gone: Callable[[int], bool]
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; echo started; wait"
    result = run(["sh", "-c", script], timeout_s=3, env=ENV, kill_grace_s=0.5)
    assert result.timed_out and result.returncode is None
    assert result.stdout == "started\n"
    for pid in map(int, pids.read_text().split()):
        assert gone(pid), pid


def test_a_tool_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, gone: Callable[[int], bool]
) -> None:
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 300 & echo $$ $! > {pids}; while :; do wait; done"
    result = run(["sh", "-c", script], timeout_s=3, env=ENV, kill_grace_s=0.3)
    assert result.timed_out
    for pid in map(int, pids.read_text().split()):
        assert gone(pid), pid


def test_leftover_children_die_when_the_tool_exits(
    tmp_path: Path, gone: Callable[[int], bool]
) -> None:
    # the background sleep keeps stdout open; the run still ends with the leader
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo done"
    result = run(["sh", "-c", script], timeout_s=30, env=ENV)
    assert (result.returncode, result.stdout, result.timed_out) == (0, "done\n", False)
    assert gone(int(pids.read_text()))


def test_wait_for_marker_then_finish(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f"echo listening; while [ ! -e {go} ]; do sleep 0.05; done; echo served"
    proc = start(["sh", "-c", script], env=ENV)
    assert proc.wait_for("listening", deadline=time.monotonic() + 10)
    go.touch()
    result = proc.finish(deadline=time.monotonic() + 10)
    assert result.returncode == 0
    assert result.stdout == "listening\nserved\n"


def test_wait_for_returns_false_when_the_tool_exits_first() -> None:
    proc = start(["sh", "-c", "echo nope; exit 4"], env=ENV)
    assert not proc.wait_for("listening", deadline=time.monotonic() + 10)
    assert proc.finish(deadline=time.monotonic() + 10).returncode == 4


@pytest.mark.parametrize("limit", [0, -1])
def test_nonsense_limits_are_refused(limit: int) -> None:
    with pytest.raises(ValueError):
        run(["true"], timeout_s=1, env=ENV, output_limit=limit)


def test_no_file_descriptor_leaks() -> None:
    # Sockets and files earlier tests left to the garbage collector would close in the
    # middle and change the count: collect them first, and keep the collector still.
    gc.collect()
    gc.disable()
    try:
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            run(["sh", "-c", "echo x"], timeout_s=10, env=ENV)
        after = len(os.listdir("/proc/self/fd"))
    finally:
        gc.enable()
    assert after == before


def test_group_members_reads_the_process_table(tmp_path: Path) -> None:
    def proc(pid: str, stat: str) -> None:
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)

    proc("100", "100 (sleep) S 1 42 42 0 -1 4194304 97 0 0 0")
    proc("101", "101 (odd) name) S 1 42 42 0 -1")  # ")" in the command name
    proc("102", "102 (zombie) Z 1 42 42 0 -1")
    proc("103", "103 (other) S 1 7 7 0 -1")
    (tmp_path / "self").mkdir()
    (tmp_path / "104").mkdir()  # exited between listing and reading
    assert sorted(group_members(42, proc_root=str(tmp_path))) == [100, 101]


def test_group_members_finds_a_real_group() -> None:
    proc = start(["sh", "-c", "sleep 30 & echo up; wait"], env=ENV)
    assert proc.wait_for("up", deadline=time.monotonic() + 10)
    assert len(group_members(proc.pid)) == 2  # sh and its sleep
    proc.finish(deadline=time.monotonic())
    assert group_members(proc.pid) == []
