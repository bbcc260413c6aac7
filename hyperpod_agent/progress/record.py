"""A rank's progress record, made safely (used by hyperpod_agent.progress).

Under the shared root (mode 1777, shared_root.py), in a directory of this user that nobody
else may write, the record is written whole under a temporary name and renamed into place,
so it is always fresh and always complete; nothing is ever opened through a symbolic link,
and a path that is not a regular file of this user is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets
import stat
import time
from pathlib import Path

from hyperpod_agent.progress import format as fmt
from hyperpod_agent.shared_root import open_shared_root


class Refused(Exception):
    """The record cannot be made safely; the message names the path and why."""


def initial(job: int, rank: int, factor: float, floor: float) -> bytes:
    """A new record of this process: no step yet, not paused, the hang overrides given."""
    data = bytearray(fmt.SIZE)
    fmt.HEADER.pack_into(data, 0, fmt.MAGIC, fmt.VERSION, 0)
    fmt.IDENTITY.pack_into(data, fmt.IDENTITY_OFFSET, os.getpid(), job, rank)
    fmt.STATE.pack_into(data, fmt.STATE_OFFSET, 0, time.time(), -1, 0.0, 0.0, b"", factor, floor)
    return bytes(data)


def create(base: Path, target: Path, content: bytes) -> mmap.mmap:
    """Make ``target`` fresh under the shared root ``base`` and map it; raises Refused."""
    where = base
    with contextlib.ExitStack() as fds:
        try:
            root_fd = open_shared_root(base)
            fds.callback(os.close, root_fd)
            where = target.parent
            dir_fd = _job_dir(root_fd, target.parent)
            fds.callback(os.close, dir_fd)
            where = target
            return _fresh(dir_fd, target, content)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused(f"{where}: a symbolic link; not following it") from exc
            raise Refused(f"{where}: {exc.strerror or exc}") from exc


def _job_dir(root_fd: int, path: Path) -> int:
    """The job's directory (0755, ours, nobody else may write in it), opened."""
    try:
        os.mkdir(path.name, 0o755, dir_fd=root_fd)
        created = True
    except FileExistsError:
        created = False
    fd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    try:
        st, me = os.fstat(fd), os.geteuid()
        if st.st_uid != me:
            raise Refused(f"{path}: belongs to uid {st.st_uid}, not to this user (uid {me})")
        if created:
            os.fchmod(fd, 0o755)  # whatever the umask
        elif st.st_mode & 0o022:
            raise Refused(f"{path}: others may write in it (mode {stat.S_IMODE(st.st_mode):o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fresh(dir_fd: int, target: Path, content: bytes) -> mmap.mmap:
    """Write ``content`` under a new name, map it, and rename it over ``target``."""
    name = target.name
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise Refused(f"{target}: not a regular file of this user; leaving it alone")
        holder = _holder(dir_fd, name)
        if holder == os.getppid():
            raise Refused(
                f"{target}: the record of this process's parent (pid {holder}), which "
                "records this rank; a child records nothing"
            )
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: the agent reads it
        # Written, not just sized: a page of tmpfs we could not get would be a SIGBUS on
        # the first step, where a full /dev/shm is an error here.
        if os.write(fd, content) != len(content):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        mapped = mmap.mmap(fd, fmt.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            mapped.close()
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
    return mapped


def _holder(dir_fd: int, name: str) -> int | None:
    """The pid in an existing record, if it is one."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            data = os.pread(fd, fmt.IDENTITY_OFFSET + fmt.IDENTITY.size, 0)
        finally:
            os.close(fd)
    except OSError:
        return None
    if len(data) < fmt.IDENTITY_OFFSET + fmt.IDENTITY.size or not data.startswith(fmt.MAGIC):
        return None
    pid: int = fmt.IDENTITY.unpack_from(data, fmt.IDENTITY_OFFSET)[0]
    return pid
