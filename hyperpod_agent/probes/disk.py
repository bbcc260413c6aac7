"""The disk probe: configured mounts are present, writable, answering and not full.

Presence and mount options come from ``/proc/self/mountinfo`` (under the procfs
root), which never touches the filesystems themselves. Everything that does touch a
filesystem — the write + fsync + unlink of a probe file and ``statvfs`` — runs in a
daemon thread per mount with a deadline: a thread stuck on a dead NFS/Lustre/FUSE
mount sits in the kernel and cannot be killed, so the probe stops waiting, reports
``fs_hung`` and never starts a second I/O on that mount while the first is stuck.

Users can fill any mount they can write, so a full one (``fs_full``,
``fs_inodes_full``) asks for DRAIN by default: no new jobs until it is emptied, never
a reboot or a replacement (a reboot does not empty a disk, tmpfs aside). The probe
file is made afresh under a random name (O_EXCL, O_NOFOLLOW): a file or symlink a user
put in a world-writable mount is never written through.

The agent runs sandboxed (``ProtectSystem=strict``): a mount is read-only for it unless
its unit lists it in ``ReadWritePaths``. The node's mount table (PID 1's) says whether
a mount is read-only on the node; the agent's own (``/proc/self/mountinfo``) whether it
is inside the sandbox. By default a mount is write-probed only where the agent may
write it. A write refused because of the sandbox, or one the agent was never allowed
(EACCES before any write succeeded), is a configuration finding that never drains or
reboots; a mount read-only on the node, or a write refused EROFS where the agent was
allowed to write, is the node's fault.
"""

from __future__ import annotations

import errno
import os
import posixpath
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes._baseline import baseline_of
from hyperpod_agent.probes._sysfs import MountEntry, parse_mountinfo, read_text, under
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig, ProbeContext

__all__ = ["DiskConfig", "DiskProbe", "MountCheck", "MountEntry", "parse_mountinfo"]


class MountCheck(BaseModel):
    """One ``[[probes.disk.mounts]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    name: str | None = Field(
        default=None, min_length=1, max_length=64, description="component name; the path"
    )
    required: bool = True
    write_probe: bool | None = Field(
        default=None, description="None: write where the agent's sandbox allows it"
    )
    free_warn_pct: float = Field(default=10.0, ge=0, le=100)
    free_fail_pct: float = Field(default=3.0, ge=0, le=100)
    inodes_warn_pct: float = Field(default=10.0, ge=0, le=100)
    inodes_fail_pct: float = Field(default=3.0, ge=0, le=100)
    # A drain, not a reboot: users fill what they can write, and a reboot empties only
    # a tmpfs (REBOOT there if that is the remedy you want; MONITOR: no drain).
    full_action: Action = Action.DRAIN

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"expected an absolute path, got {value!r}")
        return posixpath.normpath(value)

    @property
    def component(self) -> str:
        """How findings name this mount (``name``, else the path)."""
        return self.name or self.path

    @model_validator(mode="after")
    def _ordered(self) -> MountCheck:
        if len(self.component) > 64:
            raise ValueError(f"{self.path}: path longer than 64 characters; set a short name")
        if self.free_fail_pct > self.free_warn_pct:
            raise ValueError(f"{self.path}: free_fail_pct must not exceed free_warn_pct")
        if self.inodes_fail_pct > self.inodes_warn_pct:
            raise ValueError(f"{self.path}: inodes_fail_pct must not exceed inodes_warn_pct")
        return self


def _default_mounts() -> list[MountCheck]:
    return [MountCheck(path="/", write_probe=False)]


class DiskConfig(ProbeConfig):
    """``[probes.disk]``. By default only the free space of ``/`` is watched."""

    mounts: list[MountCheck] = Field(default_factory=_default_mounts)
    io_timeout_s: float = Field(default=3.0, gt=0)
    latency_warn_s: float = Field(default=1.0, gt=0)
    probe_file: str = Field(default=".hyperpod-probe", pattern=r"^[A-Za-z0-9._-]+$")

    @model_validator(mode="after")
    def _consistent(self) -> DiskConfig:
        paths = [m.path for m in self.mounts]
        if len(set(paths)) != len(paths):
            raise ValueError(f"mounts: duplicate paths in {paths}")
        if self.io_timeout_s >= self.timeout_s:
            raise ValueError(
                f"io_timeout_s ({self.io_timeout_s}) must be below timeout_s ({self.timeout_s})"
            )
        if self.latency_warn_s >= self.io_timeout_s:
            raise ValueError("latency_warn_s must be below io_timeout_s")
        return self


@dataclass(frozen=True)
class Space:
    """The part of ``statvfs`` the probe judges."""

    blocks: int
    blocks_avail: int
    files: int
    files_avail: int


@dataclass(frozen=True)
class IoResult:
    """What the I/O thread measured on one mount."""

    write_latency_s: float | None = None
    write_errno: int | None = None
    space: Space | None = None
    error: str | None = None
    crash: str | None = None


def read_mountinfo(context: ProbeContext) -> dict[str, MountEntry]:
    """The node's mount table: PID 1's mount namespace, the one jobs see.

    Not our own: under the unit's ProtectSystem=/ProtectHome= the agent sees / and
    /home bind-remounted read-only, which is not a fault of the node.
    """
    for source in ("/1/mountinfo", "/self/mountinfo"):
        text = read_text(under(context.procfs_root, source))
        if text is not None:
            return parse_mountinfo(text)
    raise FileNotFoundError("no /proc/1/mountinfo or /proc/self/mountinfo under the procfs root")


def read_own_mountinfo(context: ProbeContext) -> dict[str, MountEntry] | None:
    """The agent's own mount table (its unit's sandbox), None when unreadable."""
    try:
        text = read_text(under(context.procfs_root, "/self/mountinfo"))
    except OSError:
        return None
    return parse_mountinfo(text) if text is not None else None


def sandbox_denies(node: MountEntry, own: MountEntry | None) -> bool:
    """Is a mount that is writable on the node closed to the agent by its sandbox:
    hidden from it, read-only only for it, or another filesystem over it?"""
    if node.readonly:
        return False
    if own is None:
        return True
    return (own.readonly and not node.readonly) or (own.fstype, own.source) != (
        node.fstype,
        node.source,
    )


def judge_space(check: MountCheck, space: Space) -> list[Finding]:
    """Free blocks and inodes against the mount's thresholds (pure)."""
    findings = []
    for kind, total, avail, warn, fail, (full_code, low_code) in (
        (
            "space",
            space.blocks,
            space.blocks_avail,
            check.free_warn_pct,
            check.free_fail_pct,
            ("fs_full", "fs_space_low"),
        ),
        (
            "inodes",
            space.files,
            space.files_avail,
            check.inodes_warn_pct,
            check.inodes_fail_pct,
            ("fs_inodes_full", "fs_inodes_low"),
        ),
    ):
        if total <= 0:  # some filesystems (btrfs inodes, FUSE) report no totals
            continue
        pct = 100.0 * avail / total
        if pct <= fail:
            status, action, code = Status.FAIL, check.full_action, full_code
        elif pct <= warn:
            status, action, code = Status.WARN, Action.MONITOR, low_code
        else:
            continue
        findings.append(_fail(check.component, code, f"{pct:.1f}% {kind} free", action, status))
    return findings


def run_io(path: str, write: bool, probe_file: str) -> IoResult:
    """Write + fsync + unlink a probe file (when asked), then statvfs. Blocks as long
    as the filesystem does: call it only from a worker thread."""
    latency = None
    write_errno = None
    if write:
        # a fresh file under a name no user can guess: never one they made for us
        target = os.path.join(path, f"{probe_file}.{os.getpid()}.{secrets.token_hex(8)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        start = time.monotonic()
        try:
            fd = os.open(target, flags, 0o600)
            try:
                os.write(fd, b"hyperpod\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(target)
            latency = time.monotonic() - start
        except OSError as exc:
            write_errno = exc.errno
    try:
        vfs = os.statvfs(path)
    except OSError as exc:
        return IoResult(latency, write_errno, None, f"statvfs: {exc.strerror}")
    return IoResult(
        latency, write_errno, Space(vfs.f_blocks, vfs.f_bavail, vfs.f_files, vfs.f_favail)
    )


IoFunc = Callable[[str, bool, str], IoResult]


class _IoJob:
    """One I/O attempt on one mount, run in a daemon thread that is never joined."""

    def __init__(self, io: IoFunc, path: str, write: bool, probe_file: str) -> None:
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result: IoResult | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(io, path, write, probe_file),
            name=f"disk-io:{path}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, io: IoFunc, path: str, write: bool, probe_file: str) -> None:
        try:
            self.result = io(path, write, probe_file)
        except Exception as exc:  # noqa: BLE001 - reported as the probe's error
            self.result = IoResult(crash=f"{type(exc).__name__}: {exc}")
        finally:
            self.done.set()


class DiskProbe(Probe[DiskConfig]):
    name = "disk"
    config_model = DiskConfig

    def __init__(self, config: DiskConfig, context: ProbeContext, io: IoFunc = run_io) -> None:
        super().__init__(config, context)
        self._io = io
        self._jobs: dict[str, _IoJob] = {}
        self._wrote: set[str] = set()  # mounts a probe write succeeded on

    def check(self) -> Outcome:
        """Check every configured mount (and every mount of the baseline) once, within
        ``io_timeout_s``."""
        cfg = self.config
        table = read_mountinfo(self.context)
        own = read_own_mountinfo(self.context)
        baseline = baseline_of(self.context.baseline)
        recorded = set(baseline.disk.mounts) if baseline is not None else set()
        findings: list[Finding] = []
        started: dict[str, tuple[MountCheck, _IoJob, bool, bool]] = {}
        unprobed: list[str] = []
        for path in sorted(recorded - {c.path for c in cfg.mounts}):
            if path not in table:
                findings.append(_fail(path[:64], "fs_missing", "not mounted (in the baseline)"))
        for check in cfg.mounts:
            entry = table.get(check.path)
            if entry is None:
                if check.required or check.path in recorded:
                    findings.append(_fail(check.component, "fs_missing", "not mounted"))
                continue
            if entry.readonly:
                findings.append(self._readonly(check, "mounted read-only"))
            previous = self._jobs.get(check.path)
            if previous is not None and not previous.done.is_set():
                stuck = time.monotonic() - previous.started
                findings.append(self._hung(check, f"I/O still stuck after {stuck:.0f}s"))
                continue
            denied = own is not None and sandbox_denies(entry, own.get(check.path))
            write = not entry.readonly and check.write_probe is not False
            if check.write_probe is None and denied:
                write = False  # auto: the unit may not write here; statvfs only
                unprobed.append(check.component)
            job = _IoJob(self._io, check.path, write, cfg.probe_file)
            self._jobs[check.path] = job
            started[check.path] = (check, job, write, denied)
        deadline = time.monotonic() + cfg.io_timeout_s
        latencies = []
        for check, job, write, denied in started.values():
            if not job.done.wait(max(0.0, deadline - time.monotonic())):
                findings.append(self._hung(check, f"no answer within {cfg.io_timeout_s:g}s"))
                continue
            assert job.result is not None
            findings.extend(self._judge(check, job.result, write, denied))
            if job.result.write_latency_s is not None:
                self._wrote.add(check.path)
                latencies.append(
                    f"{check.component} write {job.result.write_latency_s * 1e3:.1f}ms"
                )
        absent = sum(1 for c in cfg.mounts if c.path not in table)
        ok = f"{len(cfg.mounts) - absent} mount(s) ok"
        ok += f" ({', '.join(latencies)})" if latencies else ""
        ok += f", {absent} optional mount(s) absent" if absent else ""
        if unprobed:
            ok += f", not written (read-only in the agent's sandbox): {', '.join(unprobed)}"
        return Outcome.from_findings(findings, ok_message=ok)

    def _judge(
        self, check: MountCheck, result: IoResult, write: bool, denied: bool = False
    ) -> list[Finding]:
        if result.crash is not None:
            raise RuntimeError(f"{check.path}: I/O check crashed: {result.crash}")
        findings = judge_space(check, result.space) if result.space is not None else []
        code = result.write_errno
        never_wrote = check.path not in self._wrote
        if code in (errno.EROFS, errno.EACCES, errno.EPERM) and (
            denied or (code != errno.EROFS and never_wrote)
        ):
            findings.append(self._not_allowed(check, code, denied))
        elif code == errno.EROFS:
            findings.append(self._readonly(check, "write refused: read-only file system"))
        elif result.write_errno is not None:
            full = result.write_errno in (errno.ENOSPC, errno.EDQUOT)
            if not (full and any(f.status is Status.FAIL for f in findings)):
                why = f"probe write failed: {os.strerror(result.write_errno)}"
                if full:
                    findings.append(_fail(check.component, "fs_full", why, check.full_action))
                else:
                    findings.append(_fail(check.component, "fs_write_error", why))
        latency = result.write_latency_s
        if write and latency is not None and latency >= self.config.latency_warn_s:
            took = f"probe write took {latency:.2f}s"
            findings.append(_fail(check.component, "fs_slow", took, Action.MONITOR, Status.WARN))
        if result.error is not None:
            findings.append(_fail(check.component, "fs_error", result.error))
        return findings

    @staticmethod
    def _not_allowed(check: MountCheck, code: int, denied: bool) -> Finding:
        """The configuration finding for a write the agent was never allowed."""
        if denied:
            why = (
                "read-write on the node, closed to the agent by its unit's sandbox: add "
                f"ReadWritePaths={check.path} to the unit (a drop-in) or set write_probe = false"
            )
        else:
            why = (
                "the agent was never allowed to write here (root squashed?): let it, or "
                "set write_probe = false"
            )
        return Finding(
            component=check.component,
            code="config_write_denied",
            status=Status.WARN,
            action=Action.NONE,
            message=f"probe write refused ({os.strerror(code)}): {why}"[:512],
        )

    @staticmethod
    def _readonly(check: MountCheck, message: str) -> Finding:
        return _fail(check.component, "fs_readonly", message)

    @staticmethod
    def _hung(check: MountCheck, message: str) -> Finding:
        return _fail(check.component, "fs_hung", message)


def _fail(
    path: str, code: str, message: str, action: Action = Action.REBOOT, status: Status = Status.FAIL
) -> Finding:
    return Finding(component=path, code=code, status=status, action=action, message=message)
