"""Writing a large buffer to disk fast and durably (Linux).

A plain ``write`` + ``fsync`` copies the buffer into the page cache (allocating every page,
which on a VM with free page reporting costs a host fault per page) and only then, at
``fsync``, starts writing it to the disk: the copy and the disk never overlap. On the
benchmark VM (ext4 on virtio, 2 vCPUs) O_DIRECT wrote 1.5-3x faster than a plain
write+fsync, and buffered writes whose writeback starts chunk by chunk came close to it
(bench/checkpoint.py prints all three as ceilings; figures in docs/checkpoint.md).

So the persistent tier writes the staging buffer with O_DIRECT when it is the whole file
(block-aligned address and size: the bulk goes straight from the buffer to the device,
and ``fsync`` has only the tail and metadata left), and otherwise with buffered writes
whose writeback :func:`start_writeback` starts chunk by chunk. File systems without
O_DIRECT (ramfs, some FUSE; tmpfs before Linux 6.6) raise :class:`DirectUnsupported` and
get buffered writes.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Callable

import numpy as np

ALIGN = 4096  # a multiple of every device's logical block size
CHUNK = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages, do not wait


class DirectUnsupported(OSError):
    """This file system (or this buffer) cannot be written with O_DIRECT."""


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sfr = _sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing ``length`` dirty bytes at ``offset`` to the disk now, without waiting
    (best effort: ``fsync`` makes them durable either way). ctypes releases the GIL."""
    if _sfr is not None and length > 0:
        _sfr(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def direct_capable(buf: np.ndarray) -> bool:
    """The buffer can be the source of O_DIRECT writes: block-aligned and at least a block."""
    return buf.nbytes >= ALIGN and buf.ctypes.data % ALIGN == 0 and buf.flags.c_contiguous


def open_direct(path: str | os.PathLike[str]) -> int:
    """Create ``path`` for O_DIRECT writes; DirectUnsupported if the file system refuses."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise DirectUnsupported("no O_DIRECT on this file system") from exc
        raise


def write_direct(fd: int, buf: np.ndarray, ready: Callable[[int], None] | None = None) -> None:
    """Write ``buf`` to ``fd`` (opened by :func:`open_direct`) from offset 0: the aligned
    bulk with O_DIRECT, chunk by chunk (``ready(end)`` first, if given), the tail buffered.
    DirectUnsupported if the first write is refused."""
    view = buf.data.cast("B")
    bulk = len(view) // ALIGN * ALIGN
    at = 0
    while at < bulk:
        end = min(bulk, at + CHUNK)
        if ready is not None:
            ready(end)
        try:
            n = os.pwrite(fd, view[at:end], at)
        except OSError as exc:
            if exc.errno == errno.EINVAL and at == 0:
                raise DirectUnsupported("O_DIRECT writes refused") from exc
            raise
        at += n
        if at % ALIGN:
            break  # a short write left us unaligned: finish buffered
    # The tail (and anything after a short write) is written through the page cache.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    if ready is not None and at < len(view):
        ready(len(view))
    while at < len(view):
        n = os.pwrite(fd, view[at:], at)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        at += n
