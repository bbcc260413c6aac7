"""The controller across one release of difference, through its real API: the previous
release's agent messages are accepted and acted on; a newer agent's unknown fields are
accepted, ignored and counted."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from test_api import Api

from hyperpod_agent import __version__
from hyperpod_agent.controller import metrics

FIXTURES = Path(__file__).parents[1] / "fixtures" / "wire"


def recorded(release: str, name: str) -> dict[str, Any]:
    """A message the release's agent sent, dated now (the format is what is tested)."""
    doc: dict[str, Any] = json.loads((FIXTURES / release / f"{name}.json").read_text())
    stamp = "generated_at" if "generated_at" in doc else "sent_at"
    doc[stamp] = datetime.now(UTC).isoformat()
    return doc


def test_the_previous_releases_agent_is_heard_and_acted_on(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        old_agent = {"User-Agent": "Python-urllib/3.11 hyperpod/0.1.0"}
        report = recorded("v0.1.0", "report-faulty")
        resp = api.post("/v1/reports", report, who="node2", extra=old_agent)
        assert resp.status_code == 200, resp.text
        beat = api.post("/v1/heartbeats", recorded("v0.1.0", "heartbeat"), who="node2")
        assert beat.status_code == 200, beat.text
        api.controller.reconcile_once()
        # `hyperpod version` sees which release each agent is
        releases = {n["name"]: n["agent_version"] for n in api.get("/v1/nodes").json()}
        assert releases["node2"] == "0.1.0" and releases["node1"] is None
        status = api.get("/v1/status").json()
        assert (status["version"], status["api_version"]) == (__version__, 1)
        # its urgent XID 79 took node2 out, as from an agent of this release
        assert [c[:2] for c in api.slurm.calls if c[1] == "node2"][:1] in (
            [("reboot", "node2")],
            [("drain", "node2")],
        ), api.slurm.calls
    finally:
        api.client.close()


def test_a_newer_agents_report_is_accepted_and_its_new_fields_counted(tmp_path: Path) -> None:
    api = Api(tmp_path)
    before = metrics.UNKNOWN_FIELDS.labels("NodeReport")._value.get()  # type: ignore[attr-defined]
    try:
        body = recorded("v0.1.0", "report-faulty") | {"power_draw_w": 650, "schema": 2}
        resp = api.post("/v1/reports", body, who="node2")
        assert resp.status_code == 200, resp.text
        after = metrics.UNKNOWN_FIELDS.labels("NodeReport")._value.get()  # type: ignore[attr-defined]
        assert after == before + 2
    finally:
        api.client.close()
