"""The admin commands against a stub controller over real loopback HTTP."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
import pytest
from click.testing import CliRunner

from hyperpod_agent.admin import cli as admin_cli
from hyperpod_agent.admin.cli import events, jobs, node, nodes, status

if TYPE_CHECKING:
    from conftest import Stub

NOW = datetime.now(UTC)
ISO = (NOW - timedelta(seconds=42)).isoformat()


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # "42s ago" must not depend on how long the suite took to reach this test.
    monkeypatch.setattr(admin_cli, "_now", lambda: NOW)


STATUS = {
    "nodes_total": 5,
    "by_state": {"idle": 3, "drained": 2},
    "by_verdict": {"healthy": 4, "faulty": 1},
    "incident_mode": False,
    "incident_reason": "",
    "dry_run": False,
    "open_faults": 1,
    "pending_actions": 0,
    "last_pass_at": ISO,
}
NODES = [
    {
        "name": "node1",
        "state": "idle",
        "flags": [],
        "reason": "",
        "partitions": ["main"],
        "verdict": "healthy",
        "agent_id": "a1",
        "last_report_at": ISO,
        "last_heartbeat_at": ISO,
        "open_faults": 0,
    },
    {
        "name": "node3",
        "state": "idle",
        "flags": ["DRAIN"],
        "reason": "hyperpod:reboot gpu3 xid79 GPU has fallen off the bus",
        "partitions": ["main"],
        "verdict": "faulty",
        "agent_id": "a3",
        "last_report_at": ISO,
        "last_heartbeat_at": None,
        "open_faults": 1,
    },
]
FAULT = {
    "id": 7,
    "component": "gpu3",
    "code": "xid79",
    "severity": "FAIL",
    "action": "REBOOT",
    "urgent": True,
    "first_seen": ISO,
    "last_seen": ISO,
    "count": 2,
    "message": "GPU has fallen off the bus",
    "closed_at": None,
}
EVENT = {
    "id": 11,
    "at": "2026-11-22T06:00:00+00:00",
    "kind": "drain",
    "node": "node3",
    "job_id": None,
    "cause": "fault gpu3 xid79",
    "message": "drained node3",
}
JOB = {
    "job_id": 42,
    "state": "RUNNING",
    "nodes": ["node1", "node2"],
    "restart_count": 1,
    "cap": 3,
    "attempts": 1,
    "last_cause": "node_fault node3",
    "tracking": "requeued",
    "last_requeue_at": ISO,
    "resumed_from_step": 900,
}


def run(stub: Stub, command: click.Command, *args: str) -> Any:
    return CliRunner().invoke(command, [*args, "--config", str(stub.config)])


def test_status_human(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 200, STATUS)
    result = run(stub, status)
    assert result.exit_code == 0, result.output
    assert "nodes:           5" in result.output
    assert "by verdict:      faulty=1 healthy=4" in result.output
    assert "incident mode:   no" in result.output
    assert "(42s ago)" in result.output
    assert stub.seen[0].identity.is_admin


def test_status_incident_mode_is_loud(stub: Stub) -> None:
    stub.answer(
        "GET",
        "/v1/status",
        200,
        {**STATUS, "incident_mode": True, "incident_reason": "40% of main failing disk"},
    )
    assert "incident mode:   YES: 40% of main failing disk" in run(stub, status).output


def test_status_says_whether_a_step_retry_can_stay_in_place(stub: Stub) -> None:
    stub.answer(
        "GET",
        "/v1/status",
        200,
        {**STATUS, "slurmctld_version": "22.05.8", "expansion_refused": ""},
    )
    out = run(stub, status).output
    assert "slurmctld:       22.05.8" in out and "step retry:      in place" in out
    why = "job expansion refused: it crashes slurmctld 25.11.7 (NULL license list …)"
    stub.answer(
        "GET",
        "/v1/status",
        200,
        {**STATUS, "slurmctld_version": "25.11.7", "expansion_refused": why},
    )
    assert f"step retry:      requeued instead ({why})" in run(stub, status).output
    stub.answer("GET", "/v1/status", 200, STATUS)  # an older controller says neither
    assert "slurmctld" not in run(stub, status).output


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_status_names_the_leader_and_every_controllers_health(stub: Stub) -> None:
    ha = {**STATUS, "role": "leader", "leader": "head1", "leader_since": ISO}
    stub.answer("GET", "/v1/status", 200, ha)
    stub.answer(
        "GET",
        "/v1/healthz",
        200,
        {"ok": True, "controller": "head1", "role": "leader", "last_pass_at": ISO},
    )
    dead = _closed_url()
    stub.config.write_text(stub.config.read_text().replace(stub.url, f"{stub.url},{dead}"))
    result = run(stub, status)
    assert result.exit_code == 0, result.output
    assert "leader:          head1 since" in result.output and "(42s ago)" in result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[-2:]}
    assert rows["head1"][1:4] == [stub.url, "leader", "ok"]
    assert rows["-"][1:4] == [dead, "-", "unreachable:"]
    doc = json.loads(run(stub, status, "--json").output)
    assert [c["url"] for c in doc["controllers"]] == [stub.url, dead]
    assert doc["controllers"][0]["role"] == "leader" and doc["controllers"][1]["ok"] is False


def test_status_json_is_the_raw_answer(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 200, STATUS)
    result = run(stub, status, "--json")
    assert json.loads(result.output) == STATUS


def test_nodes_table(stub: Stub) -> None:
    stub.answer("GET", "/v1/nodes", 200, NODES)
    result = run(stub, nodes)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == [
        "NODE",
        "STATE",
        "VERDICT",
        "FAULTS",
        "REPORT",
        "HEARTBEAT",
        "REASON",
    ]
    assert lines[1].split()[:6] == ["node1", "idle", "healthy", "0", lines[1].split()[4], "42s"]
    assert lines[2].split()[:6] == ["node3", "idle+DRAIN", "faulty", "1", "42s", "-"]
    assert lines[2].endswith("hyperpod:reboot gpu3 xid79 GPU has fallen off the bus")
    # Columns line up.
    assert lines[0].index("VERDICT") == lines[1].index("healthy") == lines[2].index("faulty")


def test_nodes_json(stub: Stub) -> None:
    stub.answer("GET", "/v1/nodes", 200, NODES)
    assert json.loads(run(stub, nodes, "--json").output) == NODES


def test_node_show(stub: Stub) -> None:
    detail = {**NODES[1], "faults": [FAULT], "actions": [], "report": None}
    stub.answer("GET", "/v1/nodes/node3", 200, detail)
    result = run(stub, node, "show", "node3")
    assert result.exit_code == 0, result.output
    assert "state:          idle+DRAIN" in result.output
    assert "Faults:" in result.output and "xid79" in result.output
    assert "Actions:" not in result.output


def test_node_show_unknown_node(stub: Stub) -> None:
    stub.answer(
        "GET", "/v1/nodes/node9", 404, {"error": {"code": "not_found", "message": "no node node9"}}
    )
    result = run(stub, node, "show", "node9")
    assert result.exit_code == 1
    assert result.output == "hyperpod: error: no node node9 (HTTP 404, not_found)\n"


@pytest.mark.parametrize("action", ["drain", "resume", "reboot", "replace"])
def test_node_actions_post_the_request(stub: Stub, action: str) -> None:
    answer = {
        "action_id": 5,
        "kind": action,
        "node": "node2",
        "reason": "bad fan",
        "dry_run": False,
    }
    stub.answer("POST", "/v1/nodes/node2/actions", 202, answer)
    result = run(stub, node, action, "node2", "--reason", "bad fan")
    assert result.exit_code == 0, result.output
    assert result.output == f"{action} node2: accepted as action 5 (bad fan)\n"
    assert stub.seen[0].body == {"action": action, "reason": "bad fan"}


def test_resume_no_check_asks_for_a_resume_without_the_deep_check(stub: Stub) -> None:
    answer = {"action_id": 6, "kind": "resume", "node": "node2", "reason": "", "dry_run": False}
    stub.answer("POST", "/v1/nodes/node2/actions", 202, answer)
    result = run(stub, node, "resume", "node2", "--no-check", "--reason", "fixed")
    assert result.exit_code == 0, result.output
    assert stub.seen[0].body == {"action": "resume", "reason": "fixed", "check": False}


def test_a_gated_resume_shows_the_reason_it_waits_under(stub: Stub) -> None:
    reason = "hyperpod:check admin resume fixed"
    answer = {"action_id": 7, "kind": "resume", "node": "node2", "reason": reason, "dry_run": False}
    stub.answer("POST", "/v1/nodes/node2/actions", 202, answer)
    result = run(stub, node, "resume", "node2", "--reason", "fixed")
    assert result.output == f"resume node2: accepted as action 7 ({reason})\n"
    assert "check" not in stub.seen[0].body  # the controller decides: an older one still takes it


@pytest.mark.parametrize("action", ["drain", "reboot", "replace"])
def test_no_check_is_for_resume_only(stub: Stub, action: str) -> None:
    result = run(stub, node, action, "node2", "--no-check")
    assert result.exit_code == 2 and "No such option '--no-check'" in result.output
    assert stub.seen == []


def test_node_action_default_reason_names_the_user(stub: Stub) -> None:
    stub.answer("POST", "/v1/nodes/node2/actions", 202, {"action_id": 1, "dry_run": True})
    result = run(stub, node, "drain", "node2")
    assert "[dry run: the controller will change nothing]" in result.output
    assert stub.seen[0].body["reason"].startswith("requested by ")


def test_node_action_json(stub: Stub) -> None:
    answer = {"action_id": 5, "kind": "drain", "node": "node2", "reason": "x", "dry_run": False}
    stub.answer("POST", "/v1/nodes/node2/actions", 202, answer)
    assert json.loads(run(stub, node, "drain", "node2", "--json").output) == answer


def test_node_action_forbidden(stub: Stub) -> None:
    stub.answer(
        "POST",
        "/v1/nodes/node2/actions",
        403,
        {"error": {"code": "forbidden", "message": "uid 1000 is not an admin"}},
    )
    result = run(stub, node, "replace", "node2")
    assert result.exit_code == 1
    assert result.output == "hyperpod: error: uid 1000 is not an admin (HTTP 403, forbidden)\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["drain", "node 2"], "Invalid value for 'NAME': 'node 2' is not a node name"),
        (["drain", "node2", "--reason", "x" * 161], "at most 160 characters"),
        (["drain", "node2", "--reason", "  "], "must not be empty"),
        (["explode", "node2"], "No such command 'explode'"),
        (["show"], "Missing argument 'NAME'"),
    ],
)
def test_node_bad_arguments_are_usage_errors(stub: Stub, args: list[str], message: str) -> None:
    result = run(stub, node, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert stub.seen == []


def test_events_query_and_table(stub: Stub) -> None:
    stub.answer("GET", "/v1/events", 200, [EVENT])
    result = run(stub, events, "--since", "10m", "--node", "node3", "--limit", "5")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split() == [
        "TIME",
        "KIND",
        "NODE",
        "JOB",
        "CAUSE",
        "MESSAGE",
    ]
    assert "2026-11-22 06:00:00  drain  node3  -    fault gpu3 xid79  drained node3" in (
        result.output
    )
    path = stub.seen[0].path
    assert "node=node3" in path and "limit=5" in path
    assert run(stub, events, "--job", "42").exit_code == 0
    assert "job=42" in stub.seen[1].path
    since = datetime.fromisoformat(
        path.split("since=")[1].split("&")[0].replace("%3A", ":").replace("%2B", "+")
    )
    assert NOW - since == timedelta(minutes=10)  # the clock is frozen at NOW


def test_events_of_one_kind(stub: Stub) -> None:
    stub.answer("GET", "/v1/events", 200, [EVENT])
    assert run(stub, events, "--kind", "would_have").exit_code == 0
    assert "kind=would_have" in stub.seen[0].path
    bad = run(stub, events, "--kind", "Would Have")
    assert bad.exit_code == 2 and "is not an event kind" in bad.output
    assert len(stub.seen) == 1  # refused before asking the controller


def test_events_since_iso(stub: Stub) -> None:
    stub.answer("GET", "/v1/events", 200, [])
    result = run(stub, events, "--since", "2026-11-22T05:00:00", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == []
    assert "since=2026-11-22T05%3A00%3A00%2B00%3A00" in stub.seen[0].path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday-ish"], "Invalid value for '--since': 'yesterday-ish' is neither"),
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--limit", "many"], "Invalid value for '--limit'"),
        (["--node", "a/b"], "Invalid value for '--node'"),
    ],
)
def test_events_bad_arguments_are_usage_errors(stub: Stub, args: list[str], message: str) -> None:
    result = run(stub, events, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert stub.seen == []


def test_jobs_table_and_show(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs", 200, [JOB])
    stub.answer("GET", "/v1/jobs/42", 200, {**JOB, "events": [EVENT], "actions": []})
    listing = run(stub, jobs)
    assert listing.exit_code == 0, listing.output
    assert listing.output.splitlines()[1].split()[:5] == [
        "42",
        "RUNNING",
        "node1,node2",
        "1",
        "1/3",
    ]
    shown = run(stub, jobs, "show", "42")
    assert shown.exit_code == 0, shown.output
    assert "auto-resume:       1 of 3 used" in shown.output
    assert "Events:" in shown.output and "drained node3" in shown.output


def test_jobs_json_before_or_after_show(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs/42", 200, JOB)
    result = CliRunner().invoke(jobs, ["--json", "--config", str(stub.config), "show", "42"])
    assert json.loads(result.output) == JOB
    assert json.loads(run(stub, jobs, "show", "42", "--json").output) == JOB


def test_jobs_show_needs_a_job_id(stub: Stub) -> None:
    result = run(stub, jobs, "show", "abc")
    assert result.exit_code == 2
    assert "Invalid value for 'JOB_ID'" in result.output


def test_unreachable_controller_is_one_line(stub: Stub) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = run(stub, status, "--url", url)
    assert result.exit_code == 1
    assert (
        result.output == f"hyperpod: error: controller at {url} unreachable: Connection refused\n"
    )


def test_missing_url_is_a_config_error(stub: Stub, tmp_path: Any) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    result = CliRunner().invoke(status, ["--config", str(empty)])
    assert result.exit_code == 3
    assert result.output.startswith("hyperpod: error: no controller URL: pass --url")


def test_unexpected_answer_shape_is_one_line(stub: Stub) -> None:
    stub.answer("GET", "/v1/nodes", 200, {"oops": 1})
    result = run(stub, nodes)
    assert result.exit_code == 1
    assert result.output == (
        "hyperpod: error: controller sent an unexpected answer (expected a list)\n"
    )


def test_url_from_the_environment(stub: Stub, tmp_path: Any) -> None:
    stub.answer("GET", "/v1/status", 200, STATUS)
    config = tmp_path / "auth-only.toml"
    config.write_text(f'[auth]\nmode = "token"\ntoken_secret_file = "{stub.secret}"\n')
    result = CliRunner().invoke(
        status, ["--config", str(config)], env={"HYPERPOD_CONTROLLER_URL": stub.url}
    )
    assert result.exit_code == 0, result.output


def test_a_config_others_may_change_is_refused_with_exit_3(stub: Stub) -> None:
    stub.config.chmod(0o666)
    result = run(stub, status)
    assert result.exit_code == 3
    assert result.output == (
        f"hyperpod: error: {stub.config}: not trusted: it may be changed by group or "
        "others (mode 0666)\n"
    )
    assert stub.seen == []


STRAGGLER = {
    "kind": "straggler",
    "job_id": 42,
    "restart_count": 0,
    "node": "node2",
    "step": -1,
    "at": "2026-11-24T10:00:00Z",
    "detail": "node2 straggles in job 42: median step 0.700 s vs 0.500 s (+40%)",
}
HANG = {**STRAGGLER, "kind": "hang", "node": "", "step": 120, "detail": "job 42 hung: ..."}


def test_jobs_and_node_show_name_hangs_and_stragglers(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs", 200, [{**JOB, "findings": [STRAGGLER, HANG]}])
    listing = run(stub, jobs)
    assert listing.exit_code == 0, listing.output
    assert "FOUND" in listing.output.splitlines()[0]
    assert "straggler:node2 hang@120" in listing.output
    detail = {**NODES[1], "faults": [], "findings": [STRAGGLER], "actions": [], "report": None}
    stub.answer("GET", "/v1/nodes/node3", 200, detail)
    shown = run(stub, node, "show", "node3")
    assert shown.exit_code == 0, shown.output
    assert "Hangs and stragglers:" in shown.output and "(+40%)" in shown.output


def test_jobs_show_step_retries(stub: Stub) -> None:
    retry = {
        "id": 7, "job_id": 42, "step_id": "srun-9", "decision": "RETRYSTEP",
        "cause": "gpu3 xid79 on node2: node5 stands in", "phase": "done", "done": True,
        "attempt": 2, "nodelist": "node[1,5]", "nnodes": 2, "rdzv_host": "node1",
        "created_at": ISO, "updated_at": ISO,
    }  # fmt: skip
    stub.answer("GET", "/v1/jobs", 200, [{**JOB, "step_retries": 1, "last_step_retry": retry}])
    result = run(stub, jobs)
    assert result.exit_code == 0, result.output
    header, line = result.output.splitlines()[:2]
    assert "STEP RETRIES" in header and "1 (done)" in line
    detail = {**JOB, "step_retries": 1, "last_step_retry": retry, "step_retry_history": [retry]}
    stub.answer("GET", "/v1/jobs/42", 200, {**detail, "events": [], "actions": []})
    shown = run(stub, jobs, "show", "42").output
    assert "Step retries" in shown and "node[1,5]" in shown and "node5 stands in" in shown
