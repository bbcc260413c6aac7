"""Several head nodes: controller_store, controller_urls, and what each node gets.

A single head node must get exactly the files it got before these keys existed; the
first tests pin those files byte for byte.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import tomllib
from collections.abc import Callable, Iterator
from http.server import HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from provision_support import Healthz, base_params, problems

from hyperpod_agent.admin.config import AdminConfig
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.provision.apply import apply_plan
from hyperpod_agent.provision.cli import provision
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import StepFailed
from hyperpod_agent.provision.plan import Options, Plan, build_plan
from hyperpod_agent.provision.steps import File

SRC = "params.json"
HEADER = "# Written by `hyperpod provision` from provisioning_parameters.json; edits are replaced."
STORE_URL = "postgresql://hyperpod@db.example:5432/hyperpod"
WriteParams = Callable[[dict[str, Any]], Path]


def single(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(base_params())
    data["controller_url"] = "http://head:8787"
    data.update(changes)
    return data


def two_heads(
    password_file: str = "/etc/hyperpod/store.password", **changes: Any
) -> dict[str, Any]:
    """head1 and head2 on one PostgreSQL store."""
    data = copy.deepcopy(base_params())
    del data["controller_url"]
    data["controller"] = {"nodes": "head[1-2]"}
    data["controller_urls"] = ["http://head1:8787", "http://head2:8787"]
    data["controller_store"] = {"url": STORE_URL, "password_file": password_file}
    data.update(changes)
    return data


def plan(
    data: dict[str, Any],
    node: str,
    prefix: Path | None = None,
    source: Path = Path("/src"),
    **kw: Any,
) -> Plan:
    params = parse_parameters(data, SRC)
    options = Options(prefix=prefix, source=source, skip_install=True, **kw)
    return build_plan(params, node, options)


def files(p: Plan) -> dict[str, str]:
    """name of each TOML file written -> its text."""
    return {
        s.path.name: s.desired(None).decode()
        for s in p.steps
        if isinstance(s, File) and s.path.suffix == ".toml"
    }


# --- one head node: unchanged ---------------------------------------------------------------

OVERRIDES = {
    "agent_overrides": {"controller": {"heartbeat_interval_s": 15}},
    "controller_overrides": {"auth": {"mode": "none"}, "policy": {"max_unhealthy_fraction": 0.2}},
}
SINGLE_CONTROLLER_TOML = f"""{HEADER}
listen_host = "0.0.0.0"
listen_port = 8787
state_db = "/var/lib/hyperpod/controller.db"
slurm_conf = "/etc/slurm/slurm.conf"

[auth]
mode = "none"

[policy]
max_unhealthy_fraction = 0.2
"""
SINGLE_ADMIN_TOML = f"""{HEADER}

[controller]
url = "http://head:8787"

[auth]
mode = "none"
"""
SINGLE_AGENT_TOML = f"""{HEADER}
node_name = "node1"
cache_path = "/run/hyperpod/health.json"
state_dir = "/run/hyperpod"
auto_resume_markers = "/var/lib/hyperpod/autoresume"

[controller]
url = "http://head:8787"
heartbeat_interval_s = 15

[probes.gpu]
expected_count = 8
"""


def test_single_head_files_are_byte_identical() -> None:
    data = single(**OVERRIDES)
    assert files(plan(data, "head")) == {
        "controller.toml": SINGLE_CONTROLLER_TOML,
        "admin.toml": SINGLE_ADMIN_TOML,
    }
    assert files(plan(data, "login1")) == {"admin.toml": SINGLE_ADMIN_TOML}
    # workers get admin.toml too: the step-retry helper of a job finds the controller there
    assert files(plan(data, "node1")) == {
        "agent.toml": SINGLE_AGENT_TOML,
        "admin.toml": SINGLE_ADMIN_TOML,
    }
    assert [c.name for c in plan(data, "head").checks] == [
        "verify: controller answers http://head:8787/v1/healthz"
    ]
    assert len(plan(data, "head").steps) == 24


def test_one_url_in_a_list_is_the_single_form() -> None:
    data = single(**OVERRIDES)
    del data["controller_url"]
    data["controller_urls"] = ["http://head:8787"]
    assert files(plan(data, "head"))["admin.toml"] == SINGLE_ADMIN_TOML
    assert files(plan(data, "node1"))["agent.toml"] == SINGLE_AGENT_TOML


# --- parameters ------------------------------------------------------------------------------


def test_two_heads_with_a_store_are_valid() -> None:
    params = parse_parameters(two_heads(), SRC)
    assert params.controller.nodes == ["head1", "head2"]
    assert params.urls() == ("http://head1:8787", "http://head2:8787")
    assert params.controller_store is not None
    assert params.controller_store.url == STORE_URL


@pytest.mark.parametrize(
    ("missing", "why"),
    [
        (
            "controller_store",
            "controller.nodes: 2 controller nodes need controller_store (a PostgreSQL database "
            "they share; SQLite cannot be shared)",
        ),
        (
            "controller_urls",
            "no controller URL: add controller_url, or controller_urls with one URL per "
            "controller node",
        ),
    ],
)
def test_two_heads_without(missing: str, why: str) -> None:
    data = two_heads()
    del data[missing]
    assert problems(data) == [f"params.json: {why}"]


def test_url_and_urls_together() -> None:
    assert problems(two_heads(controller_url="http://head1:8787")) == [
        "params.json: set controller_url or controller_urls, not both"
    ]


@pytest.mark.parametrize(
    ("urls", "why"),
    [
        (["http://head1:8787"], "controller_urls: 2 controller nodes need one URL each, got 1"),
        (
            ["http://head1:8787", "http://head1:8787/"],
            "controller_urls: http://head1:8787 is listed twice",
        ),
        (
            ["http://head1:8787", "http://head2"],
            "controller_urls[1]: 'http://head2' needs an explicit port, e.g. http://head:8787",
        ),
    ],
)
def test_controller_urls(urls: list[str], why: str) -> None:
    assert problems(two_heads(controller_urls=urls)) == [f"params.json: {why}"]


def test_one_controller_node_takes_one_url() -> None:
    data = single(controller_urls=["http://head:8787", "http://head-b:8787"])
    del data["controller_url"]
    assert problems(data) == [
        "params.json: controller_urls: 1 controller node needs one URL, got 2"
    ]


def test_empty_url_list() -> None:
    data = single(controller_urls=[])
    del data["controller_url"]
    (line,) = problems(data)
    assert line.startswith("params.json: controller_urls: List should have at least 1 item")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (
            "postgresql://hyperpod:secret@db:5432/hyperpod",
            "the URL must not carry a password; put it in password_file",
        ),
        ("mysql://hyperpod@db/hyperpod", "must be postgresql://user@host:port/database"),
        (
            "sqlite:///var/lib/hyperpod/controller.db",
            "must be postgresql://user@host:port/database: SQLite is the default without "
            "controller_store",
        ),
        (
            "postgresql://db:5432/hyperpod",
            "a PostgreSQL store is postgresql://user@host:port/database",
        ),
        (
            "postgresql://hyperpod@db:5432/",
            "the URL must name one database: postgresql://user@host:port/database",
        ),
        (
            "postgresql://hyperpod@db:5432/hp?user=x",
            "unsupported URL parameter 'user' (only sslmode)",
        ),
    ],
)
def test_bad_store_url(url: str, why: str) -> None:
    data = two_heads()
    data["controller_store"]["url"] = url
    (line,) = problems(data)
    assert line == f"params.json: controller_store.url: {why}"
    assert "secret" not in line


def test_relative_password_file() -> None:
    assert problems(two_heads(password_file="store.password")) == [
        "params.json: controller_store.password_file: must be an absolute path, "
        "got 'store.password'"
    ]


@pytest.mark.parametrize(
    ("path", "setting"),
    [
        ("/root/store.password", "ProtectHome=yes"),
        ("/home/admin/pw", "ProtectHome=yes"),
        ("/run/user/0/pw", "ProtectHome=yes"),
        ("/tmp/pw", "PrivateTmp=yes"),
    ],
)
def test_password_file_hidden_from_the_controller_unit(path: str, setting: str) -> None:
    assert problems(two_heads(password_file=path)) == [
        f"params.json: controller_store.password_file: {path} is hidden from "
        f"hyperpod-controller.service ({setting}); put it under /etc/hyperpod"
    ]


def test_store_without_password_file() -> None:
    data = two_heads()
    del data["controller_store"]["password_file"]
    params = parse_parameters(data, SRC)
    assert params.controller_store is not None
    assert params.controller_store.password_file is None


def test_lease_timing_is_checked() -> None:
    data = two_heads()
    data["controller_store"].update(lease_ttl_s=4, renew_every_s=2)
    assert problems(data) == [
        "params.json: controller_store: lease_ttl_s (4) must be more than twice renew_every_s (2)"
    ]
    data["controller_store"] = {"url": STORE_URL, "renew_every_s": 5}  # default ttl 4
    assert problems(data) == [
        "params.json: controller_store: lease_ttl_s (4) must be more than twice renew_every_s (5)"
    ]


def test_lease_timing_with_one_controller_node() -> None:
    data = single(controller_store={"url": STORE_URL, "lease_ttl_s": 10})
    assert problems(data) == [
        "params.json: controller_store.lease_ttl_s: applies only with more than one "
        "controller node (one node runs a single controller)"
    ]


def test_unknown_key_in_controller_store() -> None:
    data = two_heads()
    data["controller_store"]["password"] = "x"
    assert problems(data) == ["params.json: controller_store.password: unknown key"]


@pytest.mark.parametrize("key", ["store", "store_password_file", "ha"])
def test_overrides_may_not_set_what_controller_store_sets(key: str) -> None:
    value: Any = {"enabled": True} if key == "ha" else "/x"
    data = two_heads(controller_overrides={key: value})
    assert problems(data) == [
        f"params.json: controller_overrides.{key}: set by controller_store; remove it here"
    ]


# --- what each node gets ---------------------------------------------------------------------


def test_each_head_differs_only_in_controller_id() -> None:
    data = two_heads(controller_overrides={"auth": {"mode": "none"}})
    data["controller_store"].update(lease_ttl_s=9, renew_every_s=3)
    one, two = (files(plan(data, n))["controller.toml"] for n in ("head1", "head2"))
    assert one.replace('"head1:8787"', '"head2:8787"') == two
    assert one != two
    config = ControllerConfig.model_validate(tomllib.loads(one))
    assert config.ha.enabled and config.controller_id() == "head1:8787"
    assert (config.ha.lease_ttl_s, config.ha.renew_every_s) == (9, 3)
    assert config.store == STORE_URL
    assert config.store_password_file == Path("/etc/hyperpod/store.password")
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 8787)


def test_one_head_with_a_store_is_a_single_controller_on_postgresql() -> None:
    data = single(controller_store={"url": STORE_URL, "password_file": "/etc/hyperpod/pw"})
    text = files(plan(data, "head"))["controller.toml"]
    config = ControllerConfig.model_validate(tomllib.loads(text))
    assert config.store == STORE_URL and not config.ha.enabled
    assert "[ha]" not in text


def test_clients_get_every_controller() -> None:
    data = two_heads()
    urls = ["http://head1:8787", "http://head2:8787"]
    agent = AgentConfig.model_validate(tomllib.loads(files(plan(data, "node1"))["agent.toml"]))
    assert agent.controller.urls == urls and agent.controller.url == ""
    for node in ("login1", "head2"):
        admin = tomllib.loads(files(plan(data, node))["admin.toml"])
        assert admin["controller"] == {"urls": urls}
        assert AdminConfig.model_validate(admin).controller.urls == urls


def test_verify_names_every_controller() -> None:
    (check,) = plan(two_heads(), "login1").checks
    assert check.name == (
        "verify: a controller answers http://head1:8787/v1/healthz or http://head2:8787/v1/healthz"
    )


def test_head_checks_its_password_file_before_writing_its_config() -> None:
    names = [s.name for s in plan(two_heads(), "head1").steps]
    check = names.index("secret /etc/hyperpod/store.password")
    assert check < names.index("file /etc/hyperpod/controller.toml")
    assert not any(
        n.startswith("secret ") for n in (s.name for s in plan(two_heads(), "login1").steps)
    )


# --- applying on a head node ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def head_prefix(prefix: Path) -> Path:
    """A head node's tree under ``prefix`` before provisioning; where its password goes."""
    (prefix / "etc/slurm").mkdir(parents=True)
    (prefix / "etc/slurm/slurm.conf").write_text("ClusterName=test\n")
    (prefix / "etc/hyperpod").mkdir(parents=True)
    return prefix / "etc/hyperpod/store.password"


def test_apply_on_a_head_with_its_password_file(prefix: Path, source: Path) -> None:
    secret = head_prefix(prefix)
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    params = parse_parameters(two_heads(), SRC)
    options = Options(prefix=prefix, source=source, skip_install=True)
    result = apply_plan(build_plan(params, "head2", options), verify=False)
    secret_outcome = next(o for o in result.outcomes if o.name == f"secret {secret}")
    assert secret_outcome.status == "unchanged"
    config = ControllerConfig.model_validate(
        tomllib.loads((prefix / "etc/hyperpod/controller.toml").read_text())
    )
    assert config.controller_id() == "head2:8787"
    assert config.store_password_file == secret  # inside the prefix, like the rest
    assert secret.read_text() == "s3cret\n" and secret.stat().st_mode & 0o777 == 0o600
    secret.chmod(0o400)
    again = apply_plan(build_plan(params, "head2", options), verify=False)
    assert again.changed == []


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (
            None,
            "no such file (controller_store.password_file: create it, mode 0600, on every "
            "controller node)",
        ),
        (0o644, "mode 0644, expected 0600 or 0400 (controller_store.password_file)"),
        (0o700, "mode 0700, expected 0600 or 0400 (controller_store.password_file)"),
    ],
)
def test_apply_stops_at_a_bad_password_file(
    mode: int | None, why: str, prefix: Path, source: Path
) -> None:
    secret = head_prefix(prefix)
    if mode is not None:
        secret.write_text("s3cret\n")
        secret.chmod(mode)
    data = two_heads()
    with pytest.raises(StepFailed) as info:
        apply_plan(plan(data, "head1", prefix, source=source), verify=False)
    assert str(info.value) == f"head1: step 'secret {secret}' failed: {secret}: {why}"
    assert not (prefix / "etc/hyperpod/controller.toml").exists()
    # Provisioning never creates or touches the secret.
    assert (secret.stat().st_mode & 0o777 if secret.exists() else None) == mode


def test_a_directory_is_no_password_file(prefix: Path, source: Path) -> None:
    secret = head_prefix(prefix)
    secret.mkdir(mode=0o700)
    secret.chmod(0o600)
    with pytest.raises(StepFailed, match=r"store\.password: not a regular file, expected 0600"):
        apply_plan(plan(two_heads(), "head1", prefix, source), verify=False)


def test_verify_passes_when_any_controller_answers(prefix: Path, source: Path) -> None:
    dead = HTTPServer(("127.0.0.1", 0), Healthz)
    port = dead.server_port
    dead.server_close()  # 127.0.0.1:port: nothing listens there
    live = HTTPServer(("127.0.0.2", port), Healthz)
    thread = threading.Thread(target=live.serve_forever, daemon=True)
    thread.start()
    try:
        data = two_heads(controller_urls=[f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"])
        result = apply_plan(plan(data, "login1", prefix, source=source))
    finally:
        live.shutdown()
        live.server_close()
    ((name, line),) = result.checks
    assert line == f"http://127.0.0.2:{port}/v1/healthz: HTTP 200"


def test_verify_fails_when_no_controller_answers(prefix: Path, source: Path) -> None:
    dead = HTTPServer(("127.0.0.1", 0), Healthz)
    port = dead.server_port
    dead.server_close()
    data = two_heads(controller_urls=[f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"])
    with pytest.raises(StepFailed) as info:
        apply_plan(
            plan(data, "login1", prefix, source=source, verify_timeout_s=0.2),
            sleep=lambda s: None,
        )
    text = str(info.value)
    assert f"http://127.0.0.1:{port}/v1/healthz: " in text
    assert f"; http://127.0.0.2:{port}/v1/healthz: " in text
    assert text.endswith("(still failing after 0.2 s)")


# --- the command ------------------------------------------------------------------------------


def invoke(*args: str) -> Any:
    return CliRunner().invoke(provision, list(args))


def test_cli_validate_and_plan_two_heads(write_params: WriteParams, prefix: Path) -> None:
    path = write_params(two_heads())
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{path}: valid: cluster test, controller 2, login 2,")
    result = invoke("plan", str(path), "--node", "head2", "--prefix", str(prefix), "--skip-install")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "head2: controller (group controller)"
    assert f"  secret {prefix}/etc/hyperpod/store.password" in lines
    assert lines[-1] == (
        "  verify: a controller answers http://head1:8787/v1/healthz or "
        "http://head2:8787/v1/healthz"
    )
    assert not prefix.exists()


def test_cli_two_heads_without_a_store(write_params: WriteParams, prefix: Path) -> None:
    data = two_heads()
    del data["controller_store"]
    path = write_params(data)
    result = invoke("apply", str(path), "--node", "head1", "--prefix", str(prefix))
    assert result.exit_code == 3
    assert result.output == (
        f"hyperpod provision: error: {path}: controller.nodes: 2 controller nodes need "
        "controller_store (a PostgreSQL database they share; SQLite cannot be shared)\n"
    )
    assert not prefix.exists()


@pytest.mark.parametrize(
    ("doc", "after"),
    [
        ("docs/controller.md", "**Provisioning a standby.**"),
        ("lifecycle_scripts/README.md", "## Several head nodes"),
    ],
)
def test_documented_parameters_are_valid(doc: str, after: str) -> None:
    text = (Path(__file__).resolve().parents[3] / doc).read_text()
    block = text.split(after, 1)[1].split("```json\n", 1)[1].split("```", 1)[0].strip()
    example = json.loads(block if block.startswith("{") else "{" + block + "}")
    data = copy.deepcopy(base_params())
    del data["controller_url"]
    data.update(example)
    params = parse_parameters(data, SRC)
    assert len(params.controller.nodes) == len(params.urls()) == 2
    assert params.controller_store is not None


def test_each_head_listens_on_its_own_urls_port() -> None:
    """controller_urls pairs with controller.nodes: two heads on one host (or behind
    one name) need two ports, and each controller.toml names its own."""
    data = two_heads(controller_urls=["http://head1:8787", "http://head2:8788"])
    one = tomllib.loads(files(plan(data, "head1"))["controller.toml"])
    two = tomllib.loads(files(plan(data, "head2"))["controller.toml"])
    assert (one["listen_port"], two["listen_port"]) == (8787, 8788)
    assert (one["ha"]["controller_id"], two["ha"]["controller_id"]) == ("head1:8787", "head2:8788")
