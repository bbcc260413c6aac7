"""``hyperpod auth``: the secret and derived keys work with the server side."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from hyperpod_agent.admin.keys import auth
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth


def test_secret_and_node_key_authenticate(tmp_path: Path) -> None:
    secret, key = tmp_path / "cluster.secret", tmp_path / "node2.key"
    runner = CliRunner()
    made = runner.invoke(auth, ["secret", str(secret)])
    assert made.exit_code == 0, made.output
    assert secret.stat().st_mode & 0o777 == 0o600
    derived = runner.invoke(
        auth, ["key", "--secret-file", str(secret), "--node", "node2", "--out", str(key)]
    )
    assert derived.exit_code == 0, derived.output
    assert key.stat().st_mode & 0o777 == 0o600
    server = ServerAuth(AuthConfig(mode="token", token_secret_file=secret))
    client = ClientAuth(AuthConfig(mode="token", token_key_file=key), "node2")
    ident = server.verify("POST", "/v1/reports", client.headers("POST", "/v1/reports", b"x"), b"x")
    assert ident.node == "node2"


def test_admin_key_printed(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("z" * 64)
    result = CliRunner().invoke(auth, ["key", "--secret-file", str(secret), "--admin"])
    assert result.exit_code == 0
    key = tmp_path / "admin.key"
    key.write_text(result.output)
    server = ServerAuth(AuthConfig(mode="token", token_secret_file=secret))
    client = ClientAuth(AuthConfig(mode="token", token_key_file=key))
    assert server.verify("GET", "/v1/nodes", client.headers("GET", "/v1/nodes", b""), b"").is_admin


def test_never_overwrites(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("keep")
    result = CliRunner().invoke(auth, ["secret", str(secret)])
    assert result.exit_code == 3
    assert result.output == f"hyperpod: error: {secret} exists; remove it first to replace it\n"
    assert secret.read_text() == "keep"


def test_needs_node_or_admin(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("z" * 64)
    for args in ([], ["--admin", "--node", "n1"]):
        result = CliRunner().invoke(auth, ["key", "--secret-file", str(secret), *args])
        assert result.exit_code == 2
        assert "give exactly one of --node NAME or --admin" in result.output


def test_short_secret_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("short")
    result = CliRunner().invoke(auth, ["key", "--secret-file", str(secret), "--admin"])
    assert result.exit_code == 3
    assert "secret is 5 bytes, expected at least 32" in result.output
