"""The controller's HTTP API (FastAPI under ``/v1``, served by uvicorn).

``api_guard.Guard`` in front of the app limits header and body size, authenticates
and refuses what is not strict JSON. Every route then checks who asks before anything
else: a route dependency, on the identity and the raw JSON (dictionary lookups), runs
before FastAPI validates the body, and before any store query or Slurm read.

Every error, including FastAPI's own validation errors and 404/405, is
``{"error": {"code", "message", "details"}}`` with a code from ``api_models.ERROR_CODES``,
and every refusal is counted and logged through ``api_rejections.Rejections``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyperpod_agent import __version__, wire
from hyperpod_agent.auth.config import AuthError, Identity, require_node
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api import views
from hyperpod_agent.controller.api.callers import (
    admin_only,
    identity_of,
    node_itself,
)
from hyperpod_agent.controller.api.checks import add_check_routes
from hyperpod_agent.controller.api.goodput import GoodputGauges, add_goodput_routes
from hyperpod_agent.controller.api.guard import (
    Guard,
    error_response,
    validation_message,
)
from hyperpod_agent.controller.api.jobs import add_job_routes
from hyperpod_agent.controller.api.models import (
    ERROR_CODES,
    ERRORS,
    Accepted,
    ActionAccepted,
    AdminActionIn,
    EventOut,
    HeartbeatIn,
    NodeDetail,
    NodeOut,
    Status,
)
from hyperpod_agent.controller.api.rejections import Rejections, caller
from hyperpod_agent.controller.api.steps import add_step_routes
from hyperpod_agent.controller.ingest import Heartbeat, Rejected
from hyperpod_agent.controller.providers.base import ProviderError
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.snapshot import Kind
from hyperpod_agent.controller.store.lease import Lease, LeaseLost
from hyperpod_agent.controller.store.rows import NodeRow
from hyperpod_agent.health import NodeReport
from hyperpod_agent.reasons import Verb, format_reason

log = logging.getLogger(__name__)
HTTP_CODES = {
    400: "malformed_json",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
}


def create_app(
    controller: Controller, auth: ServerAuth, rejections: Rejections | None = None
) -> Guard:
    """The ASGI application: FastAPI routes wrapped in the Guard."""
    app = FastAPI(title="hyperpod-controller", version="1", docs_url=None, redoc_url=None)
    refusals = rejections or Rejections()

    def refuse(
        request: Request, status: int, code: str, message: str, details: list[Any] | None = None
    ) -> Response:
        refusals.record(
            status, code, message, caller(request.scope), request.method, request.url.path
        )
        return error_response(status, code, message, details)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        code, message, details = validation_message(list(exc.errors()))
        return refuse(request, ERROR_CODES[code], code, message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # The Guard has refused what FastAPI would answer 400 (a body it cannot parse),
        # so any other 4xx is a bad request in the documented form.
        code = HTTP_CODES.get(exc.status_code, "bad_request")
        return refuse(request, ERROR_CODES[code], code, str(exc.detail))

    @app.exception_handler(Rejected)
    async def _rejected(request: Request, exc: Rejected) -> Response:
        return refuse(request, exc.status, exc.code, str(exc))

    @app.exception_handler(AuthError)
    async def _auth(request: Request, exc: AuthError) -> Response:
        code = "forbidden" if exc.status == 403 else "unauthenticated"
        return refuse(request, ERROR_CODES[code], code, str(exc))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")

    def _own(request: Request, node: str) -> None:
        # Only the node itself may report its state, admins included: an admin who
        # wants a node out drains it through the actions endpoint, with a reason.
        require_node(identity_of(request), node)

    @app.post(
        "/v1/reports",
        response_model=Accepted,
        responses=ERRORS,
        dependencies=[Depends(node_itself)],
    )
    def post_report(report: NodeReport, request: Request) -> Accepted:
        """Full node state from an agent (on change)."""
        _own(request, report.node)
        _agent_release(report.node, request)
        return Accepted(open_faults=controller.ingest_report(report))

    @app.post(
        "/v1/heartbeats",
        response_model=Accepted,
        responses=ERRORS,
        dependencies=[Depends(node_itself)],
    )
    async def post_heartbeat(beat: HeartbeatIn, request: Request) -> Accepted:
        """A small liveness message between reports."""
        _own(request, beat.node)
        _agent_release(beat.node, request)
        controller.ingest_heartbeat(
            Heartbeat(beat.node, beat.agent_id, beat.seq, beat.sent_at.timestamp())
        )
        return Accepted()

    @app.get("/v1/healthz")
    def healthz() -> dict[str, Any]:
        """Liveness of the controller itself (no authentication): which controller this
        is and whether it leads, so a client holding several URLs can show each."""
        degraded = controller.isolation.quarantined()
        return {
            "ok": True,  # alive; "status" says whether every item is handled
            "status": "degraded" if degraded else "ok",
            "degraded": degraded,
            "controller": controller.config.controller_id(),
            "role": controller.role(),
            "last_pass_at": views.ts(controller.last_pass_at),
            "schema_version": controller.store.schema_version(),
        }

    @app.get("/v1/status", response_model=Status, responses=ERRORS)
    def status(request: Request) -> Status:
        identity_of(request)
        nodes = controller.nodes
        rows = controller.store.node_rows()
        verdicts = Counter(rows[n].verdict or "unknown" if n in rows else "unknown" for n in nodes)
        leader, since = controller.leader()
        return Status(
            nodes_total=len(nodes),
            by_state=dict(Counter(_state(n) for n in nodes.values())),
            by_verdict=dict(verdicts),
            incident_mode=bool(controller.incident_reason),
            incident_reason=controller.incident_reason,
            dry_run=controller.config.policy.observe,
            mode="observe" if controller.config.policy.observe else "act",
            version=__version__,
            api_version=wire.API_VERSION,
            open_faults=len(controller.store.open_faults()),
            pending_actions=len(controller.store.open_actions()),
            last_pass_at=views.ts(controller.last_pass_at),
            leader=leader,
            leader_since=views.ts(since),
            this_controller=controller.config.controller_id(),
            role=controller.role(),  # type: ignore[arg-type]
            degraded=controller.isolation.quarantined(),
            expansion_refused=controller.gate.expansion.known(),
            slurmctld_version=controller.gate.expansion.version,
        )

    def _agent_release(node: str, request: Request) -> None:
        # The node's own agent (checked above): one entry per node at most.
        release = wire.version_of(request.headers.get("user-agent"))
        if release is not None:
            controller.agent_versions[node] = release

    def _node_out(
        name: str,
        row: NodeRow | None,
        open_count: int,
        cls: type[NodeOut] = NodeOut,
        **extra: Any,
    ) -> NodeOut:
        node = controller.nodes.get(name)
        return cls(
            name=name,
            state=_state(node) if node else None,
            flags=sorted(node.flags) if node else [],
            reason=node.reason if node else "",
            partitions=list(node.partitions) if node else [],
            verdict=row.verdict if row else None,
            agent_id=row.agent_id if row else None,
            last_report_at=views.ts(row.received_at) if row else None,
            last_heartbeat_at=views.ts(
                controller.last_heartbeat(name) or (row.heartbeat_at if row else None)
            ),
            open_faults=open_count,
            agent_version=controller.agent_versions.get(name),
            **extra,
        )

    @app.get("/v1/nodes", response_model=list[NodeOut], responses=ERRORS)
    def nodes(request: Request) -> list[NodeOut]:
        identity_of(request)
        rows = controller.store.node_rows()
        faults = Counter(f.node for f in controller.store.open_faults())
        names = sorted(set(controller.nodes) | set(rows))
        return [_node_out(n, rows.get(n), faults[n]) for n in names]

    @app.get("/v1/nodes/{name}", response_model=NodeDetail, responses=ERRORS)
    def node(name: str, request: Request) -> NodeOut:
        identity_of(request)
        row = controller.store.node_row(name)
        if name not in controller.nodes and row is None:
            raise StarletteHTTPException(404, f"node {name!r} is not known")
        history = controller.store.node_faults(name)
        return _node_out(
            name,
            row,
            sum(1 for f in history if f.closed_at is None),
            NodeDetail,
            faults=[views.fault_view(f) for f in history],
            findings=[views.finding_view(f) for f in controller.store.node_findings(name)],
            deep_checks=[views.outcome_view(o) for o in controller.store.node_outcomes(name)],
            actions=[views.action_view(a) for a in controller.store.node_actions(name)],
            report=row.report_dict() if row else None,
        )

    add_job_routes(app, controller)
    add_goodput_routes(app, controller)
    gauges = GoodputGauges(controller)

    @app.get("/v1/events", response_model=list[EventOut], responses=ERRORS)
    def events(
        request: Request,
        since: str = Query(
            default="0",
            max_length=64,
            description="events after this: an event id, or an ISO 8601 time",
        ),
        node: str | None = Query(default=None, max_length=64),
        job: int | None = Query(default=None, ge=1, le=2**63 - 1),
        limit: int = Query(default=100, ge=1, le=1000),
        kind: str | None = Query(
            default=None, max_length=64, pattern=r"^[a-z_]+$", description="e.g. would_have"
        ),
    ) -> list[EventOut]:
        identity_of(request)
        since_id, since_at = views.parse_since(since)
        found = controller.store.events(
            since_id, node, limit, job_id=job, since_at=since_at, kind=kind
        )
        return [views.event_view(e) for e in found]

    @app.post(
        "/v1/nodes/{name}/actions",
        status_code=202,
        response_model=ActionAccepted,
        responses=ERRORS,
        dependencies=[admin_only("for node actions")],
    )
    def admin_action(name: str, body: AdminActionIn, request: Request) -> ActionAccepted:
        """A human asks for drain|resume|reboot|replace; applied by the next pass."""
        identity = identity_of(request)
        if not identity.is_admin:
            raise AuthError("admin identity required for node actions", 403)
        fence = controller.require_leader()
        if name not in controller.nodes:
            raise Rejected(
                404,
                "not_found",
                f"node {name!r} is not in Slurm's view (or the controller has not read Slurm yet)",
            )
        return _submit(controller, name, body, identity, fence)

    add_check_routes(app, controller, identity_of, ERRORS, admin_only("for deep checks"))
    add_step_routes(app, controller, identity_of, ERRORS)

    @app.get("/metrics", include_in_schema=False)
    def prom() -> Response:
        gauges.refresh()
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return Guard(app, auth, controller.config.max_body_bytes, refusals)


def _state(node: Any) -> str:
    return str(node.state) + ("+DRAIN" if "DRAIN" in node.flags else "")


def _resume_gate(
    controller: Controller, name: str, body: AdminActionIn, message: str, params: dict[str, Any]
) -> tuple[str, str]:
    """(reason, how) of an admin's resume. With the re-entry gate on, a drained node is
    not resumed but handed to the gate under ``hyperpod:check admin resume``, unless the
    admin said ``--no-check``; ``params`` records which (``deep_check``) and the reason
    the node had, so the intent applies only while it still has it."""
    node = controller.nodes[name]
    seen = node.reason.strip() if node.drained else ""
    params["seen_reason"] = seen
    if not controller.config.deep_checks.reentry_gate_on:
        params["deep_check"] = False
        return "", " (no deep check: the re-entry gate is off)"
    if body.check is False:
        params["deep_check"] = False
        return "", " (no deep check: --no-check)"
    params["deep_check"] = True
    if not seen:
        return "", " (in service already: nothing to check)"
    reason = format_reason(Verb.CHECK, "admin", "resume", message)
    return reason, " (after a deep check)"


def _submit(
    controller: Controller,
    name: str,
    body: AdminActionIn,
    identity: Identity,
    fence: Lease | None,
) -> ActionAccepted:
    who = f"uid {identity.uid}"
    message = body.reason or "no reason given"
    # An admin drain is a hold: a healthy report must not undo a human's decision.
    kinds = {
        "drain": (Kind.HOLD, Verb.HOLD),
        "resume": (Kind.RESUME, None),
        "reboot": (Kind.REBOOT, Verb.REBOOT),
        "replace": (Kind.REPLACE, Verb.REPLACE),
    }
    kind, verb = kinds[body.action]
    reason = format_reason(verb, "admin", "request", message) if verb else ""
    params: dict[str, Any] = {"admin": who}
    how = ""
    if kind is Kind.RESUME:
        reason, how = _resume_gate(controller, name, body, message, params)
    if kind is Kind.REPLACE:
        try:
            params.update(controller.replacement_params(name))
        except ProviderError as exc:
            raise Rejected(409, "no_replacement", str(exc)) from exc
    now = controller.clock()
    try:
        aid = controller.store.add_action(
            kind.value,
            name,
            None,
            reason,
            f"admin request by {who}: {message}",
            now,
            params,
            fence=fence,
        )
    except LeaseLost as exc:  # deposed since the check: the next leader takes it
        assert controller.leadership is not None
        controller.leadership.drop(str(exc))
        raise controller.leadership.not_leader() from None
    controller.store.add_event(
        "admin_request",
        f"{body.action} {name} requested by {who}{how}: {message}",
        now,
        node=name,
        cause="admin request",
    )
    controller.wake.set()
    return ActionAccepted(
        action_id=aid,
        kind=kind.value,
        node=name,
        reason=reason,
        dry_run=controller.config.policy.observe,
    )
