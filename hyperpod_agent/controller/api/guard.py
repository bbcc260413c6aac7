"""In front of the API: size limits, authentication, JSON checks and the error format.

A pure ASGI guard enforces ``max_body_bytes`` *before* anything parses the body, then
authenticates every ``/v1`` call except ``/v1/healthz`` through ``ServerAuth.verify``
on the raw body, and hands the identity to the routes in ``scope["state"]``. A body
must then be JSON (415 otherwise) that parses without NaN, Infinity, numbers too long
to convert or nesting deep enough to exhaust the stack (400 ``malformed_json``), so
the routes never meet such input. The parsed JSON goes to the routes as well
(``raw_json``): a route checks who asks on it (a dictionary lookup) before it
validates the body or does anything else. Every error is ``{"error": {"code", "message",
"details"}}``, and every refusal is counted and logged through ``Rejections``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyperpod_agent.auth.config import AuthError
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller.api.rejections import Rejections, caller

PUBLIC = ("/v1/healthz",)
MAX_HEADER_BYTES = 16 * 1024  # request line and headers; a MUNGE credential is < 1 KiB
AUTH_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    429: "rate_limited",
    503: "auth_unavailable",
}


def error_response(
    status: int, code: str, message: str, details: list[Any] | None = None, close: bool = False
) -> Response:
    """The documented error body; ``close`` ends the connection after it (the rest of
    an oversized request is then drained and dropped, never parsed)."""
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return JSONResponse(
        body, status_code=status, headers={"connection": "close"} if close else None
    )


def header_bytes(scope: Scope) -> int:
    """About the size of a request's line and headers, as they came on the wire."""
    target = len(scope.get("raw_path") or scope["path"]) + len(scope.get("query_string", b""))
    return target + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", []))


class Guard:
    """Body size limit, authentication and JSON checks, before FastAPI sees the request."""

    def __init__(
        self, app: ASGIApp, auth: ServerAuth, max_body: int, rejections: Rejections
    ) -> None:
        self.app, self.auth, self.max_body = app, auth, max_body
        self.rejections = rejections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.rejections.flush()

        async def refuse(status: int, code: str, message: str, close: bool = False) -> None:
            self.rejections.record(
                status, code, message, caller(scope), scope["method"], scope["path"]
            )
            await error_response(status, code, message, close=close)(scope, receive, send)

        # h11 stops header blocks it has to wait for at this size; one that arrived
        # in a single read is stopped here.
        if header_bytes(scope) > MAX_HEADER_BYTES:
            too_long = f"request headers larger than {MAX_HEADER_BYTES} bytes"
            await refuse(431, "headers_too_large", too_long, close=True)
            return

        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        too_big = f"request body larger than {self.max_body} bytes"
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            await refuse(400, "bad_request", "invalid Content-Length header", close=True)
            return
        if declared > self.max_body:
            await refuse(413, "too_large", too_big, close=True)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await refuse(413, "too_large", too_big, close=True)
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
                status = exc.status if exc.status in AUTH_CODES else 401
                await refuse(status, AUTH_CODES[status], str(exc))
                return
            scope.setdefault("state", {})["identity"] = identity
        checked = body and path.startswith("/v1/")
        if checked and not _is_json(headers.get("content-type", "")):
            await refuse(415, "unsupported_media_type", "request body must be application/json")
            return
        parsed, problem = parse_json(body) if checked else (None, None)
        if problem:
            await refuse(400, "malformed_json", problem)
            return
        scope.setdefault("state", {})["body_json"] = parsed
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _is_json(content_type: str) -> bool:
    # No Content-Type at all is read as JSON (as FastAPI does); otherwise it must say so.
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in ("", "application/json") or (
        kind.startswith("application/") and kind.endswith("+json")
    )


class _NotJson(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _NotJson(f"request body has {name}, which is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"number {text[:20]} in the request body is out of range")
    return value


def parse_json(body: bytes) -> tuple[Any, str | None]:
    """``body`` parsed, or why it is not JSON the API accepts."""
    try:
        return json.loads(body, parse_constant=_constant, parse_float=_finite), None
    except RecursionError:
        return None, "request body is nested too deeply"
    except _NotJson as exc:
        return None, str(exc)
    except json.JSONDecodeError as exc:
        where = f"(line {exc.lineno} column {exc.colno})"
        return None, f"request body is not valid JSON: {exc.msg} {where}"
    except UnicodeDecodeError:
        return None, "request body is not valid JSON: not UTF-8 text"
    except ValueError:
        # int() refuses integers of more than sys.get_int_max_str_digits() digits.
        return None, "request body is not valid JSON: a number in it is too long"


def raw_json(request: Request) -> Any:
    """The request's body as the Guard parsed it (None without a body): for checks of
    who asks that must come before the body is validated."""
    return getattr(request.state, "body_json", None)


def validation_message(errors: list[Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """(code, one-line message, details) of FastAPI's validation errors."""
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
