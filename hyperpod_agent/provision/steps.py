"""Provisioning steps: each compares one desired result with what is there, and changes
only what differs. ``inspect`` never writes; ``apply`` is only called after ``inspect``
found a difference. The steps that write files are here; those that run a command
(pip, make, systemctl, mount) are in commands.py.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import stat
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BEGIN = "# BEGIN hyperpod (managed by `hyperpod provision`; edit provisioning_parameters.json)"
END = "# END hyperpod"


class StepError(Exception):
    """A step could not inspect or reach its desired state; the message says why."""


@dataclass(frozen=True)
class Change:
    """What a step would change: a short summary and, for files, a unified diff."""

    summary: str
    diff: str = ""


@dataclass
class Context:
    """State shared by the steps of one run."""

    dry_run: bool = False
    changed: set[str] = field(default_factory=set)
    env: dict[str, str] | None = None


class Step(ABC):
    """One desired result."""

    name: str
    network: bool = False  # retried with back-off: it talks to the network
    optional: bool = False  # a failure is logged and provisioning goes on

    @abstractmethod
    def inspect(self, ctx: Context) -> Change | None:
        """What differs from the desired result; None when nothing does."""

    @abstractmethod
    def apply(self, ctx: Context) -> None:
        """Reach the desired result."""


# --- files ----------------------------------------------------------------------------------


def read_if_present(path: Path) -> bytes | None:
    """The file's content; None if it does not exist, StepError if it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StepError(f"{path}: cannot read: {exc.strerror}") from None


def _diff(path: Path, old: bytes | None, new: bytes) -> str:
    try:
        a = (old or b"").decode().splitlines(keepends=True)
        b = new.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return f"binary {path}: sha256 {short_sha(old)} -> {short_sha(new)}\n"
    return "".join(difflib.unified_diff(a, b, f"{path} (current)", f"{path} (desired)"))


def short_sha(data: bytes | None) -> str:
    """The first 12 hex digits of the SHA-256 of ``data`` (``(none)`` for None)."""
    return hashlib.sha256(data).hexdigest()[:12] if data is not None else "(none)"


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write a file so readers see the old or the new content, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Directory(Step):
    def __init__(self, path: Path, mode: int = 0o755) -> None:
        self.path, self.mode, self.name = path, mode, f"directory {path}"

    def inspect(self, ctx: Context) -> Change | None:
        if not self.path.is_dir():
            return Change("create")
        current = self.path.stat().st_mode & 0o7777
        return None if current == self.mode else Change(f"mode {current:04o} -> {self.mode:04o}")

    def apply(self, ctx: Context) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, self.mode)


class File(Step):
    """A whole file with given content and mode."""

    def __init__(
        self, path: Path, content: str | bytes, mode: int = 0o644, owned_marker: str | None = None
    ) -> None:
        self.path, self.mode, self.name = path, mode, f"file {path}"
        self._content = content.encode() if isinstance(content, str) else content
        self.owned_marker = owned_marker
        self.keep_mode = False  # an existing file keeps its mode (we only add lines to it)

    def desired(self, current: bytes | None) -> bytes:
        """The content the file should have, given what it holds now."""
        return self._content

    def inspect(self, ctx: Context) -> Change | None:
        current = read_if_present(self.path)
        if current is not None and self.owned_marker is not None:
            if self.owned_marker.encode() not in current and current != self.desired(current):
                raise StepError(
                    f"{self.path} exists and was not written by hyperpod; merge it by hand "
                    f"or move it away"
                )
        desired = self.desired(current)
        if current is None:
            return Change(f"create (mode {self.mode:04o})", _diff(self.path, None, desired))
        parts = []
        if current != desired:
            parts.append("update content")
        mode = self.path.stat().st_mode & 0o7777
        if mode != self.mode and not self.keep_mode:
            parts.append(f"mode {mode:04o} -> {self.mode:04o}")
        if not parts:
            return None
        return Change(
            ", ".join(parts), _diff(self.path, current, desired) if current != desired else ""
        )

    def apply(self, ctx: Context) -> None:
        current = read_if_present(self.path)
        mode = self.mode
        if self.keep_mode and current is not None:
            mode = self.path.stat().st_mode & 0o7777
        write_atomic(self.path, self.desired(current), mode)


class Secret(Step):
    """A file the site puts in place, not provisioning: it must exist and be readable
    by its owner only. Nothing is ever written; a missing or exposed file stops the run
    before the configuration that names it is written."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key, self.name = path, key, f"secret {path}"

    def inspect(self, ctx: Context) -> Change | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise StepError(
                f"{self.path}: no such file ({self.key}: create it, mode 0600, on every "
                "controller node)"
            ) from None
        except OSError as exc:
            raise StepError(f"{self.path}: cannot read: {exc.strerror}") from None
        mode = st.st_mode & 0o7777
        if not stat.S_ISREG(st.st_mode) or mode not in (0o600, 0o400):
            what = f"mode {mode:04o}" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise StepError(f"{self.path}: {what}, expected 0600 or 0400 ({self.key})")
        return None

    def apply(self, ctx: Context) -> None:
        raise StepError(f"{self.path}: provisioning does not write secrets ({self.key})")


class CopyFile(File):
    """A file whose content comes from another file, read when the step runs (it may be
    built by an earlier step)."""

    def __init__(self, source: Path, path: Path, mode: int = 0o644) -> None:
        super().__init__(path, b"", mode)
        self.source = source

    def desired(self, current: bytes | None) -> bytes:
        data = read_if_present(self.source)
        if data is None:
            raise StepError(f"{self.source}: no such file")
        return data

    def inspect(self, ctx: Context) -> Change | None:
        if ctx.dry_run and not self.source.exists():
            return Change(f"install from {self.source} once it is built")
        return super().inspect(ctx)


class ManagedBlock(File):
    """Our lines inside a file someone else owns, between BEGIN/END markers, at its end."""

    begin, end = BEGIN, END  # comment lines in the file's own language

    def __init__(self, path: Path, block: str, mode: int = 0o644, must_exist: bool = False):
        super().__init__(path, b"", mode)
        self.block, self.must_exist = block, must_exist
        self.keep_mode = True  # the file is the site's: keep its mode
        self.name = f"block in {path}"

    def desired(self, current: bytes | None) -> bytes:
        text = (current or b"").decode()
        lines = text.splitlines()
        if self.begin in lines:
            start = lines.index(self.begin)
            end = lines.index(self.end, start) if self.end in lines[start:] else len(lines) - 1
            lines = lines[:start] + lines[end + 1 :]
        kept = "\n".join(lines).rstrip("\n")
        block = self.block.rstrip(chr(10))
        body = f"{self.begin}\n{block}\n{self.end}\n" if self.block.strip() else ""
        out = (kept + "\n" if kept else "") + (("\n" if kept and body else "") + body)
        return out.encode()

    def inspect(self, ctx: Context) -> Change | None:
        if self.must_exist and not self.path.exists():
            raise StepError(f"{self.path}: no such file (Slurm must be configured first)")
        if not self.path.exists() and not self.block.strip():
            return None
        return super().inspect(ctx)


class Symlink(Step):
    def __init__(self, path: Path, target: str) -> None:
        self.path, self.target, self.name = path, target, f"symlink {path}"

    def inspect(self, ctx: Context) -> Change | None:
        if self.path.is_symlink():
            current = os.readlink(self.path)
            return None if current == self.target else Change(f"{current} -> {self.target}")
        if self.path.exists():
            return Change(f"replace a non-link with a link to {self.target}")
        return Change(f"link to {self.target}")

    def apply(self, ctx: Context) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(self.target, tmp)
        os.replace(tmp, self.path)
