"""HTTP client of the controller API (``/v1``), used by the agent and the admin CLI.

Standard library only (urllib), so the agent needs no HTTP dependency. Every request is
authenticated by a :class:`~hyperpod_agent.auth.server.ClientAuth`; every failure becomes a
typed, one-line :class:`ControllerUnreachable` or :class:`ControllerError`.

A client may hold several controller URLs (controllers with ``[ha]``): a request that
cannot connect, or that a standby answers ``503 not_leader``, goes to the next URL,
each at most once per request; the URL that answered is tried first next time. An
idempotent request (a read, a report, a heartbeat, a step watch's renewal) also goes on
to the next URL when one accepts it but does not answer within the timeout (a frozen
leader), so a controller that stops answering loses its clients within one timeout; a
request that changes something is never sent twice.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hyperpod_agent import __version__
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.errors import ConfigError, HyperpodError

ACTIONS = ("drain", "resume", "reboot", "replace")
# POSTs that may be sent again to another controller after a timeout: reports and
# heartbeats carry their sequence number (a repeat is recognised), a watch renewal says
# the same thing twice.
IDEMPOTENT_POSTS = frozenset({"/v1/reports", "/v1/heartbeats", "/v1/steps/watch"})
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ControllerUnreachable(HyperpodError):
    """No HTTP answer at all: connection refused, DNS failure, timeout."""

    def __init__(self, url: str, why: str):
        super().__init__(f"controller at {url} unreachable: {why}")
        self.url = url
        self.why = why


class ControllerError(HyperpodError):
    """The controller answered with an HTTP error; carries its code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.detail = message

    @property
    def retryable(self) -> bool:
        """True when trying the same request later may succeed."""
        return self.status >= 500 or self.status in (408, 429)


def check_url(url: str) -> str:
    """Return ``url`` without a trailing slash; raise ConfigError unless it is http(s)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"controller URL {url!r}: expected http://HOST:PORT or https://…")
    if parsed.query or parsed.fragment:
        raise ConfigError(f"controller URL {url!r}: must not carry a query or fragment")
    return url.rstrip("/")


def parse_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """Controller URLs from a list or a comma-separated string, checked, in order,
    without repeats; ConfigError when there is none or one is not http(s)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    urls = tuple(dict.fromkeys(check_url(u.strip()) for u in items if u.strip()))
    if not urls:
        raise ConfigError(f"no controller URL in {value!r}")
    return urls


def _error_from_body(status: int, reason: str, raw: bytes) -> ControllerError:
    try:
        doc = json.loads(raw)
        err = doc["error"]
        return ControllerError(status, str(err["code"]), str(err["message"]))
    except (ValueError, KeyError, TypeError):
        pass
    text = raw.decode(errors="replace").strip().splitlines()
    first = text[0][:200] if text else (reason or "no body")
    return ControllerError(status, "http_error", f"controller said: {first}")


class ControllerClient:
    """Talks to a controller, or the first of several that answers. Thread-safe: it
    holds no connection state."""

    def __init__(
        self,
        url: str | Sequence[str],
        auth: ClientAuth,
        timeout: float = 10.0,
        *,
        ca_file: Path | None = None,
    ) -> None:
        self.urls = parse_urls(url)
        self._preferred = 0  # the URL that answered last
        self.auth = auth
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None
        if ca_file is not None:
            self._context = ssl.create_default_context(cafile=str(ca_file))

    @property
    def url(self) -> str:
        """The URL tried first: the one that answered last."""
        return self.urls[self._preferred]

    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        query: dict[str, str | int] | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON answer (None for an empty body).

        With several URLs, one that cannot be connected to or answers ``not_leader``
        passes the request to the next, and so does one that does not answer in time
        when the request is idempotent; the last one's error is raised."""
        start = self._preferred
        error: ControllerUnreachable | ControllerError | None = None
        again = method == "GET" or (method == "POST" and path in IDEMPOTENT_POSTS)
        for i in range(len(self.urls)):
            index = (start + i) % len(self.urls)
            try:
                answer = self._request_one(self.urls[index], method, path, payload, query)
            except _NotSent as exc:
                error = exc.error
                continue
            except _NoAnswer as exc:
                if not again:
                    raise exc.error from None
                error = exc.error
                continue
            except ControllerError as exc:
                if exc.status != 503 or exc.code != "not_leader":
                    raise
                error = exc
                continue
            self._preferred = index
            return answer
        assert error is not None
        raise error

    def _request_one(
        self,
        url: str,
        method: str,
        path: str,
        payload: Any,
        query: dict[str, str | int] | None,
    ) -> Any:
        prefix = urllib.parse.urlsplit(url).path
        target = prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        body = b"" if payload is None else json.dumps(payload, default=str).encode()
        headers = {
            "Accept": "application/json",
            "User-Agent": f"hyperpod/{__version__}",
            **self.auth.headers(method, target, body),
        }
        if payload is not None:
            headers["Content-Type"] = "application/json"
        full = url[: len(url) - len(prefix)] + target
        req = urllib.request.Request(
            full, data=body if payload is not None else None, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context) as resp:
                raw = resp.read(MAX_RESPONSE_BYTES)
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read(64 * 1024)
            raise _error_from_body(exc.code, exc.reason, raw) from None
        except urllib.error.URLError as exc:
            # urllib wraps what fails while connecting and sending: the request was
            # not taken, so another controller may have it.
            raise _NotSent(ControllerUnreachable(url, _why(exc.reason))) from None
        except TimeoutError:
            # Sent, and no answer: the controller may or may not have acted on it.
            why = f"timed out after {self.timeout:g} s (no answer)"
            raise _NoAnswer(ControllerUnreachable(url, why)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ControllerUnreachable(url, _why(exc)) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ControllerError(200, "bad_response", "controller sent invalid JSON") from None

    def status(self) -> Any:
        """``GET /v1/status``: cluster summary."""
        return self.request("GET", "/v1/status")

    def healthz(self) -> Any:
        """``GET /v1/healthz``."""
        return self.request("GET", "/v1/healthz")

    def controllers(self) -> list[dict[str, Any]]:
        """Every configured controller's own ``/v1/healthz`` (who it is, its role), or
        why it did not answer; one entry per URL, in order."""
        out: list[dict[str, Any]] = []
        for url in self.urls:
            entry: dict[str, Any] = {"url": url, "ok": False, "controller": None, "role": None}
            try:
                doc = self._request_one(url, "GET", "/v1/healthz", None, None)
            except (_NotSent, _NoAnswer) as exc:
                entry["error"] = f"unreachable: {exc.error}"
            except (ControllerUnreachable, ControllerError) as exc:
                entry["error"] = f"unreachable: {exc}"
            else:
                doc = doc if isinstance(doc, dict) else {}
                entry.update(
                    ok=doc.get("ok") is True,
                    controller=doc.get("controller"),
                    role=doc.get("role"),
                    last_pass_at=doc.get("last_pass_at"),
                )
            out.append(entry)
        return out

    def nodes(self) -> Any:
        """``GET /v1/nodes``."""
        return self.request("GET", "/v1/nodes")

    def node(self, name: str) -> Any:
        """``GET /v1/nodes/{name}``."""
        return self.request("GET", f"/v1/nodes/{_seg(name)}")

    def jobs(self) -> Any:
        """``GET /v1/jobs``."""
        return self.request("GET", "/v1/jobs")

    def job(self, job_id: str | int) -> Any:
        """``GET /v1/jobs/{id}``."""
        return self.request("GET", f"/v1/jobs/{_seg(str(job_id))}")

    def goodput(self, job: int | None = None, since: str | None = None) -> Any:
        """``GET /v1/goodput``, or ``GET /v1/jobs/{job}/goodput``; ``since``: ISO 8601."""
        path = "/v1/goodput" if job is None else f"/v1/jobs/{int(job)}/goodput"
        return self.request("GET", path, query={"since": since} if since else None)

    def job_ended(self, job_id: int, exit_code: int | None = None, state: str | None = None) -> Any:
        """``POST /v1/jobs/{id}/ended``: a job ended (EpilogSlurmctld); needs an admin."""
        body = {k: v for k, v in (("exit_code", exit_code), ("state", state)) if v is not None}
        return self.request("POST", f"/v1/jobs/{int(job_id)}/ended", body)

    def events(
        self,
        since: str | None = None,
        node: str | None = None,
        limit: int | None = None,
        job: int | None = None,
        kind: str | None = None,
    ) -> Any:
        """``GET /v1/events`` filtered by time (ISO 8601), node, job, kind and count."""
        query: dict[str, str | int] = {}
        if kind:
            query["kind"] = kind
        if since:
            query["since"] = since
        if node:
            query["node"] = node
        if job is not None:
            query["job"] = job
        if limit is not None:
            query["limit"] = limit
        return self.request("GET", "/v1/events", query=query or None)

    def action(self, node: str, action: str, reason: str = "", check: bool | None = None) -> Any:
        """``POST /v1/nodes/{name}/actions``: ask the controller to act on a node.
        ``check=False`` (resume only) resumes without the re-entry deep check; the field
        is sent only when given, so an older controller still takes the request."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        body: dict[str, Any] = {"action": action, "reason": reason}
        if check is not None:
            body["check"] = check
        return self.request("POST", f"/v1/nodes/{_seg(node)}/actions", body)

    def check(self, nodes: list[str], level: str = "quick", drain_first: bool = False) -> Any:
        """``POST /v1/checks``: run the deep-check suite on ``nodes`` (admin)."""
        body = {"nodes": nodes, "level": level, "drain_first": drain_first}
        return self.request("POST", "/v1/checks", body)

    def check_run(self, run_id: int) -> Any:
        """``GET /v1/checks/{id}``: one deep-check run with its outcomes."""
        return self.request("GET", f"/v1/checks/{int(run_id)}")

    def checks(self) -> Any:
        """``GET /v1/checks``: recent deep-check runs."""
        return self.request("GET", "/v1/checks")

    def step_retry(
        self,
        job_id: int,
        step_id: str,
        exit_code: int,
        nodelist: str,
        attempt: int,
        auto_resume: int,
        cancelled: bool = False,
        started_at: float | None = None,
    ) -> Any:
        """``POST /v1/steps/retry``: a failed ``--auto-resume`` step asks what to do;
        RETRYSTEP comes with a surgery id to poll with :meth:`step_retry_state`."""
        body = {
            "job_id": job_id,
            "step_id": step_id,
            "exit_code": exit_code,
            "nodelist": nodelist,
            "attempt": attempt,
            "auto_resume": auto_resume,
            "cancelled": cancelled,
        }
        if started_at is not None:
            body["started_at"] = _iso(started_at)
        return self.request("POST", "/v1/steps/retry", body)

    def step_watch(
        self,
        job_id: int,
        step_id: str,
        attempt: int,
        nodelist: str,
        started_at: float | None = None,
    ) -> Any:
        """``POST /v1/steps/watch``: the step runs; ``end`` says to end it now."""
        body: dict[str, Any] = {
            "job_id": job_id,
            "step_id": step_id,
            "attempt": attempt,
            "nodelist": nodelist,
        }
        if started_at is not None:
            body["started_at"] = _iso(started_at)
        return self.request("POST", "/v1/steps/watch", body)

    def step_retry_state(self, retry_id: int) -> Any:
        """``GET /v1/steps/retry/{id}``: the surgery's phase; the new node list once done."""
        return self.request("GET", f"/v1/steps/retry/{int(retry_id)}")

    def report(self, report: dict[str, Any]) -> Any:
        """``POST /v1/reports`` with a NodeReport in its JSON form."""
        return self.request("POST", "/v1/reports", report)

    def heartbeat(self, node: str, agent_id: str, seq: int, sent_at: str) -> Any:
        """``POST /v1/heartbeats``."""
        beat = {"node": node, "agent_id": agent_id, "seq": seq, "sent_at": sent_at}
        return self.request("POST", "/v1/heartbeats", beat)


class _NotSent(Exception):
    """A request no controller received (it could not connect): try the next."""

    def __init__(self, error: ControllerUnreachable) -> None:
        super().__init__(str(error))
        self.error = error


class _NoAnswer(Exception):
    """A request a controller took but did not answer within the timeout."""

    def __init__(self, error: ControllerUnreachable) -> None:
        super().__init__(str(error))
        self.error = error


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _why(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__
