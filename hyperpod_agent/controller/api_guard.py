"""In front of the API: body size limit, authentication and the error format.

A pure ASGI guard enforces ``max_body_bytes`` *before* anything parses the body, then
authenticates every ``/v1`` call except ``/v1/healthz`` through ``ServerAuth.verify``
on the raw body, and hands the identity to the routes in ``scope["state"]``. Every
error is ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyperpod_agent.auth import AuthError, ServerAuth
from hyperpod_agent.controller import metrics

PUBLIC = ("/v1/healthz",)


def error_response(
    status: int, code: str, message: str, details: list[Any] | None = None
) -> Response:
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return JSONResponse(body, status_code=status)


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "details": []}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Body size limit and authentication, before FastAPI sees the request."""

    def __init__(self, app: ASGIApp, auth: ServerAuth, max_body: int) -> None:
        self.app, self.auth, self.max_body = app, auth, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        too_big = f"request body larger than {self.max_body} bytes"
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            await _send_error(send, 400, "bad_request", "invalid Content-Length header")
            return
        if declared > self.max_body:
            await _send_error(send, 413, "too_large", too_big)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _send_error(send, 413, "too_large", too_big)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        path: str = scope["path"]
        if path.startswith("/v1/") and path not in PUBLIC:
            try:
                identity = self.auth.verify(scope["method"], path, headers, body)
            except AuthError as exc:
                # 503: the controller could not check the credential (its munged is
                # down); anything else the caller got wrong is a 401.
                status = exc.status if exc.status in (401, 403, 503) else 401
                code = {401: "unauthenticated", 403: "forbidden", 503: "auth_unavailable"}
                metrics.REPORTS.labels("request", code[status]).inc()
                await _send_error(send, status, code[status], str(exc))
                return
            scope.setdefault("state", {})["identity"] = identity
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def validation_message(errors: list[Any]) -> tuple[str, str, list[dict[str, Any]]]:
    details = [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]
    if any(d["type"] == "json_invalid" for d in details):
        return "malformed_json", "request body is not valid JSON", details
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"][1:] if first["loc"][:1] == ["body"] else first["loc"])
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return "invalid", f"{where or 'request'}: {first['msg']}{more}", details
