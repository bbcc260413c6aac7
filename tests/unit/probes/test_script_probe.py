"""The script probe runs real executables written into tmp_path."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.script import ScriptCheck, ScriptConfig, ScriptProbe, ScriptRun, judge


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def probe(**cfg: object) -> ScriptProbe:
    return ScriptProbe(ScriptConfig.model_validate(cfg), ProbeContext(node_name="node1"))


CHECK = ScriptCheck(name="ecc", path="/opt/check")

# --- judge (pure) --------------------------------------------------------------------------


def test_judge_exit_codes() -> None:
    assert judge(CHECK, ScriptRun(0, "fine"), 256) is None
    fail = judge(CHECK, ScriptRun(1, "  bad\n  dimm  "), 256)
    assert fail is not None
    assert (fail.status, fail.code, fail.message) == (Status.FAIL, "script_fail", "bad dimm")
    assert fail.action is Action.MONITOR
    unknown = judge(CHECK, ScriptRun(2, "cannot tell"), 256)
    assert unknown is not None
    assert (unknown.status, unknown.code) == (Status.UNKNOWN, "script_unknown")
    assert unknown.message == "exit 2: cannot tell"
    assert unknown.action is Action.NONE
    other = judge(CHECK, ScriptRun(137, ""), 256)
    assert other is not None and other.status is Status.UNKNOWN and other.message == "exit 137"


def test_judge_timeout_and_start_error_are_unknown() -> None:
    timeout = judge(CHECK, ScriptRun(None, "", timed_out=True), 256)
    assert timeout is not None and timeout.code == "script_timeout"
    assert timeout.status is Status.UNKNOWN
    error = judge(CHECK, ScriptRun(None, "", error="Permission denied"), 256)
    assert error is not None and error.code == "script_error"
    assert "Permission denied" in error.message


def test_judge_truncates_output() -> None:
    finding = judge(CHECK, ScriptRun(1, "x" * 1000), 256)
    assert finding is not None and len(finding.message) == 256


def test_judge_uses_the_configured_action_for_failures_only() -> None:
    check = ScriptCheck(name="fs", path="/opt/fs", action=Action.REBOOT, urgent=True)
    fail = judge(check, ScriptRun(1, ""), 256)
    assert fail is not None and fail.action is Action.REBOOT and fail.urgent
    assert fail.message == "exit 1"
    unknown = judge(check, ScriptRun(3, ""), 256)
    assert unknown is not None and unknown.action is Action.NONE and not unknown.urgent


# --- real executables ----------------------------------------------------------------------


def test_no_scripts_is_ok() -> None:
    out = probe().check()
    assert out.status is Status.OK and out.message == "0 script(s) ok"


def test_passing_scripts_with_args(tmp_path: Path) -> None:
    ok = script(tmp_path, "ok.sh", 'test "$1" = "--quick" || exit 1\necho all good')
    out = probe(scripts=[{"name": "ok", "path": ok, "args": ["--quick"]}]).check()
    assert out.status is Status.OK, out.message


def test_failing_script_reports_its_stdout(tmp_path: Path) -> None:
    bad = script(tmp_path, "bad.sh", "echo 'nvme0 SMART critical warning'\nexit 1")
    out = probe(scripts=[{"name": "nvme", "path": bad, "action": "REPLACE"}]).check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert finding.component == "nvme"
    assert finding.message == "nvme0 SMART critical warning"
    assert finding.action is Action.REPLACE


def test_exit_two_is_unknown(tmp_path: Path) -> None:
    path = script(tmp_path, "u.sh", "echo no ipmi; exit 2")
    out = probe(scripts=[{"name": "ipmi", "path": path}]).check()
    assert out.status is Status.UNKNOWN


def test_timeout_kills_the_script_tree_and_is_unknown(tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    path = script(tmp_path, "slow.sh", f"(sleep 1; touch {marker}) &\nsleep 30")
    start = time.monotonic()
    out = probe(scripts=[{"name": "slow", "path": path, "timeout_s": 0.5}]).check()
    assert time.monotonic() - start < 5
    assert out.status is Status.UNKNOWN
    assert out.findings[0].code == "script_timeout"
    time.sleep(1.5)
    assert not marker.exists()  # the background child died with its session


def test_scripts_run_in_parallel(tmp_path: Path) -> None:
    slow = [script(tmp_path, f"s{i}.sh", "sleep 0.6") for i in range(3)]
    start = time.monotonic()
    out = probe(
        scripts=[{"name": f"s{i}", "path": p, "timeout_s": 5} for i, p in enumerate(slow)]
    ).check()
    assert out.status is Status.OK
    assert time.monotonic() - start < 1.6  # sequential would take 1.8 s


def test_missing_or_not_executable_script_is_unknown(tmp_path: Path) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("exit 0\n")
    out = probe(
        scripts=[
            {"name": "missing", "path": str(tmp_path / "nope")},
            {"name": "plain", "path": str(plain)},
        ]
    ).check()
    assert out.status is Status.UNKNOWN
    assert [f.code for f in out.findings] == ["script_error", "script_error"]


def test_one_failure_among_unknowns_is_fail(tmp_path: Path) -> None:
    fail = script(tmp_path, "f.sh", "exit 1")
    unknown = script(tmp_path, "u.sh", "exit 2")
    out = probe(scripts=[{"name": "f", "path": fail}, {"name": "u", "path": unknown}]).check()
    assert out.status is Status.FAIL


# --- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        {"scripts": [{"name": "a", "path": "relative.sh"}]},
        {"scripts": [{"name": "a b", "path": "/x"}]},
        {"scripts": [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]},
        {"scripts": [{"name": "a", "path": "/x", "timeout_s": 10}]},
        {"scripts": [{"name": "a", "path": "/x", "shell": True}]},
        {"output_chars": 5},
    ],
)
def test_config_rejects_bad_values(cfg: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ScriptConfig.model_validate(cfg)


def test_config_defaults() -> None:
    cfg = ScriptConfig()
    assert cfg.scripts == [] and cfg.interval_s == 30
    assert ScriptCheck(name="a", path="/x").action is Action.MONITOR
