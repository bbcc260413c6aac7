"""``hyperpod status|nodes|node|events|jobs|goodput``: the admin CLI, a thin client of the API.

Every read takes ``--json`` (the controller's answer, unchanged); otherwise a human
table. Errors are one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import getpass
import os
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hyperpod_agent.admin import goodput as goodput_text
from hyperpod_agent.admin import render
from hyperpod_agent.admin.checks_cli import node_check
from hyperpod_agent.admin.common import (
    EVENT_KIND,
    MAX_REASON,
    NODE_NAME,
    _emit,
    _node_name,
    _now,
    _obj,
    _rows,
    connection_options,
    json_option,
    make_client,
    one_line_errors,
)
from hyperpod_agent.client import ACTIONS
from hyperpod_agent.errors import HyperpodError


@click.command()
@connection_options
@json_option
@one_line_errors
def status(
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Cluster summary: nodes by state and verdict, faults, incident mode; with
    several controllers, which one leads and how each one is."""
    client = make_client(url, munge_socket, config_file, timeout)
    doc = client.status()
    if len(client.urls) > 1 and isinstance(doc, dict):
        doc = {**doc, "controllers": client.controllers()}
    _emit(doc, as_json, lambda d: render.status_text(_obj(d), _now()))


@click.command()
@connection_options
@json_option
@one_line_errors
def nodes(
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Every node with its Slurm state, verdict and last report."""
    doc = make_client(url, munge_socket, config_file, timeout).nodes()
    _emit(doc, as_json, lambda d: render.nodes_table(_rows(d), _now()))


@click.group()
def node() -> None:
    """Show one node or ask the controller to act on it."""


@node.command("show")
@click.argument("name", callback=_node_name)
@connection_options
@json_option
@one_line_errors
def node_show(
    name: str,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """A node's state, open faults and recent actions."""
    doc = make_client(url, munge_socket, config_file, timeout).node(name)
    _emit(doc, as_json, lambda d: render.node_detail(_obj(d), _now()))


def _check_reason(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and len(value) > MAX_REASON:
        raise click.BadParameter(f"at most {MAX_REASON} characters (got {len(value)})")
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty")
    return value


def _action_command(action: str, help_text: str) -> click.Command:
    @click.command(action, help=help_text)
    @click.argument("name", callback=_node_name)
    @click.option(
        "--reason", callback=_check_reason, help="Why (recorded in the event log and in Slurm)."
    )
    @connection_options
    @json_option
    @one_line_errors
    def command(
        name: str,
        reason: str | None,
        url: str | None,
        munge_socket: Path | None,
        config_file: Path | None,
        timeout: float | None,
        as_json: bool,
        no_check: bool = False,
    ) -> None:
        why = reason or f"requested by {getpass.getuser()}"
        client = make_client(url, munge_socket, config_file, timeout)
        # only a --no-check is sent: without it the controller decides (its gate)
        doc = client.action(name, action, why, check=False if no_check else None)
        _emit(doc, as_json, lambda d: _accepted(action, name, _obj(d)))

    if action == "resume":
        command = click.option(
            "--no-check",
            is_flag=True,
            help="Resume at once, without the deep check the re-entry gate asks for first.",
        )(command)
    return command


def _accepted(action: str, name: str, doc: dict[str, Any]) -> str:
    text = f"{action} {name}: accepted as action {doc.get('action_id', '?')}"
    if doc.get("reason"):
        text += f" ({doc['reason']})"
    if doc.get("dry_run"):
        text += " [dry run: the controller will change nothing]"
    return text


_HELP = {
    "drain": "Drain NAME: no new jobs; running jobs finish.",
    "resume": "Resume NAME if the controller drained it; with deep-check gates on "
    "(docs/deep-checks.md), once it passed a deep check.",
    "reboot": "Drain NAME and reboot it when idle.",
    "replace": "Take NAME out of service and bring in a replacement.",
}
for _action in ACTIONS:
    node.add_command(_action_command(_action, _HELP[_action]))


class SinceType(click.ParamType[datetime, Any]):
    """``10m``, ``2h``, ``1d`` or an ISO 8601 time."""

    name = "since"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return render.parse_since(str(value), _now())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.option("--since", type=SinceType(), help="Only events after this: 10m, 2h, 1d or ISO.")
@click.option("--node", "node_name", help="Only events about this node.")
@click.option("--job", "job_id", type=click.IntRange(1), help="Only events about this job.")
@click.option("--limit", type=click.IntRange(1, 1000), help="At most this many events.")
@click.option("--kind", help="Only events of this kind (would_have, drain, requeue, ...).")
@connection_options
@json_option
@one_line_errors
def events(
    since: datetime | None,
    node_name: str | None,
    job_id: int | None,
    limit: int | None,
    kind: str | None,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """The controller's event log: every decision with its cause."""
    if node_name is not None and not NODE_NAME.match(node_name):
        raise click.BadParameter(f"{node_name!r} is not a node name", param_hint="'--node'")
    if kind is not None and not EVENT_KIND.match(kind):
        raise click.BadParameter(f"{kind!r} is not an event kind", param_hint="'--kind'")
    client = make_client(url, munge_socket, config_file, timeout)
    since_iso = since.isoformat() if since else None
    doc = client.events(since=since_iso, node=node_name, limit=limit, job=job_id, kind=kind)
    _emit(doc, as_json, lambda d: render.events_table(_rows(d)))


@click.group(invoke_without_command=True)
@connection_options
@json_option
@click.pass_context
@one_line_errors
def jobs(
    ctx: click.Context,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Jobs that opted in to auto-resume, and what was done for them."""
    if ctx.invoked_subcommand is not None:
        return
    doc = make_client(url, munge_socket, config_file, timeout).jobs()
    _emit(doc, as_json, lambda d: render.jobs_table(_rows(d)))


@jobs.command("show")
@click.argument("job_id", type=click.IntRange(min=1))
@connection_options
@json_option
@click.pass_context
@one_line_errors
def jobs_show(
    ctx: click.Context,
    job_id: int,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """One job: auto-resume budget, events and actions."""
    parent = ctx.parent.params if ctx.parent is not None else {}
    client = make_client(
        url or parent.get("url"),
        munge_socket or parent.get("munge_socket"),
        config_file or parent.get("config_file"),
        timeout or parent.get("timeout"),
    )
    doc = client.job(job_id)
    _emit(doc, as_json or bool(parent.get("as_json")), _job_detail)


def _job_detail(doc: Any) -> str:
    """``jobs show``: the job, then its goodput (a controller before it sends none)."""
    job = _obj(doc)
    text = render.job_detail(job)
    if isinstance(job.get("goodput"), dict):
        text += "\n\nGoodput:\n" + goodput_text.job_text(job["goodput"])
    return text


@click.command()
@click.option("--job", "job_id", type=click.IntRange(1, 2**63 - 1), help="Only this job.")
@click.option("--since", type=SinceType(), help="Only time after this: 10m, 2h, 1d or ISO.")
@connection_options
@json_option
@one_line_errors
def goodput(
    job_id: int | None,
    since: datetime | None,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Measured goodput: each job's wall, productive and lost time by cause (ETTR), and
    the cluster's, from the controller's records."""
    if since is not None and since > _now():
        raise click.BadParameter(f"{since.isoformat()} is in the future", param_hint="'--since'")
    client = make_client(url, munge_socket, config_file, timeout)
    doc = client.goodput(job=job_id, since=since.isoformat() if since else None)
    text = goodput_text.job_text if job_id is not None else goodput_text.cluster_text
    _emit(doc, as_json, lambda d: text(_obj(d)))


# An epilog must never fail or hang: slurmctld waits for EpilogSlurmctld before it
# finishes the job's bookkeeping, and a failing one is logged against the job.
NOTIFY_DEADLINE_S = 2.0
NOTIFY_REQUEST_TIMEOUT_S = 1.5


def exit_code_from_env(value: str) -> int | None:
    """``SLURM_JOB_EXIT_CODE2`` (``"exit:signal"``) -> the exit code; None when unusable."""
    head = value.strip().split(":", 1)[0]
    if not head.isdigit() or int(head) > 255:
        return None
    return int(head)


def _notify(
    job_id: int,
    exit_code: int | None,
    state: str | None,
    connection: tuple[str | None, Path | None, Path | None],
) -> None:
    url, munge_socket, config_file = connection
    try:
        client = make_client(url, munge_socket, config_file, NOTIFY_REQUEST_TIMEOUT_S)
        client.job_ended(job_id, exit_code, state)
    except (HyperpodError, ValueError) as exc:
        click.echo(f"hyperpod jobs notify-end: job {job_id}: couldn't notify: {exc}", err=True)


@jobs.command("notify-end")
@click.argument("job_id", required=False)
@click.option(
    "--exit-code",
    "exit_text",
    help="The job's exit code, N or N:SIGNAL (default: SLURM_JOB_EXIT_CODE2).",
)
@click.option("--state", help="The job's final state, if known (FAILED, NODE_FAIL...).")
@connection_options
@click.pass_context
def jobs_notify_end(
    ctx: click.Context,
    job_id: str | None,
    exit_text: str | None,
    state: str | None,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
) -> None:
    """For EpilogSlurmctld: tell the controller JOB_ID ended (default: SLURM_JOB_ID).

    Always exits 0 within about 2 s: a controller that is down or slow only costs
    the immediate reaction (the controller's next pass still sees the job). Problems
    go to stderr.
    """
    raw = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", "")
    if not raw.strip().isdigit() or not 0 < int(raw) < 2**63:
        click.echo(f"hyperpod jobs notify-end: no valid job id (got {raw!r})", err=True)
        return
    # Lenient on purpose: a value we cannot read is left out, never an error.
    if exit_text is None:
        exit_text = os.environ.get("SLURM_JOB_EXIT_CODE2", "")
    exit_code = exit_code_from_env(exit_text)
    if state is not None and not re.fullmatch(r"[A-Za-z_]{1,32}", state):
        state = None
    parent = ctx.parent.params if ctx.parent is not None else {}
    connection = (
        url or parent.get("url"),
        munge_socket or parent.get("munge_socket"),
        config_file or parent.get("config_file"),
    )
    worker = threading.Thread(
        target=_notify, args=(int(raw), exit_code, state, connection), daemon=True
    )
    worker.start()
    worker.join(min(timeout or NOTIFY_DEADLINE_S, NOTIFY_DEADLINE_S))
    if worker.is_alive():
        click.echo(
            f"hyperpod jobs notify-end: job {raw}: no answer within {NOTIFY_DEADLINE_S:g} s; "
            "giving up",
            err=True,
        )


node.add_command(node_check)
