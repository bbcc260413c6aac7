"""``hyperpod step-retry``: srun runs, fails, the controller is asked, and the same
command line runs again on the new node list, or the failure stands. A stub
controller over loopback HTTP; srun is a script that records its environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Stub

FAKE_SRUN = """#!/bin/sh
# Record this run, then exit with the next code of codes (0 when they run out).
echo "$HYPERPOD_STEP_ATTEMPT $SLURM_JOB_NODELIST $SLURM_NNODES $HYPERPOD_RDZV_HOST \
$HYPERPOD_STEP_WRAPPED" >> "$RUNS"
code=$(head -n1 "$CODES" 2>/dev/null); sed -i 1d "$CODES" 2>/dev/null
case "$code" in
  cancel) echo "slurmstepd: error: *** STEP 12.0 ON node1 CANCELLED AT $(date +%FT%T) ***" >&2
          exit 137;;
  hang) trap 'kill $!; exit 143' TERM; sleep 30 & wait; exit 1;;
esac
exit "${code:-0}"
"""
RETRY = {"id": 7, "job_id": 12, "step_id": "x", "cause": "gpu3 xid79 on node2: node5 stands in"}


@pytest.fixture
def srun(tmp_path: Path) -> Path:
    path = tmp_path / "srun"
    path.write_text(FAKE_SRUN)
    path.chmod(0o755)
    return path


def run(stub: Stub, srun: Path, codes: list[str], *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    tmp = srun.parent
    (tmp / "codes").write_text("".join(f"{c}\n" for c in codes))
    full = {
        **os.environ,
        "HYPERPOD_ADMIN_CONFIG": str(stub.config),
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_NNODES": "2",
        "RUNS": str(tmp / "runs"),
        "CODES": str(tmp / "codes"),
        **(env or {}),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperpod_agent",
            "step-retry",
            *args,
            "--",
            str(srun),
            "-N2",
            "--auto-resume=2",
            "train",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        check=False,
    )
    runs = (tmp / "runs").read_text().splitlines() if (tmp / "runs").exists() else []
    return proc, runs


def asked(stub: Stub, path: str) -> list[Any]:
    return [s.body for s in stub.seen if s.path == path]


def test_a_step_that_succeeds_asks_nothing(stub: Stub, srun: Path) -> None:
    stub.answer("POST", "/v1/steps/watch", 200, {"end": False, "cause": "", "renew_every_s": 2.0})
    proc, runs = run(stub, srun, ["0"])
    assert proc.returncode == 0, proc.stderr
    assert runs == ["0 node[1-2] 2 node1 1"]
    assert asked(stub, "/v1/steps/retry") == []


def test_a_retrystep_runs_the_same_srun_again_on_the_new_nodes(stub: Stub, srun: Path) -> None:
    stub.answer("POST", "/v1/steps/watch", 200, {"end": False, "cause": "", "renew_every_s": 2.0})
    stub.answer(
        "POST",
        "/v1/steps/retry",
        202,
        {**RETRY, "decision": "RETRYSTEP", "phase": "drain", "done": False, "attempt": 2},
    )
    stub.answer(
        "GET",
        "/v1/steps/retry/7",
        200,
        {
            **RETRY,
            "decision": "RETRYSTEP",
            "phase": "done",
            "done": True,
            "attempt": 2,
            "nodelist": "node[1,5]",
            "nnodes": 2,
            "rdzv_host": "node1",
        },
    )
    proc, runs = run(stub, srun, ["1", "0"])
    assert proc.returncode == 0, proc.stderr
    assert runs == ["0 node[1-2] 2 node1 1", "1 node[1,5] 2 node1 1"]
    [report] = asked(stub, "/v1/steps/retry")
    assert (report["job_id"], report["exit_code"], report["nodelist"], report["attempt"]) == (
        12,
        1,
        "node[1-2]",
        1,
    )
    assert report["auto_resume"] == 2 and report["cancelled"] is False
    assert datetime.fromisoformat(report["started_at"]) < datetime.now(UTC)  # the launch
    assert "Retrying step. Attempt number: 1 (on node[1,5])" in proc.stderr
    assert "backing off" not in proc.stderr


def test_a_relaunch_waits_the_back_off_it_is_given(stub: Stub, srun: Path) -> None:
    done = {
        **RETRY,
        "decision": "RETRYSTEP",
        "phase": "done",
        "done": True,
        "attempt": 2,
        "nodelist": "node[1,5]",
        "nnodes": 2,
        "rdzv_host": "node1",
        "retry_after_s": 1.0,
    }
    stub.answer("POST", "/v1/steps/retry", 200, done)
    proc, runs = run(stub, srun, ["1", "0"])
    assert proc.returncode == 0 and len(runs) == 2, proc.stderr
    assert "backing off 1 s before the relaunch" in proc.stderr


@pytest.mark.parametrize("decision", ["FAIL", "REQUEUE"])
def test_fail_and_requeue_end_with_sruns_exit_code_and_the_cause(
    stub: Stub, srun: Path, decision: str
) -> None:
    """REQUEUE first waits for the controller's requeue to end the job (which would
    end this helper): here none comes, so it ends after --requeue-wait-s."""
    stub.answer(
        "POST",
        "/v1/steps/retry",
        200,
        {
            **RETRY,
            "id": None,
            "decision": decision,
            "phase": None,
            "done": True,
            "attempt": 2,
            "cause": "exit 93: the application asked not to restart",
        },
    )
    proc, runs = run(stub, srun, ["93"], "--requeue-wait-s", "0.5")
    assert proc.returncode == 93 and len(runs) == 1
    if decision == "FAIL":
        assert "FAIL: exit 93: the application asked not to restart (exit 93)" in proc.stderr
    else:
        said = "REQUEUE: exit 93: the application asked not to restart; waiting for the job's"
        assert said in proc.stderr
        assert "no requeue within 0.5 s (exit 93)" in proc.stderr


def test_a_cancelled_step_says_so(stub: Stub, srun: Path) -> None:
    stub.answer(
        "POST",
        "/v1/steps/retry",
        200,
        {**RETRY, "id": None, "decision": "FAIL", "phase": None, "done": True, "attempt": 2},
    )
    proc, _ = run(stub, srun, ["cancel"])
    assert proc.returncode == 137
    [report] = asked(stub, "/v1/steps/retry")
    assert report["cancelled"] is True and report["exit_code"] == 137


def test_told_to_end_the_step_ends_srun_and_it_is_no_cancellation(stub: Stub, srun: Path) -> None:
    stub.answer(
        "POST",
        "/v1/steps/watch",
        200,
        {"end": True, "cause": "gpu3 xid79 on node2", "renew_every_s": 2.0},
    )
    stub.answer(
        "POST",
        "/v1/steps/retry",
        200,
        {**RETRY, "id": None, "decision": "REQUEUE", "phase": None, "done": True, "attempt": 2},
    )
    proc, _ = run(stub, srun, ["hang"], "--requeue-wait-s", "0")
    assert proc.returncode == 143, proc.stderr
    assert "the controller ends the step: gpu3 xid79 on node2" in proc.stderr
    [report] = asked(stub, "/v1/steps/retry")
    assert report["cancelled"] is False


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (200, {"decision": "MAYBE", "done": True}, "malformed"),
        (200, [1, 2], "malformed"),
        (500, {"error": {"code": "internal", "message": "boom"}}, "could not ask the controller"),
    ],
)
def test_a_bad_answer_fails_the_step_as_srun_would(
    stub: Stub, srun: Path, status: int, body: Any, words: str
) -> None:
    stub.answer("POST", "/v1/steps/retry", status, body)
    proc, runs = run(stub, srun, ["1"])
    assert proc.returncode == 1 and len(runs) == 1
    assert words in proc.stderr and "exit 1" in proc.stderr


def test_no_controller_fails_the_step_as_srun_would(stub: Stub, srun: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    stub.config.write_text(stub.config.read_text().replace(stub.url, dead))
    proc, runs = run(stub, srun, ["1"], "--reach-s", "1")
    assert proc.returncode == 1 and len(runs) == 1
    assert "no controller answers" in proc.stderr and "trying for 1 s" in proc.stderr
    assert "could not ask the controller whether to retry" in proc.stderr


def test_a_surgery_that_never_ends_is_given_up_after_wait_s(stub: Stub, srun: Path) -> None:
    pending = {**RETRY, "decision": "RETRYSTEP", "phase": "expand", "done": False, "attempt": 2}
    stub.answer("POST", "/v1/steps/retry", 202, pending)
    stub.answer("GET", "/v1/steps/retry/7", 200, pending)
    proc, runs = run(stub, srun, ["1"], "--wait-s", "1")
    assert proc.returncode == 1 and len(runs) == 1
    assert "not ready within 1 s" in proc.stderr


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"SLURM_JOB_ID": ""}, "not inside an allocation"),
        ({"HYPERPOD_STEP_AUTO_RESUME": "abc"}, "--auto-resume=abc"),
        ({"HYPERPOD_STEP_AUTO_RESUME": "5000"}, "--auto-resume=5000"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    stub: Stub, srun: Path, env: dict[str, str], words: str
) -> None:
    proc, runs = run(stub, srun, ["0"], env=env)
    assert proc.returncode == 2 and runs == []
    [line] = proc.stderr.strip().splitlines()
    assert words in line
