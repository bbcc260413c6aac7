"""Messages across one release of difference: a newer peer's unknown fields are
ignored and counted, never a 422; the sender's release is read from User-Agent."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hyperpod_agent import wire
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.models import HeartbeatIn, StepFailureIn
from hyperpod_agent.health import NodeReport, Verdict

FIXTURES = Path(__file__).parent / "fixtures" / "wire"


def unknown(model: str) -> float:
    return float(metrics.UNKNOWN_FIELDS.labels(model)._value.get())  # type: ignore[attr-defined]


def report(**extra: object) -> dict[str, object]:
    return {
        "node": "node1",
        "agent_id": "a1",
        "seq": 1,
        "generated_at": datetime.now(UTC).isoformat(),
        "verdict": "healthy",
        **extra,
    }


def test_a_newer_agents_fields_are_ignored_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    before = unknown("NodeReport"), unknown("Finding")
    finding = {"component": "gpu0", "code": "xid79", "status": "FAIL", "blame": "psu"}
    result = {"probe": "gpu", "status": "FAIL", "at": "2026-01-01T00:00:00Z"}
    body = report(power_w=700, results=[{**result, "findings": [finding]}])
    parsed = NodeReport.model_validate(body)
    assert parsed.verdict is Verdict.HEALTHY and parsed.results[0].findings[0].code == "xid79"
    assert "power_w" not in parsed.model_dump_json()
    assert (unknown("NodeReport"), unknown("Finding")) == (before[0] + 1, before[1] + 1)
    assert "NodeReport: field 'power_w' not known to this release" in caplog.text
    caplog.clear()
    NodeReport.model_validate(body)  # counted again, logged once
    assert unknown("NodeReport") == before[0] + 2 and "power_w" not in caplog.text


def test_fields_this_release_needs_are_still_required() -> None:
    body = report()
    del body["seq"]
    with pytest.raises(ValueError, match="seq"):
        NodeReport.model_validate(body)
    with pytest.raises(ValueError, match="job_id"):
        StepFailureIn.model_validate({"step_id": "0", "exit_code": 1, "nodelist": "n1"})
    beat = {"node": "node1", "agent_id": "a", "seq": 2, "sent_at": "2026-01-01T00:00:00Z"}
    assert HeartbeatIn.model_validate({**beat, "load": 1}).seq == 2


@pytest.mark.parametrize(
    ("header", "version"),
    [
        ("hyperpod/0.1.0", "0.1.0"),
        ("Python-urllib/3.11 hyperpod/0.2.0.dev1", "0.2.0.dev1"),
        ("curl/8.0", None),
        (None, None),
        ("hyperpod/" + "9" * 100, None),
    ],
)
def test_the_senders_release_comes_from_user_agent(header: str | None, version: str | None) -> None:
    assert wire.version_of(header) == version


def test_what_the_previous_release_sent_is_accepted() -> None:
    """Messages recorded from the previous release's agent (fixtures/wire/<release>)."""
    files = [p for p in sorted(FIXTURES.glob("*/*.json")) if p.stem != "manifest"]
    assert files, FIXTURES
    models = {"report": NodeReport, "heartbeat": HeartbeatIn}
    for path in files:
        kind = path.stem.split("-")[0]
        models[kind].model_validate(json.loads(path.read_text()))


# What an agent sends, by model: each field must be one the previous release reads, as
# it refused unknown fields (a 422 would blind it to every upgraded node).
AGENT_SENDS = ("NodeReport", "ProbeResult", "Finding", "FaultRef", "JobProgress", "RankProgress")


def test_what_this_releases_agent_sends_the_previous_controller_reads() -> None:
    import hyperpod_agent.health as health

    for manifest_path in sorted(FIXTURES.glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        release = manifest["release"]
        for name in AGENT_SENDS:
            old = manifest["models"][name]
            new = set(getattr(health, name).model_fields)
            if old["forbids_extra"]:
                assert new <= set(old["fields"]), (
                    f"{name}: {sorted(new - set(old['fields']))} would be refused by a "
                    f"{release} controller: send them only to a controller that says it "
                    "reads them"
                )
        for enum_name, values in manifest["enums"].items():
            current = {v.value for v in getattr(health, enum_name)}
            assert current <= set(values), f"{enum_name}: {sorted(current - set(values))}"
        beat = set(HeartbeatIn.model_fields)
        assert beat <= set(manifest["models"]["HeartbeatIn"]["fields"]), release
