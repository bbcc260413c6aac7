"""Only the process that made a record writes it: not a forked child, not a child
interpreter that inherited the rank's environment."""

from __future__ import annotations

import os
from pathlib import Path

from hyperpod_agent import progress

from .conftest import rank_env, read, run_python


def test_a_forked_child_does_not_write_into_the_parents_record(job: Path) -> None:
    progress.step(1)
    progress.pause("evaluation")
    pid = os.fork()
    if pid == 0:  # the child: anything but a clean exit 0 fails the test
        code = 1
        try:
            progress.step(99)
            progress.resume()
            progress.pause("child")
            progress.close()
            progress.step(100)
            code = 0 if progress.path() is None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rec = read(job)
    assert (rec.pid, rec.step, rec.paused, rec.pause_reason) == (
        os.getpid(),
        1,
        True,
        "evaluation",
    )
    assert sorted(os.listdir(job.parent)) == [job.name], "nor did it make a record of its own"
    progress.resume()
    progress.step(2)
    assert (read(job).step, read(job).paused) == (2, False), "the parent goes on"


def test_a_child_interpreter_leaves_its_parents_record_alone(job: Path, root: Path) -> None:
    progress.step(1)
    inode = os.stat(job).st_ino
    out = run_python(
        "from hyperpod_agent import progress\nprogress.step(99)\nprint(progress.path())",
        rank_env(root),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None"]
    (line,) = out.stderr.splitlines()
    assert f"pid {os.getpid()}" in line
    rec = read(job)
    assert (rec.pid, rec.step, os.stat(job).st_ino) == (os.getpid(), 1, inode)


def test_the_next_process_of_a_rank_takes_the_record_over(root: Path) -> None:
    code = "from hyperpod_agent import progress\nfor n in range(4):\n    progress.step(n)"
    first = run_python(code, rank_env(root))
    assert first.returncode == 0, first.stderr
    path = next(root.glob("*/*.prog"))
    assert read(path).step == 3
    again = run_python(code.replace("range(4)", "range(2)"), rank_env(root))
    assert again.returncode == 0, again.stderr
    rec = read(path)
    assert rec.step == 1 and rec.total == 1, "a fresh record, not the old one's ring"
