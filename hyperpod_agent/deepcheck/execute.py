"""Running one diagnostic tool: an argument list (never a shell), its own session and
process group, bounded output, one deadline.

Diagnostics start helpers (dcgmi's host engine work, MPI ranks, stress-ng workers), so a
time limit kills the whole group: SIGTERM first, which lets dcgmi ask the host engine to
stop the diagnostic it started, then SIGKILL after a grace. Whatever the tool leaves
behind when it exits is killed too: a node must come out of a check with nothing of the
check still running. Output beyond the limit is read and dropped, so a chatty tool never
blocks on a full pipe.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_LIMIT = 4 * 1024 * 1024
# once the tool has exited and its group is killed, how long its pipes may stay open
# (held by a process that left the group) before we stop reading them
_DRAIN_S = 1.0
# how long SIGKILLed members of the group may take to die; one stuck in the kernel (a
# hung driver call) may never, and is then reported rather than waited for
_DEATH_S = 5.0
_CHUNK = 65536


@dataclass(frozen=True)
class Execution:
    """How one run ended: an exit status, or a time limit, or an error to start it."""

    argv: tuple[str, ...]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    error: str | None = None
    # processes of the tool's group still alive after SIGKILL and a wait
    survivors: tuple[int, ...] = ()


def group_members(pgid: int, proc_root: str = "/proc") -> list[int]:
    """The live processes of process group ``pgid`` (zombies are dead: they only wait to
    be reaped)."""
    members = []
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry.name}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _wait_group_dead(pgid: int, deadline: float) -> list[int]:
    while True:
        members = group_members(pgid)
        if not members or time.monotonic() >= deadline:
            return members
        time.sleep(0.01)


class StartError(Exception):
    """The tool could not be started; the message names it and says why."""


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The file ``program`` names, looked up on ``env``'s PATH unless it has a slash;
    StartError naming the program when there is none."""
    if "/" in program:
        if not os.path.exists(program):
            raise StartError(f"{program}: no such file")
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise StartError(f"{program}: not executable")
        return program
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise StartError(f"{program}: not found on PATH")
    return found


class Process:
    """A started tool whose output is collected until it exits or its deadline."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], output_limit: int) -> None:
        if output_limit <= 0:
            raise ValueError(f"output_limit must be positive, got {output_limit}")
        if not argv:
            raise ValueError("empty argv")
        self.argv = tuple(argv)
        self._limit = output_limit
        executable = resolve(self.argv[0], env)
        self._started = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                list(self.argv),
                executable=executable,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StartError(f"{self.argv[0]}: couldn't start: {exc.strerror or exc}") from None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._buffers: dict[int, bytearray] = {
            self._proc.stdout.fileno(): bytearray(),
            self._proc.stderr.fileno(): bytearray(),
        }
        self._truncated = False
        self._exited = False
        self._selector = selectors.DefaultSelector()
        for fd in self._buffers:
            self._selector.register(fd, selectors.EVENT_READ)
        try:
            self._pidfd: int | None = os.pidfd_open(self._proc.pid)
            self._selector.register(self._pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):
            self._pidfd = None  # no pidfd: fall back to polling the exit

    # --- collecting -------------------------------------------------------------------

    def _read(self, fd: int) -> None:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            self._selector.unregister(fd)
            return
        buffer = self._buffers[fd]
        room = self._limit - len(buffer)
        if len(chunk) > room:
            self._truncated = True
        buffer += chunk[: max(room, 0)]

    def _leader_exited(self) -> bool:
        # WNOWAIT leaves the leader a zombie: its pid (the group id) cannot be reused
        # until we reap it, so signalling the group stays safe
        if not self._exited:
            flags = os.WEXITED | os.WNOWAIT | os.WNOHANG
            self._exited = os.waitid(os.P_PID, self._proc.pid, flags) is not None
        return self._exited

    def _pump(self, deadline: float, stop: str | None = None) -> bool:
        """Collect output until the leader exits, ``stop`` appears on stdout (True) or
        the deadline passes."""
        out = self._buffers[self._proc.stdout.fileno()]  # type: ignore[union-attr]
        while True:
            if stop is not None and stop.encode() in out:
                return True
            if self._leader_exited():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            wait = remaining if self._pidfd is not None else min(remaining, 0.05)
            for key, _ in self._selector.select(wait):
                if key.fd == self._pidfd:
                    self._selector.unregister(key.fd)
                else:
                    self._read(key.fd)

    def _drain(self, deadline: float) -> None:
        while any(fd in self._selector.get_map() for fd in self._buffers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%s: output still open after the tool exited", self.argv[0])
                return
            for key, _ in self._selector.select(remaining):
                if key.fd in self._buffers:
                    self._read(key.fd)
                else:
                    self._selector.unregister(key.fd)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    # --- public -----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The tool's pid, which is also its process group's id."""
        return self._proc.pid

    def wait_for(self, text: str, deadline: float) -> bool:
        """Collect output until ``text`` appears on stdout (True), or the tool exits or
        the deadline passes (False)."""
        return self._pump(deadline, stop=text)

    def finish(self, deadline: float, kill_grace_s: float = 2.0) -> Execution:
        """Let the tool run until it exits or ``deadline``; then take its whole process
        group down and return what it printed."""
        try:
            self._pump(deadline)
            timed_out = not self._leader_exited()
            if timed_out:
                self._signal_group(signal.SIGTERM)
                self._pump(time.monotonic() + kill_grace_s)
            self._signal_group(signal.SIGKILL)
            # SIGKILL is delivered asynchronously: the check is over only once nothing
            # of it runs any more
            survivors = _wait_group_dead(self._proc.pid, time.monotonic() + _DEATH_S)
            if survivors:
                log.warning("%s: pids %s survived SIGKILL", self.argv[0], survivors)
            self._drain(time.monotonic() + _DRAIN_S)
            returncode = self._proc.wait()
        except BaseException:
            # interrupted (or a read failed): the tool must not outlive us
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
            raise
        finally:
            self._close()
        stdout, stderr = (bytes(b).decode("utf-8", "replace") for b in self._buffers.values())
        return Execution(
            argv=self.argv,
            returncode=None if timed_out else returncode,
            stdout=stdout,
            stderr=stderr,
            duration_s=time.monotonic() - self._started,
            timed_out=timed_out,
            truncated=self._truncated,
            survivors=tuple(survivors),
        )

    def _close(self) -> None:
        self._selector.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


def start(
    argv: Sequence[str], env: Mapping[str, str], output_limit: int = DEFAULT_OUTPUT_LIMIT
) -> Process:
    """Start ``argv`` in its own session; StartError when it cannot be started."""
    return Process(argv, env, output_limit)


def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str],
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    kill_grace_s: float = 2.0,
) -> Execution:
    """Run ``argv`` to completion or for at most ``timeout_s``; never raises for the
    tool's sake (a missing binary comes back as ``error``)."""
    began = time.monotonic()
    try:
        proc = start(argv, env, output_limit)
    except StartError as exc:
        return Execution(tuple(argv), error=str(exc), duration_s=time.monotonic() - began)
    return proc.finish(began + timeout_s, kill_grace_s)
