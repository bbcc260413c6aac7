"""Deep checks on demand: ``POST /v1/checks`` (admin), ``GET /v1/checks[/{id}]``.

A request is refused, with nothing started, when deep checks are not configured, the
suite file does not load, a node is unknown, not responding, already under a check,
or running jobs without ``drain_first``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi import Path as FastApiPath

from hyperpod_agent.auth.config import AuthError, Identity
from hyperpod_agent.controller.api.models import CheckIn, CheckRunOut
from hyperpod_agent.controller.api.views import run_view
from hyperpod_agent.controller.deepcheck.outcomes import suite_limit_s
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.errors import ConfigError, SlurmError

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller

BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")
MAX_RUN_ID = 2**63 - 1


def _refuse_nodes(controller: Controller, body: CheckIn) -> dict[str, str]:
    """Refuse what cannot be checked; each node's current reason otherwise."""
    deep = controller.config.deep_checks
    if deep.suite is None:
        raise Rejected(
            409, "not_configured", "deep checks are not configured ([deep_checks] suite)"
        )
    try:
        suite_limit_s(deep, body.level)
    except ConfigError as exc:
        raise Rejected(409, "bad_suite", f"the deep-check suite does not load: {exc}") from exc
    # Slurm as it is now, not as the last pass saw it: a job may have started since.
    try:
        current = {n.name: n for n in controller.slurm.list_nodes()}
    except SlurmError as exc:
        raise Rejected(503, "slurm_unavailable", f"cannot read Slurm: {exc}") from exc
    unknown = [n for n in body.nodes if n not in current]
    if unknown:
        raise Rejected(404, "not_found", f"unknown node(s): {', '.join(unknown)}")
    checking = {n for r in controller.store.open_check_runs() for n in r.nodes}
    under = [n for n in body.nodes if n in checking]
    if under:
        raise Rejected(409, "busy", f"already under a deep check: {', '.join(under)}")
    nodes = [current[n] for n in body.nodes]
    # DOWN, not a passing NOT_RESPONDING: Slurm flags a node it just resumed so until
    # its next ping answers
    silent = [n.name for n in nodes if n.state == "DOWN"]
    if silent:
        raise Rejected(409, "not_responding", f"not responding: {', '.join(silent)}")
    busy = [n.name for n in nodes if n.state in BUSY_STATES]
    if busy and not body.drain_first:
        raise Rejected(
            409,
            "in_use",
            f"running jobs: {', '.join(busy)} (drain_first drains them and waits)",
        )
    return {n.name: n.reason for n in nodes}


def add_check_routes(
    app: FastAPI,
    controller: Controller,
    identity: Callable[[Request], Identity],
    errors: dict[int | str, dict[str, Any]],
    admin: Any,
) -> None:
    """The routes; ``admin`` is the dependency that refuses a caller who is not an admin
    before the body is validated."""
    ERRORS = errors  # noqa: N806 - the same name the other routes use

    @app.post(
        "/v1/checks",
        status_code=202,
        response_model=CheckRunOut,
        responses=ERRORS,
        dependencies=[admin],
    )
    def post_check(body: CheckIn, request: Request) -> CheckRunOut:
        """Run the deep-check suite on nodes, in a maintenance reservation."""
        who = identity(request)
        if not who.is_admin:
            raise AuthError("admin identity required for deep checks", 403)
        controller.require_leader()  # before anything reads Slurm: a standby never does
        prior = _refuse_nodes(controller, body)
        now = controller.clock()
        requester = f"uid {who.uid}"
        message = f"deep check ({body.level}) of {', '.join(body.nodes)} requested by {requester}"
        if body.drain_first:
            message += " (draining first)"
        run_id = controller.store.add_check_run(
            body.nodes,
            body.level,
            "admin",
            prior,
            requester,
            body.drain_first,
            now,
            EventIn("deep_check_planned", message, None, None, "admin request"),
        )
        controller.wake.set()
        run = controller.store.check_run(run_id)
        assert run is not None
        return run_view(run, [])

    @app.get("/v1/checks", response_model=list[CheckRunOut], responses=ERRORS)
    def list_checks(request: Request) -> list[CheckRunOut]:
        identity(request)
        return [run_view(r, []) for r in controller.store.recent_check_runs()]

    @app.get("/v1/checks/{run_id}", response_model=CheckRunOut, responses=ERRORS)
    def get_check(request: Request, run_id: int = FastApiPath(ge=1, le=MAX_RUN_ID)) -> CheckRunOut:
        identity(request)
        run = controller.store.check_run(run_id)
        if run is None:
            raise Rejected(404, "not_found", f"no deep check run {run_id}")
        return run_view(run, controller.store.run_outcomes(run_id))
