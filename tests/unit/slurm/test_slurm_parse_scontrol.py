"""scontrol show node|job -o: key=value records whose values contain spaces and '='."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from hyperpod_agent.errors import SlurmParseError
from hyperpod_agent.slurm.parse import parse_kv_line, parse_scontrol_jobs, parse_scontrol_nodes

Capture = Callable[[str], str]

NODE_LINE = (
    "NodeName=gpu7 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=2 "
    "NodeAddr=10.0.0.7 NodeHostName=gpu7 Port=6818 Version=22.05.8 "
    "OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  "
    "RealMemory=1000 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu,all  "
    "BootTime=2026-11-22T06:35:58 SlurmdStartTime=None LastBusyTime=2026-11-22T06:39:34 "
    "Reason=hyperpod:replace gpu3 xid79 msg=GPU has fallen off; State=DOWN a=b "
    "[slurm@2026-11-22T06:39:46]"
)


def test_values_with_spaces_and_equals(utc: None) -> None:
    kv = parse_kv_line(NODE_LINE)
    assert kv["OS"] == "Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"
    assert kv["CoresPerSocket"] == "1" and kv["RealMemory"] == "1000"
    assert kv["State"] == "IDLE+DRAIN"
    assert kv["Reason"] == (
        "hyperpod:replace gpu3 xid79 msg=GPU has fallen off; State=DOWN a=b "
        "[slurm@2026-11-22T06:39:46]"
    )


def test_node_record_fields(utc: None) -> None:
    (node,) = parse_scontrol_nodes(NODE_LINE)
    assert (node.name, node.state, node.flags) == ("gpu7", "IDLE", frozenset({"DRAIN"}))
    assert node.reason == "hyperpod:replace gpu3 xid79 msg=GPU has fallen off; State=DOWN a=b"
    assert node.reason_user == "slurm"
    assert node.reason_time == datetime(2026, 11, 22, 6, 39, 46, tzinfo=UTC)
    assert node.partitions == ("gpu", "all")
    assert (node.address, node.port) == ("10.0.0.7", 6818)
    assert node.slurmd_start_time is None


def test_free_text_job_fields_keep_spaces_and_equals() -> None:
    line = (
        "JobId=12 JobName=my job x=1 UserId=alice(1000) GroupId=alice(1000) JobState=RUNNING "
        "Reason=None Requeue=1 Restarts=2 ExitCode=0:0 StartTime=2026-11-22T06:39:34 "
        "Partition=gpu NodeList=gpu[1-2] BatchHost=gpu1 "
        "AdminComment=auto_resume=4 owner=ml team  Comment=hello  StdOut=/tmp/out file.txt"
    )
    kv = parse_kv_line(line)
    assert kv["JobName"] == "my job x=1"
    assert kv["AdminComment"] == "auto_resume=4 owner=ml team"
    assert kv["StdOut"] == "/tmp/out file.txt"
    (job,) = parse_scontrol_jobs(line)
    assert (job.job_id, job.name, job.user, job.state) == (12, "my job x=1", "alice", "RUNNING")
    assert job.nodes == ("gpu1", "gpu2") and job.restart_count == 2 and job.auto_resume == 4


def test_unknown_key_after_a_plain_value_starts_a_new_field() -> None:
    kv = parse_kv_line("NodeName=n1 NewKey23=v v2 State=IDLE")
    assert kv == {"NodeName": "n1", "NewKey23": "v v2", "State": "IDLE"}


def test_keys_with_colons_and_slashes() -> None:
    kv = parse_kv_line("JobId=1 AllocNode:Sid=host:42 CPUs/Task=1 ReqB:S:C:T=0:0:*:*")
    assert kv["AllocNode:Sid"] == "host:42"
    assert kv["CPUs/Task"] == "1"
    assert kv["ReqB:S:C:T"] == "0:0:*:*"


def test_reason_without_user_suffix() -> None:
    (node,) = parse_scontrol_nodes("NodeName=n1 State=DOWN Reason=Not responding")
    assert (node.reason, node.reason_user, node.reason_time) == ("Not responding", "", None)


def test_empty_values_and_missing_keys() -> None:
    (node,) = parse_scontrol_nodes("NodeName=n1 Partitions= State=IDLE Port= NodeAddr=")
    assert node.partitions == () and node.port is None and node.address == ""
    (job,) = parse_scontrol_jobs("JobId=5 JobState=PENDING NodeList=(null) BatchHost=(null)")
    assert job.nodes == () and job.batch_host == "" and job.exit_code is None


def test_finished_job_exit_code_and_signal() -> None:
    (job,) = parse_scontrol_jobs("JobId=5 JobState=CANCELLED ExitCode=0:15 EndTime=Unknown")
    assert job.exit_code == 0 and job.extra["exit_signal"] == "15" and job.end_time is None


@pytest.mark.parametrize("text", ["", "\n", "No nodes in the system\n"])
def test_no_records(text: str) -> None:
    assert parse_scontrol_nodes(text) == []


def test_captured_node_lines(capture: Capture, utc: None) -> None:
    nodes = {n.name: n for n in parse_scontrol_nodes(capture("scontrol_nodes_b.txt"))}
    assert nodes["node1"].flags == {"DRAIN", "REBOOT_REQUESTED"}
    assert nodes["node3"].reason.endswith("; key=value a=b")
    assert nodes["node3"].reason_user == "root"


def test_captured_job_lines(capture: Capture, utc: None) -> None:
    jobs = {j.job_id: j for j in parse_scontrol_jobs(capture("scontrol_jobs_b.txt"))}
    assert jobs[8].name == "pending exclusive" and jobs[8].auto_resume == 1
    assert jobs[4].state_reason == "BeginTime" and jobs[4].restart_count == 3


@pytest.mark.parametrize(
    ("parser", "text", "why"),
    [
        (parse_scontrol_nodes, "garbage here", "expected a line starting NodeName="),
        (parse_scontrol_nodes, "JobId=1 JobState=RUNNING", "expected a line starting NodeName="),
        (parse_scontrol_jobs, "NodeName=n1 State=IDLE", "expected a line starting JobId="),
        (parse_scontrol_jobs, "JobId=x JobState=RUNNING", "record without JobId/JobState"),
        (parse_scontrol_jobs, "JobId=3 NodeList=n[1-", "record without JobId/JobState"),
        (parse_scontrol_jobs, "JobId=3 JobState=RUNNING NodeList=n[1-", "bad node list"),
    ],
)
def test_unexpected_records(parser: Callable[[str], object], text: str, why: str) -> None:
    with pytest.raises(SlurmParseError, match=why):
        parser(text)


def test_line_without_pairs() -> None:
    with pytest.raises(SlurmParseError, match="no key=value pairs"):
        parse_kv_line("just words")


def test_captured_job_owner_and_required_nodes(capture: Capture, utc: None) -> None:
    jobs = {j.job_id: j for j in parse_scontrol_jobs(capture("scontrol_jobs_b.txt"))}
    assert (jobs[3].user, jobs[3].uid) == ("root", 0)
    assert jobs[3].extra["required_nodes"] == "node[1-2]"
    assert "required_nodes" not in jobs[1].extra


def test_an_owner_without_a_uid_has_none() -> None:
    (job,) = parse_scontrol_jobs("JobId=3 JobState=RUNNING UserId=alice")
    assert (job.user, job.uid) == ("alice", None)
