"""The pure parts of reading progress records: /proc text, Slurm's traces in it (cgroup
paths, slurmstepd titles) and step-time summaries."""

from __future__ import annotations

import pytest

from hyperpod_agent.agent.progress_files import (
    job_id_of,
    parse_proc_stat,
    parse_proc_uids,
    parse_slurm_cgroup,
    parse_stat,
    parse_stepd_title,
    rank_of,
    summarise,
)


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("1234 (python) S 1 1234 1234 0 -1 4194560 0 0", "S"),
        ("1234 (my (odd) name) R 1 2 3", "R"),
        ("1234 (a b) c) ) D 1 2 3", "D"),  # comm may hold spaces and ')'
        ("1234 (x) T 1", "T"),
        ("1234 (x) t 1", "t"),
        ("1234 (x) Z 1", "Z"),
        ("1234 (x)", ""),  # cut short
        ("garbage", ""),
        ("", ""),
    ],
)
def test_parse_proc_stat(text: str, state: str) -> None:
    assert parse_proc_stat(text) == state


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1234 (python) S 1 1234 1234 0 -1 4194560 0 0", ("python", "S", 1)),
        ("16655 (slurmstepd) S 1 16653 16653 0 -1", ("slurmstepd", "S", 1)),
        ("99 (a) b (c)) R 42 1", ("a) b (c)", "R", 42)),  # comm holds ')' and '('
        ("1 (systemd) S 0 1 1", ("systemd", "S", 0)),
        ("1234 (x) T", None),  # no parent
        ("1234 (x) T -1", None),
        ("1234 (x) TT 1", None),
        ("1234 x) S 1", None),
        ("", None),
    ],
)
def test_parse_stat(text: str, parsed: tuple[str, str, int] | None) -> None:
    assert parse_stat(text) == parsed


@pytest.mark.parametrize(
    ("cmdline", "job"),
    [
        ("slurmstepd: [7.batch]\0\0\0\0", 7),  # as read from /proc on the local cluster
        ("slurmstepd: [7.0]\0\0\0\0", 7),
        ("slurmstepd: [123456.extern]", 123456),
        ("slurmstepd: [12+1.0]", 12),  # a heterogeneous job's component
        ("slurmstepd: [4294967295.0]", 4294967295),
        ("slurmstepd: [0.0]", None),
        ("slurmstepd: [4294967296.0]", None),
        ("slurmstepd: [７.0]", None),
        ("slurmstepd:  [7.0]", None),
        ("/usr/sbin/slurmstepd", None),  # before it names itself
        ("xslurmstepd: [7.0]", None),
        ("", None),
    ],
)
def test_parse_stepd_title(cmdline: str, job: int | None) -> None:
    assert parse_stepd_title(cmdline) == job


@pytest.mark.parametrize(
    ("text", "jobs", "users"),
    [
        # cgroup v2, Slurm 22.05+ (slurmd under systemd)
        ("0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n", {123}, set()),
        ("0::/system.slice/slurmstepd.scope/job_123\n", {123}, set()),
        ("0::/system.slice/n1_slurmstepd.scope/job_9/step_extern/slurm\n", {9}, set()),
        # cgroup v1: every controller Slurm uses names the job
        (
            "12:pids:/slurm/uid_1000/job_5/step_0/task_1\n"
            "4:freezer:/slurm/uid_1000/job_5/step_0\n"
            "1:name=systemd:/system.slice/slurmd.service\n",
            {5},
            {1000},
        ),
        ("4:freezer:/slurm_n1/uid_0/job_5\n", {5}, {0}),
        # not Slurm's, or not anchored at the root of the hierarchy
        ("0::/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_5\n", set(), set()),
        ("0::/system.slice/slurmstepd.scope/job_5a\n", set(), set()),
        ("4:freezer:/slurm/uid_x/job_5\n", set(), set()),
        ("4:memory:/process_api/474a9d96e4c95e7341134308e2afb01b\n0::/\n", set(), set()),
        ("garbage", set(), set()),
        ("", set(), set()),
    ],
)
def test_parse_slurm_cgroup(text: str, jobs: set[int], users: set[int]) -> None:
    assert parse_slurm_cgroup(text) == (frozenset(jobs), frozenset(users))


def test_summary_of_known_durations() -> None:
    window, median, p95, last = summarise(tuple(float(d) for d in range(1, 101)))
    assert (window, median, p95, last) == (100, 50.5, 95.0, 100.0)
    assert summarise((2.0, 1.0, 3.0)) == (3, 2.0, 3.0, 3.0)
    assert summarise(()) == (0, None, None, None)


def test_summary_leaves_out_durations_no_clock_gives() -> None:
    window, median, _, last = summarise((1.0, float("nan"), -2.0, float("inf"), 3.0))
    assert (window, median, last) == (2, 2.0, 3.0)
    assert summarise((1.0, float("nan")))[3] is None  # the newest one is not usable
    nan = float("nan")
    assert summarise((5.0, nan, 1.0, nan, 3.0, 4.0, nan, 2.0)) == (5, 3.0, 5.0, 2.0)


@pytest.mark.parametrize(
    ("text", "uids"),
    [
        ("Name:\tpython\nUid:\t1000\t1001\t1000\t1000\nGid:\t5\t5\t5\t5\n", (1000, 1001)),
        ("Name:\tx\n", ()),
        ("Uid:\tabc\t1\n", ()),
    ],
)
def test_parse_proc_uids(text: str, uids: tuple[int, ...]) -> None:
    assert parse_proc_uids(text) == uids


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("42", 42),
        ("0", None),
        ("4294967295", 4294967295),
        ("4294967296", None),
        ("５０", None),
        ("4a", None),
        (" 4", None),
        ("", None),
        ("12345678901", None),
    ],
)
def test_job_names(name: str, job: int | None) -> None:
    assert job_id_of(name) == job


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("0.prog", 0),
        ("255.prog", 255),
        ("０.prog", None),
        ("1.prog.tmp", None),
        (".prog", None),
        ("-1.prog", None),
        ("1.PROG", None),
    ],
)
def test_rank_names(name: str, rank: int | None) -> None:
    assert rank_of(name) == rank
