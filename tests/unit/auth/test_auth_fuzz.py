"""No Authorization header, however malformed, makes token verification fail other
than with a 4xx AuthError (a crash there is a 500 for the caller)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError
from hyperpod_agent.auth.server import ServerAuth

NOW = 1_800_000_000.0
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# HTTP header values reach us decoded as latin-1: any of these 256 characters.
LATIN1 = st.characters(min_codepoint=0, max_codepoint=255)
VALUE = st.text(LATIN1, max_size=80) | st.sampled_from(
    [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e400",
        "9" * 400,
        f"{NOW:.3f}",
        "ab" * 16,
        "00" * 32,
        "\u00e9" * 64,
        "node1",
        "admin",
        "",
    ]
)
FIELD = st.tuples(st.sampled_from(["node", "role", "ts", "nonce", "sig", "x", ""]), VALUE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerAuth:
    secret = tmp_path_factory.mktemp("fuzz") / "secret"
    secret.write_text("s" * 48)
    return ServerAuth(AuthConfig(mode="token", token_secret_file=secret), clock=lambda: NOW)


@pytest.fixture(scope="module")
def signed(server: ServerAuth) -> str:
    assert server.config.token_secret_file is not None
    config = AuthConfig(mode="token", token_secret_file=server.config.token_secret_file)
    return ClientAuth(config, clock=lambda: NOW).headers("GET", "/v1/status", b"")["Authorization"]


def _verify(server: ServerAuth, value: str) -> None:
    try:
        server.verify("GET", "/v1/status", {"Authorization": value}, b"")
    except AuthError as exc:
        assert 400 <= exc.status < 500, (value, exc.status, str(exc))


@FUZZ
@given(value=st.text(LATIN1, max_size=300))
def test_any_header_text_is_4xx(server: ServerAuth, value: str) -> None:
    _verify(server, value)


@FUZZ
@given(fields=st.lists(FIELD, max_size=7), scheme=st.sampled_from(["HPTOKEN", "hptoken", "X"]))
def test_any_token_fields_are_4xx(
    server: ServerAuth, fields: list[tuple[str, str]], scheme: str
) -> None:
    _verify(server, scheme + " " + " ".join(f"{k}={v}" for k, v in fields))


@FUZZ
@given(index=st.integers(0, 4), value=VALUE)
def test_a_signed_header_with_one_field_changed_is_4xx(
    server: ServerAuth, signed: str, index: int, value: str
) -> None:
    parts = signed.split(" ")
    key = parts[1 + index].split("=", 1)[0] if index < 4 else "extra"
    if index < 4:
        parts[1 + index] = f"{key}={value}"
    else:
        parts.append(f"{key}={value}")
    _verify(server, " ".join(parts))
