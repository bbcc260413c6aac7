"""Config validation, mode 'none', and the munge client without a reachable munged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError, Identity
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.errors import ConfigError


def test_default_mode_is_munge() -> None:
    assert AuthConfig().mode == "munge"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "kerberos"}, "mode"),
        ({"mode": "token"}, "needs token_secret_file or token_key_file"),
        ({"max_skew_s": 0}, "max_skew_s"),
        ({"replay_cache_size": 3}, "replay_cache_size"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_config_rejects_bad_values(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AuthConfig.model_validate(fields)


def test_none_mode_warns_and_trusts_the_claim(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.auth.server"):
        server = ServerAuth(AuthConfig(mode="none"))
    assert "authentication is disabled" in caplog.text
    headers = ClientAuth(AuthConfig(mode="none"), "node3").headers("POST", "/v1/reports", b"")
    assert server.verify("POST", "/v1/reports", headers, b"") == Identity(
        uid=0, gid=0, node="node3", is_admin=True, method="none"
    )
    assert server.verify("GET", "/v1/status", {}, b"").node is None


def test_unknown_admin_group_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="auth.admin_group: no group named 'no-such-grp'"):
        ServerAuth(AuthConfig(mode="none", admin_group="no-such-grp"))


def test_munge_client_without_munged_fails_in_one_line(tmp_path: Path) -> None:
    client = ClientAuth(AuthConfig(munge_socket=tmp_path / "absent.sock"), "node1")
    with pytest.raises(AuthError, match="cannot create a MUNGE credential: .*absent.sock"):
        client.headers("GET", "/v1/status", b"")


def test_munge_server_wants_the_munge_scheme() -> None:
    server = ServerAuth(AuthConfig())
    with pytest.raises(AuthError, match="expected a MUNGE credential, got scheme 'HPTOKEN'"):
        server.verify("GET", "/v1/status", {"Authorization": "HPTOKEN x=y"}, b"")
    with pytest.raises(AuthError, match="empty MUNGE credential"):
        server.verify("GET", "/v1/status", {"Authorization": "MUNGE "}, b"")


def test_munge_server_without_munged_is_503(tmp_path: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=tmp_path / "absent.sock"))
    with pytest.raises(AuthError, match="cannot verify MUNGE credential") as info:
        server.verify("GET", "/v1/status", {"Authorization": "MUNGE MUNGE:abc:"}, b"")
    assert info.value.status == 503
