"""SlurmClient without a cluster: stand-in `scontrol`/`sinfo`/`squeue`/`scancel` executables on
PATH record the exact argv and answer with canned output, so argv building, error mapping,
timeouts and validation are tested through real subprocesses."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.errors import SlurmError, SlurmParseError, SlurmTimeout
from hyperpod_agent.slurm.client import REASON_MAX_LEN, SlurmClient, format_reason

TOOLS = ("scontrol", "sinfo", "squeue", "scancel")
FAKE = f"""#!{sys.executable}
import json, os, sys, time
d = os.environ["FAKE_DIR"]
tool = os.path.basename(sys.argv[0])
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"argv": [tool] + sys.argv[1:], "conf": os.environ.get("SLURM_CONF"),
                        "fmt": os.environ.get("SLURM_TIME_FORMAT")}}) + "\\n")
def read(ext, default=""):
    p = os.path.join(d, tool + ext)
    return open(p).read() if os.path.exists(p) else default
time.sleep(float(read(".sleep", "0")))
sys.stdout.write(read(".out"))
sys.stderr.write(read(".err"))
sys.exit(int(read(".rc", "0")))
"""


class Fake:
    """The stand-in tools' directory: set answers, read calls."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            path = self.bin / tool
            path.write_text(FAKE)
            path.chmod(0o755)
        self.conf = root / "slurm.conf"
        self.conf.write_text("ClusterName=fake\n")

    def answer(
        self, tool: str, out: str = "", err: str = "", rc: int = 0, sleep: float = 0
    ) -> None:
        (self.dir / f"{tool}.out").write_text(out)
        (self.dir / f"{tool}.err").write_text(err)
        (self.dir / f"{tool}.rc").write_text(str(rc))
        (self.dir / f"{tool}.sleep").write_text(str(sleep))

    def calls(self) -> list[dict[str, Any]]:
        path = self.dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def argvs(self) -> list[list[str]]:
        return [c["argv"] for c in self.calls()]

    def client(self, timeout: float = 5.0) -> SlurmClient:
        env = {"PATH": str(self.bin), "FAKE_DIR": str(self.dir), "SLURM_TIME_FORMAT": "relative"}
        return SlurmClient(slurm_conf=self.conf, timeout=timeout, env=env)


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    return Fake(tmp_path)


# --- argv building -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "argv"),
    [
        (
            lambda c: c.drain("node3", "hyperpod:replace gpu3 xid79 a=b; c"),
            [
                "scontrol",
                "update",
                "nodename=node3",
                "state=drain",
                "reason=hyperpod:replace gpu3 xid79 a=b; c",
            ],
        ),
        (lambda c: c.resume("node3"), ["scontrol", "update", "nodename=node3", "state=resume"]),
        (
            lambda c: c.down("node3", "x y"),
            ["scontrol", "update", "nodename=node3", "state=down", "reason=x y"],
        ),
        (
            lambda c: c.fail("node3", "Action:Replace"),
            ["scontrol", "update", "nodename=node3", "state=fail", "reason=Action:Replace"],
        ),
        (
            lambda c: c.reboot("node1", "hyperpod:reboot xid79"),
            [
                "scontrol",
                "reboot",
                "ASAP",
                "nextstate=resume",
                "reason=hyperpod:reboot xid79",
                "node1",
            ],
        ),
        (
            lambda c: c.reboot("node1", "r", asap=False, next_state="down"),
            ["scontrol", "reboot", "nextstate=down", "reason=r", "node1"],
        ),
        (
            lambda c: c.reboot("node1", "r", asap=False, next_state=""),
            ["scontrol", "reboot", "reason=r", "node1"],
        ),
        (
            lambda c: c.create_maint_reservation(
                "hyperpod-check-1-9", ["node4", "node5"], 12, ["root"]
            ),
            [
                "scontrol",
                "create",
                "reservation",
                "ReservationName=hyperpod-check-1-9",
                "Nodes=node[4-5]",
                "StartTime=now",
                "Duration=12",
                "Users=root",
                "Flags=MAINT",
            ],
        ),
        (
            lambda c: c.delete_reservation("hyperpod-check-1-9"),
            ["scontrol", "delete", "ReservationName=hyperpod-check-1-9"],
        ),
        (
            lambda c: c.set_address("node5", "10.0.0.9"),
            ["scontrol", "update", "nodename=node5", "nodeaddr=10.0.0.9"],
        ),
        (
            lambda c: c.set_address("node5", "10.0.0.9", hostname="gpu-99"),
            ["scontrol", "update", "nodename=node5", "nodeaddr=10.0.0.9", "nodehostname=gpu-99"],
        ),
        (
            lambda c: c.update_partition_nodes("main", ["node2", "node1", "node5", "node4"]),
            ["scontrol", "update", "partitionname=main", "nodes=node[1-2,4-5]"],
        ),
        (lambda c: c.requeue(42), ["scontrol", "requeue", "42"]),
        (lambda c: c.cancel(42), ["scancel", "--verbose", "42"]),
        (lambda c: c.cancel(42, signal="term"), ["scancel", "--verbose", "--signal=TERM", "42"]),
        (lambda c: c.cancel(42, signal=10), ["scancel", "--verbose", "--signal=10", "42"]),
    ],
)
def test_state_changes_build_exact_argv(
    fake: Fake, call: Callable[[SlurmClient], None], argv: list[str]
) -> None:
    call(fake.client())
    assert fake.argvs() == [argv]


def test_every_call_selects_the_cluster_and_a_parsable_time_format(fake: Fake) -> None:
    fake.answer("scontrol", out="Slurmctld(primary) at head is UP\n")
    fake.client().ping()
    (call,) = fake.calls()
    assert call["conf"] == str(fake.conf)
    assert call["fmt"] == "standard"


def test_state_changes_are_logged_once_with_node_and_reason(
    fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hyperpod_agent.slurm.client")
    fake.client().drain("node3", "hyperpod:replace gpu3")
    (record,) = caplog.records
    assert "drain node3" in record.getMessage()
    assert "hyperpod:replace gpu3" in record.getMessage()


def test_a_failed_change_is_not_logged_as_done(
    fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hyperpod_agent.slurm.client")
    fake.answer("scontrol", err="slurm_update error: Invalid node name specified\n", rc=1)
    with pytest.raises(SlurmError):
        fake.client().drain("node9", "x")
    assert caplog.records == []


# --- errors --------------------------------------------------------------------------------


def test_non_zero_exit_carries_argv_and_stderr(fake: Fake) -> None:
    fake.answer("scontrol", err="slurm_update error: Invalid node name specified\n", rc=1)
    with pytest.raises(SlurmError) as exc:
        fake.client().resume("node9")
    err = exc.value
    assert err.argv == ["scontrol", "update", "nodename=node9", "state=resume"]
    assert err.returncode == 1
    assert err.stderr == "slurm_update error: Invalid node name specified"
    assert str(err) == (
        "scontrol update nodename=node9: exited with 1: "
        "slurm_update error: Invalid node name specified"
    )


def test_timeout_raises_slurm_timeout(fake: Fake) -> None:
    fake.answer("sinfo", out="{}", sleep=5)
    with pytest.raises(SlurmTimeout, match=r"^sinfo --json: timed out after 0.3 s$") as exc:
        fake.client(timeout=0.3).list_nodes()
    assert exc.value.timeout == 0.3


def test_slurm_not_installed(fake: Fake) -> None:
    (fake.bin / "sinfo").unlink()
    with pytest.raises(SlurmError, match="sinfo not found: is Slurm installed and on PATH"):
        fake.client().list_nodes()


def test_missing_slurm_conf_fails_fast(fake: Fake) -> None:
    client = SlurmClient(slurm_conf=fake.dir / "nope.conf", env={"PATH": str(fake.bin)})
    with pytest.raises(SlurmError, match="slurm.conf not found: .*nope.conf"):
        client.list_nodes()
    assert fake.calls() == []


def test_unparsable_output_raises_parse_error(fake: Fake) -> None:
    fake.answer("squeue", out="squeue: this is not json\n")
    with pytest.raises(SlurmParseError, match="squeue --json: unexpected output: not JSON"):
        fake.client().list_jobs()


def test_invalid_timeout() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        SlurmClient(timeout=0)


# --- reads -----------------------------------------------------------------------------------


def test_list_nodes_and_jobs_from_captures(fake: Fake, capture: Callable[[str], str]) -> None:
    fake.answer("sinfo", out=capture("sinfo_b.json"))
    fake.answer("squeue", out=capture("squeue_b.json"))
    client = fake.client()
    assert [n.name for n in client.list_nodes()] == [f"node{i}" for i in range(1, 6)]
    assert len(client.list_jobs()) == 9
    active = client.list_jobs(all_states=False)
    assert sorted((j.job_id, j.state) for j in active) == [
        (3, "RUNNING"),
        (4, "PENDING"),
        (8, "PENDING"),
    ]
    assert fake.argvs() == [["sinfo", "--json"], ["squeue", "--json"], ["squeue", "--json"]]


def test_node_lookup(fake: Fake, capture: Callable[[str], str]) -> None:
    line = capture("scontrol_nodes_b.txt").splitlines()[2]
    fake.answer("scontrol", out=line + "\n")
    node = fake.client().node("node3")
    assert node.name == "node3" and "DRAIN" in node.flags
    assert fake.argvs() == [["scontrol", "show", "node", "-o", "node3"]]


def test_unknown_node_names_the_node(fake: Fake) -> None:
    fake.answer("scontrol", err="Node gpu99 not found\n", rc=1)
    with pytest.raises(SlurmError, match=r"unknown node gpu99"):
        fake.client().node("gpu99")


def test_job_lookup_and_forgotten_job(fake: Fake, capture: Callable[[str], str]) -> None:
    line = next(ln for ln in capture("scontrol_jobs_b.txt").splitlines() if "JobId=3 " in ln)
    fake.answer("scontrol", out=line + "\n")
    job = fake.client().job(3)
    assert job is not None and job.auto_resume == 2 and job.nodes == ("node1", "node2")
    fake.answer("scontrol", err="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    assert fake.client().job(999) is None


def test_job_lookup_other_failure_raises(fake: Fake) -> None:
    fake.answer("scontrol", err="slurm_load_jobs error: Unable to contact slurm controller\n", rc=1)
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        fake.client().job(3)


def test_cancel_unknown_job_is_an_error_though_scancel_exits_0(fake: Fake) -> None:
    fake.answer(
        "scancel",
        err="scancel: Terminating job 999\n"
        "scancel: error: Kill job error on job id 999: Invalid job id specified\n",
    )
    with pytest.raises(SlurmError, match="cannot cancel job 999: .*Invalid job id specified"):
        fake.client().cancel(999)


def test_cancel_finished_job_is_fine(fake: Fake) -> None:
    fake.answer(
        "scancel",
        err="scancel: error: Kill job error on job id 7: "
        "Job/step already completing or completed\n",
    )
    fake.client().cancel(7)


@pytest.mark.parametrize(
    ("out", "rc", "sleep", "up"),
    [
        ("Slurmctld(primary) at head is UP\n", 0, 0, True),
        ("Slurmctld(primary) at head is DOWN\n", 1, 0, False),
        ("", 0, 5, False),
    ],
)
def test_ping(fake: Fake, out: str, rc: int, sleep: float, up: bool) -> None:
    fake.answer("scontrol", out=out, rc=rc, sleep=sleep)
    assert fake.client(timeout=0.3).ping() is up
    assert fake.argvs() == [["scontrol", "ping"]]


def test_ping_without_slurm_is_an_error_not_down(fake: Fake) -> None:
    (fake.bin / "scontrol").unlink()
    with pytest.raises(SlurmError, match="not found"):
        fake.client().ping()


# --- validation happens before anything runs -------------------------------------------------


@pytest.mark.parametrize(
    "node", ["", "node 1", "node1\n", "-node1", "node=1", "node1;rm", "n" * 2000, "node[1-"]
)
def test_bad_node_names_are_refused(fake: Fake, node: str) -> None:
    with pytest.raises(SlurmError, match="invalid node name"):
        fake.client().drain(node, "reason")
    assert fake.calls() == []


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("", "a reason is required"),
        ("   ", "a reason is required"),
        ("two\nlines", "control character"),
        ("tab\there", "control character"),
        ("x" * (REASON_MAX_LEN + 1), f"longer than {REASON_MAX_LEN}"),
    ],
)
def test_bad_reasons_are_refused(fake: Fake, reason: str, why: str) -> None:
    for call in (fake.client().drain, fake.client().down, fake.client().fail):
        with pytest.raises(SlurmError, match=why):
            call("node1", reason)
    with pytest.raises(SlurmError, match=why):
        fake.client().reboot("node1", reason)
    assert fake.calls() == []


@pytest.mark.parametrize("job_id", [0, -1, True, "5", 1.5])
def test_bad_job_ids_are_refused(fake: Fake, job_id: Any) -> None:
    with pytest.raises(SlurmError, match="invalid job id"):
        fake.client().requeue(job_id)
    assert fake.calls() == []


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda c: c.cancel(1, signal="TERM;ls"), "invalid signal"),
        (lambda c: c.reboot("node1", "r", next_state="idle"), "next_state must be"),
        (lambda c: c.update_partition_nodes("main", []), "refusing to empty partition main"),
        (lambda c: c.update_partition_nodes("main", ["ok1", "bad name"]), "invalid node name"),
        (lambda c: c.update_partition_nodes("ma in", ["n1"]), "invalid partition name"),
        (lambda c: c.set_address("node1", "1.2.3.4 x"), "invalid address"),
        (lambda c: c.set_address("node1", "10.0.0.1", hostname="a\nb"), "invalid hostname"),
    ],
)
def test_other_bad_arguments(fake: Fake, call: Callable[[SlurmClient], None], why: str) -> None:
    with pytest.raises(SlurmError, match=why):
        call(fake.client())
    assert fake.calls() == []


def test_node_names_may_be_hostlists(fake: Fake) -> None:
    fake.client().drain("gpu[01-04]", "maintenance")
    assert fake.argvs()[0][2] == "nodename=gpu[01-04]"


# --- format_reason ---------------------------------------------------------------------------


def test_format_reason() -> None:
    assert format_reason("replace", "gpu3", "xid79", "GPU has fallen off the bus") == (
        "hyperpod:replace gpu3 xid79 GPU has fallen off the bus"
    )
    assert format_reason("spare") == "hyperpod:spare"
    assert format_reason("reboot", "", "a\nb\t c  d") == "hyperpod:reboot a b c d"
    assert format_reason("x", prefix="NHC") == "NHC:x"


def test_format_reason_is_always_accepted(fake: Fake) -> None:
    reason = format_reason("replace", "gpu3", "y" * 1000 + "\n")
    assert len(reason) <= REASON_MAX_LEN
    fake.client().drain("node1", reason)
    assert fake.argvs()[0][-1] == f"reason={reason}"


def test_deleting_a_reservation_already_gone_is_not_an_error(fake: Fake) -> None:
    client = fake.client()
    err = "delete_reservation ReservationName=hyperpod-check-1-9: Requested reservation is invalid"
    fake.answer("scontrol", err=err, rc=1)
    assert client.delete_reservation("hyperpod-check-1-9") is False
    fake.answer("scontrol", err="delete_reservation: Requested reservation is in use", rc=1)
    with pytest.raises(SlurmError, match="in use"):
        client.delete_reservation("hyperpod-check-1-9")


def test_reservations_are_parsed(fake: Fake) -> None:
    client = fake.client()
    fake.answer("scontrol", out="No reservations in the system\n")
    assert client.reservations() == []
