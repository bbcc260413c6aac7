"""No input makes the API answer 5xx: hypothesis-generated bodies, paths and queries
against every route in the published OpenAPI schema."""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from ctl_helpers import FakeSlurm, cluster, config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
REPORT_KEYS = [
    "node",
    "agent_id",
    "seq",
    "generated_at",
    "verdict",
    "action",
    "urgent",
    "message",
    "results",
    "jobs_opted_in",
    "bogus",
]
BEAT_KEYS = ["node", "agent_id", "seq", "sent_at", "bogus"]
VALUES = JSON | st.sampled_from(
    [
        "node1",
        "2026-01-01T00:00:00Z",
        "faulty",
        "REBOOT",
        -1,
        2**70,
        "",
        "x" * 300,
        "drain",
        "replace",
    ]
)


def shaped(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with tempfile.TemporaryDirectory() as tmp:
        slurm = FakeSlurm(cluster(3))
        cfg = config(auth={"mode": "none"})
        controller = Controller(cfg, Store(Path(tmp) / "s.db"), slurm, SparePoolProvider(slurm))
        controller.reconcile_once()
        with TestClient(
            create_app(controller, ServerAuth(AuthConfig(mode="none"))),
            raise_server_exceptions=False,
        ) as c:
            yield c


FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(
    path=st.sampled_from(
        ["/v1/reports", "/v1/heartbeats", "/v1/nodes/node1/actions", "/v1/nodes/%00/actions"]
    ),
    body=JSON | shaped(REPORT_KEYS) | shaped(BEAT_KEYS) | shaped(["action", "reason", "x"]),
)
def test_post_bodies_never_5xx(client: TestClient, path: str, body: Any) -> None:
    resp = client.post(
        path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        assert set(resp.json()) == {"error"}


@FUZZ
@given(raw=st.binary(max_size=200))
def test_raw_bytes_never_5xx(client: TestClient, raw: bytes) -> None:
    resp = client.post("/v1/reports", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code < 500 and set(resp.json()) == {"error"}


SEGMENT = st.text(min_size=1, max_size=30).filter(
    lambda s: "/" not in s and "?" not in s and "#" not in s
)


@FUZZ
@given(
    template=st.sampled_from(
        [
            "/v1/nodes/{}",
            "/v1/jobs/{}",
            "/v1/events?since={}",
            "/v1/events?limit={}",
            "/v1/events?node={}",
            "/v1/{}",
            "/{}",
            "/v1/status?{}",
        ]
    ),
    value=SEGMENT | st.integers().map(str),
)
def test_get_paths_and_queries_never_5xx(client: TestClient, template: str, value: str) -> None:
    resp = client.get(template.format(quote(value, safe="")))
    assert resp.status_code < 500, resp.text


def test_every_schema_route_answers_without_5xx(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path, methods in schema["paths"].items():
        concrete = path.replace("{name}", "node1").replace("{job_id}", "1")
        for method in methods:
            resp = client.request(
                method.upper(),
                concrete,
                content=b"{}",
                headers={"content-type": "application/json"},
            )
            assert resp.status_code < 500, (method, path, resp.text)


@pytest.fixture(scope="module")
def token_client() -> Iterator[TestClient]:
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "secret"
        secret.write_text("s" * 48)
        auth = {"mode": "token", "token_secret_file": str(secret)}
        slurm = FakeSlurm(cluster(3))
        controller = Controller(
            config(auth=auth), Store(Path(tmp) / "s.db"), slurm, SparePoolProvider(slurm)
        )
        app = create_app(controller, ServerAuth(AuthConfig.model_validate(auth)))
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


# Header values travel as latin-1: any of its characters but CR, LF and NUL.
HEADER_TEXT = st.text(
    st.characters(min_codepoint=1, max_codepoint=255, blacklist_characters="\r\n"), max_size=200
)


WORD = st.text(
    st.characters(min_codepoint=33, max_codepoint=255, blacklist_characters="\x7f"),
    min_size=1,
    max_size=70,
)
TOKEN = st.builds(
    "HPTOKEN {} ts={} nonce={} sig={}".format,
    st.sampled_from(["node=node1", "role=admin", "node=n\u00e9"]),
    st.sampled_from(["1800000000.000", "nan", "inf", "1e999"]) | WORD,
    st.sampled_from(["ab" * 16]) | WORD,
    st.sampled_from(["00" * 32]) | WORD,
)


@FUZZ
@given(
    value=HEADER_TEXT
    | TOKEN
    | st.builds(lambda rest: "HPTOKEN " + rest, HEADER_TEXT)
    | st.builds(lambda rest: "MUNGE " + rest, HEADER_TEXT),
    path=st.sampled_from(["/v1/status", "/v1/reports", "/v1/nodes/node1/actions"]),
)
def test_any_authorization_header_is_4xx_through_the_app(
    token_client: TestClient, value: str, path: str
) -> None:
    headers = {"authorization": value.encode("latin-1")}
    method = "GET" if path == "/v1/status" else "POST"
    resp = token_client.request(method, path, content=b"{}", headers=headers)
    assert 400 <= resp.status_code < 500, resp.text
    assert set(resp.json()) == {"error"}
