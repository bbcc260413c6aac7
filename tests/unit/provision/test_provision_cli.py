"""``hyperpod provision`` through click's CliRunner, and the committed schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from provision_support import tree

from hyperpod_agent.provision.cli import provision
from hyperpod_agent.provision.schema import schema_text

REPO = Path(__file__).resolve().parents[3]
SCHEMA_FILE = REPO / "lifecycle_scripts" / "provisioning_parameters.schema.json"

WriteParams = Callable[[dict[str, Any]], Path]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(provision, list(args))


def test_committed_schema_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "regenerate: hyperpod provision schema > lifecycle_scripts/provisioning_parameters."
        "schema.json"
    )


def test_schema_command_prints_it() -> None:
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["additionalProperties"] is False
    assert {"cluster_name", "controller", "worker_groups", "partitions"} <= set(schema["required"])
    # One of these two names the controllers; the model says which is missing.
    assert {"controller_url", "controller_urls", "controller_store"} <= set(schema["properties"])


def test_validate_ok(params: dict[str, Any], write_params: WriteParams) -> None:
    path = write_params(params)
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"{path}: valid: cluster test, controller 1, login 2, workers 6 (spares 1), mounts 0\n"
    )


def test_validate_lists_every_problem(params: dict[str, Any], write_params: WriteParams) -> None:
    params["bogus"] = 1
    params["cluster_name"] = "bad name"
    path = write_params(params)
    result = invoke("validate", str(path))
    assert result.exit_code == 3
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert f"hyperpod provision: error: {path}: bogus: unknown key" in lines
    assert any(
        line.startswith(f"hyperpod provision: error: {path}: cluster_name: ") for line in lines
    )


def test_validate_cross_field_problem(params: dict[str, Any], write_params: WriteParams) -> None:
    params["login_groups"][0]["nodes"] = ["node1"]
    path = write_params(params)
    result = invoke("validate", str(path))
    assert result.exit_code == 3
    assert result.output.splitlines() == [
        f"hyperpod provision: error: {path}: node node1 is in two groups: login group 'login' "
        "and worker group 'gpu'"
    ]


def test_plan_prints_role_and_steps(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    result = invoke(
        "plan",
        str(write_params(params)),
        "--node",
        "login1",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "login1: login (group login)"
    assert f"  file {prefix}/etc/hyperpod/admin.toml" in lines
    assert lines[-1] == "  verify: controller answers http://127.0.0.1:28899/v1/healthz"
    assert not prefix.exists()


def test_apply_twice_then_no_changes(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    args = [
        "apply",
        str(write_params(params)),
        "--node",
        "node2",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
        "--skip-verify",
    ]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert f"changed: file {prefix}/etc/hyperpod/agent.toml: create (mode 0644)" in first.output
    assert first.output.splitlines()[-1] == "node2: worker (group gpu): 17 of 18 steps changed"
    second = invoke(*args)
    assert second.exit_code == 0
    assert second.output == (
        "node2: worker (group gpu): no changes (18 steps already as desired)\n"
    )


def test_apply_dry_run_prints_diffs_and_writes_nothing(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    result = invoke(
        "apply",
        str(write_params(params)),
        "--node",
        "node2",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    assert f"+++ {prefix}/etc/hyperpod/agent.toml (desired)" in result.output
    assert '+node_name = "node2"' in result.output
    assert result.output.splitlines()[-1] == (
        "node2: worker (group gpu): 17 of 18 steps would change"
    )
    assert tree(prefix) == {}


def test_apply_invalid_params_writes_nothing(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    del params["controller"]
    path = write_params(params)
    result = invoke(
        "apply",
        str(path),
        "--node",
        "node2",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
    )
    assert result.exit_code == 3
    assert result.output == (
        f'hyperpod provision: error: {path}: no controller group: add "controller": '
        '{"nodes": [...]}\n'
    )
    assert not prefix.exists()


def test_apply_invalid_override_writes_nothing(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    params["agent_overrides"] = {"metrics": {"port": 99999}}
    path = write_params(params)
    result = invoke(
        "apply",
        str(path),
        "--node",
        "node2",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
    )
    assert result.exit_code == 3
    assert result.output.startswith(
        f"hyperpod provision: error: {path}: agent_overrides.metrics.port: Input should be less"
    )
    assert not prefix.exists()


def test_apply_failed_step_exit_code_and_message(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path
) -> None:
    (source / "systemd" / "hyperpod-agent.service").unlink()
    result = invoke(
        "apply",
        str(write_params(params)),
        "--node",
        "node2",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
        "--skip-verify",
    )
    assert result.exit_code == 6
    assert result.output.splitlines()[-1] == (
        f"hyperpod provision: error: node2: step 'file {prefix}/etc/systemd/system/"
        f"hyperpod-agent.service' failed: {source}/systemd/hyperpod-agent.service: no such file"
    )


def test_apply_needs_node_or_resource_config(
    params: dict[str, Any], write_params: WriteParams
) -> None:
    result = invoke("apply", str(write_params(params)))
    assert result.exit_code == 2
    assert "give exactly one of --node and --resource-config" in result.output


def test_apply_with_resource_config(
    params: dict[str, Any], write_params: WriteParams, source: Path, prefix: Path, tmp_path: Path
) -> None:
    resources = tmp_path / "resource_config.json"
    resources.write_text(
        json.dumps(
            {
                "instances": [
                    {"node_name": "node3", "instance_id": "i-0123"},
                    {"node_name": "node4", "instance_id": "i-0456"},
                ]
            }
        )
    )
    result = invoke(
        "apply",
        str(write_params(params)),
        "--resource-config",
        str(resources),
        "--instance-id",
        "i-0456",
        "--prefix",
        str(prefix),
        "--source",
        str(source),
        "--skip-install",
        "--skip-verify",
    )
    assert result.exit_code == 0, result.output
    assert 'node_name = "node4"' in (prefix / "etc/hyperpod/agent.toml").read_text()
    unknown = invoke(
        "apply",
        str(write_params(params)),
        "--resource-config",
        str(resources),
        "--instance-id",
        "i-9999",
        "--prefix",
        str(prefix),
    )
    assert unknown.exit_code == 3
    assert "no instance matches this machine (instance id i-9999" in unknown.output
