"""``hyperpod provision``: validate parameters, show a node's plan, apply it."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import click

from hyperpod_agent.provision.load import load_parameters, load_resource_config
from hyperpod_agent.provision.models import ProvisionError, ProvisioningParameters
from hyperpod_agent.provision.schema import schema_text

FILE = click.Path(path_type=Path, dir_okay=False)
DIR = click.Path(path_type=Path, file_okay=False)
DMI_ASSET_TAG = Path("/sys/devices/virtual/dmi/id/board_asset_tag")


def _fail(exc: ProvisionError) -> None:
    for line in exc.problems:
        click.echo(f"hyperpod provision: error: {line}", err=True)
    sys.exit(exc.exit_code)


def _load(path: Path) -> ProvisioningParameters:
    try:
        return load_parameters(path)
    except ProvisionError as exc:
        _fail(exc)
        raise  # unreachable: _fail exits


@click.group("provision")
def provision() -> None:
    """Provision a node from provisioning_parameters.json (idempotent)."""


@provision.command()
@click.argument("params_file", type=FILE)
def validate(params_file: Path) -> None:
    """Check the parameters; list every problem, one per line."""
    params = _load(params_file)
    counts = {kind: 0 for kind in ("controller", "login", "worker")}
    for kind, group in params.groups():
        counts[kind] += len(group.nodes)
    click.echo(
        f"{params_file}: valid: cluster {params.cluster_name}, controller {counts['controller']}, "
        f"login {counts['login']}, workers {counts['worker']} "
        f"(spares {len(params.spare_nodes())}), mounts {len(params.mounts)}"
    )


def _options(
    prefix: Path | None,
    source: Path | None,
    skip_install: bool,
    package: str | None,
    verify_timeout: float,
) -> object:
    from hyperpod_agent.provision.plan import Options, default_source

    return Options(
        prefix=prefix.resolve() if prefix else None,
        source=(source or default_source()).resolve(),
        skip_install=skip_install,
        package=package,
        verify_timeout_s=verify_timeout,
    )


def _common(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(
        [
            click.option(
                "--prefix",
                type=DIR,
                default=None,
                help="Install under DIR instead of / (no systemctl, no mount).",
            ),
            click.option(
                "--source",
                type=DIR,
                default=None,
                help="The hyperpod-agent repository (systemd/, spank_plugin/). "
                "[default: where this package was installed from]",
            ),
            click.option(
                "--skip-install", is_flag=True, help="Do not create the venv or pip install."
            ),
            click.option(
                "--package",
                default=None,
                help="pip requirement or wheel to install [default: the source directory]",
            ),
            click.option(
                "--verify-timeout",
                type=click.FloatRange(1, 3600),
                default=120.0,
                show_default=True,
                help="Seconds the final checks may wait.",
            ),
        ]
    ):
        func = option(func)
    return func


@provision.command()
@click.argument("params_file", type=FILE)
@click.option("--node", required=True, help="The node to plan for.")
@_common
def plan(
    params_file: Path,
    node: str,
    prefix: Path | None,
    source: Path | None,
    skip_install: bool,
    package: str | None,
    verify_timeout: float,
) -> None:
    """Show the node's role and the steps that provision it (changes nothing)."""
    from hyperpod_agent.provision.plan import build_plan

    params = _load(params_file)
    try:
        the_plan = build_plan(
            params,
            node,
            _options(  # type: ignore[arg-type]
                prefix, source, skip_install, package, verify_timeout
            ),
        )
    except ProvisionError as exc:
        _fail(exc)
        return
    click.echo(f"{node}: {the_plan.role}")
    for step in the_plan.steps:
        click.echo(f"  {step.name}")
    for check in the_plan.checks:
        click.echo(f"  {check.name}")


def _this_node(resource_config: Path, instance_id: str | None) -> str:
    config = load_resource_config(resource_config)
    if instance_id is None:
        try:
            tag = DMI_ASSET_TAG.read_text().strip()
        except OSError:
            tag = ""
        instance_id = tag if tag.startswith("i-") else None
    hostname = socket.gethostname().split(".")[0]
    try:
        addresses = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        addresses = set()
    return config.resolve(instance_id=instance_id, hostname=hostname, addresses=addresses)


@provision.command()
@click.argument("params_file", type=FILE)
@click.option("--node", default=None, help="This node's name.")
@click.option(
    "--resource-config",
    type=FILE,
    default=None,
    help="resource_config.json: find this node's name by instance id or host name.",
)
@click.option("--instance-id", default=None, help="This machine's id in the resource config.")
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
@click.option("--skip-verify", is_flag=True, help="Do not run the final checks.")
@_common
def apply(
    params_file: Path,
    node: str | None,
    resource_config: Path | None,
    instance_id: str | None,
    dry_run: bool,
    skip_verify: bool,
    prefix: Path | None,
    source: Path | None,
    skip_install: bool,
    package: str | None,
    verify_timeout: float,
) -> None:
    """Provision this node; a second run changes nothing and says so."""
    from hyperpod_agent.provision.apply import apply_plan
    from hyperpod_agent.provision.plan import build_plan

    if (node is None) == (resource_config is None):
        raise click.UsageError("give exactly one of --node and --resource-config")
    params = _load(params_file)
    try:
        if node is None:
            assert resource_config is not None
            node = _this_node(resource_config, instance_id)
        the_plan = build_plan(
            params,
            node,
            _options(  # type: ignore[arg-type]
                prefix, source, skip_install, package, verify_timeout
            ),
        )
        result = apply_plan(the_plan, dry_run=dry_run, verify=not skip_verify)
    except ProvisionError as exc:
        _fail(exc)
        return
    for outcome in result.outcomes:
        if outcome.status == "unchanged":
            continue
        detail = outcome.change.summary if outcome.change else outcome.error
        click.echo(f"{outcome.status}: {outcome.name}: {detail}")
        if dry_run and outcome.change and outcome.change.diff:
            click.echo(outcome.change.diff.rstrip("\n"))
    click.echo(result.summary())
    for name, line in result.checks:
        click.echo(f"ok: {name}: {line}")


@provision.command()
def schema() -> None:
    """Print the JSON Schema of provisioning_parameters.json."""
    click.echo(schema_text(), nl=False)
