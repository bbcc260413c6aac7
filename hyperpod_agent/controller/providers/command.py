"""Command provider: an admin executable replaces the machine; it returns under the
same node name (DESIGN §5).

The command runs as ``command... NODE`` with ``HYPERPOD_ACTION_ID`` (stable for one
replacement: a command can use it as an idempotency key with a cloud API or a ticket
system), ``HYPERPOD_NODE`` and ``HYPERPOD_REASON`` in its environment. It runs at most
once per replacement and attempt: the executor records the replacement as started
before running it, and a controller killed meanwhile waits for the node instead of
running the command again. While it runs, the controller keeps its watchdog fed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from hyperpod_agent.controller.providers.base import (
    Handle,
    ProviderError,
    ReplaceStatus,
    SlurmApi,
)
from hyperpod_agent.slurm.models import Node

log = logging.getLogger(__name__)

KEEPALIVE_EVERY_S = 1.0
OUTPUT_TAIL = 4096  # bytes of the command's stderr kept for the error message


def came_back(node: Node | None, since: float) -> bool:
    """The node registered again after ``since``: slurmd started (or booted) later."""
    if node is None or not node.responding:
        return False
    started = [t.timestamp() for t in (node.slurmd_start_time, node.boot_time) if t]
    return bool(started) and max(started) > since


class _Tail:
    """Reads a pipe to its end in a thread, keeping its last ``limit`` bytes: a command
    that writes more than the pipe holds (64 KiB) never blocks on us."""

    def __init__(self, pipe: IO[bytes], limit: int = OUTPUT_TAIL) -> None:
        self._pipe, self._limit = pipe, limit
        self._kept = bytearray()
        self._thread = threading.Thread(target=self._read, name="command-stderr", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for chunk in iter(lambda: os.read(self._pipe.fileno(), 65536), b""):
                self._kept += chunk
                del self._kept[: max(0, len(self._kept) - self._limit)]
        except OSError as exc:  # the tail is only for the error message
            log.info("replacement command: reading its stderr: %s", exc)
        finally:
            self._pipe.close()

    def text(self, wait_s: float = 1.0) -> str:
        """What was kept; waits ``wait_s`` at most for the writer's end (a child the
        command left behind may hold the pipe open)."""
        self._thread.join(wait_s)
        return bytes(self._kept).decode("utf-8", "replace")


def run_bounded(
    argv: list[str], env: Mapping[str, str], timeout_s: float, keepalive: Callable[[], None] | None
) -> tuple[int, str]:
    """Run ``argv`` for at most ``timeout_s``, calling ``keepalive`` about every second;
    (exit code, tail of stderr). Killed (with its process group) at the time limit."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        raise ProviderError(f"{' '.join(argv)}: {exc.strerror or exc}") from exc
    assert proc.stderr is not None
    tail = _Tail(proc.stderr)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                proc.wait(timeout=min(KEEPALIVE_EVERY_S, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    os.killpg(proc.pid, 9)
                    proc.wait(timeout=10)
                    raise ProviderError(
                        f"{argv[0]} {argv[-1]}: timed out after {timeout_s:g} s"
                    ) from None
                if keepalive is not None:
                    keepalive()
        err = tail.text()
    except BaseException:
        if proc.poll() is None:  # never leave it running behind us
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        raise
    return proc.returncode, err


class CommandProvider:
    """Runs ``command + [node]``; a zero exit starts the wait for the node."""

    name = "command"
    resumes_node = True
    runs_once = True

    def __init__(self, slurm: SlurmApi, command: list[str], timeout_s: float) -> None:
        self.slurm = slurm
        self.command = list(command)
        self.timeout_s = timeout_s

    def prepare(
        self, node: str, nodes: Mapping[str, Node], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {}

    def replace(
        self,
        node: str,
        reason: str,
        params: Mapping[str, Any],
        now: float,
        keepalive: Callable[[], None] | None = None,
    ) -> Handle:
        self.slurm.drain(node, reason)
        argv = [*self.command, node]
        env = {
            **os.environ,
            "HYPERPOD_ACTION_ID": str(params.get("action_id", "")),
            "HYPERPOD_NODE": node,
            "HYPERPOD_REASON": reason,
        }
        code, err = run_bounded(argv, env, self.timeout_s, keepalive)
        if code != 0:
            tail = (err.strip().splitlines() or [""])[-1]
            raise ProviderError(f"{argv[0]} {node}: exit {code}: {tail}")
        log.info("replacement command for %s finished", node)
        return {"node": node, "started_at": now, "deadline": now + self.timeout_s}

    def poll(self, handle: Handle, nodes: Mapping[str, Node], now: float) -> ReplaceStatus:
        started = float(handle.get("started_at", now))
        if came_back(nodes.get(str(handle.get("node", ""))), started):
            return ReplaceStatus.DONE
        if now > float(handle.get("deadline", started + self.timeout_s)):
            return ReplaceStatus.FAILED
        return ReplaceStatus.PENDING
