"""Zero-copy request bodies for the S3 store (s3store.py): the caller's buffers as byte
views, a body botocore can rewind without copying them, and the bytes of one multipart
part, copied only when it spans two buffers."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer


class ViewBody(io.RawIOBase):
    """A request body over a view of the caller's memory, sent with one ``sendall``.

    botocore rewinds any body that is not bytes/bytearray before a retry, so a bare
    memoryview cannot be retried; and http.client sends a file 8 KiB per ``read``, each a
    Python call taking the GIL (measured in bench/s3_clients.py: a busy training thread
    then halves the upload rate). So ``read`` returns the whole rest, whatever size it is
    asked for: every caller (http.client, the payload hash) loops until ``b""``.
    """

    def __init__(self, view: memoryview):
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = min(max(0, base + offset), len(self._view))
        return self._pos

    def read(self, size: int | None = -1) -> memoryview:
        out = self._view[self._pos :]
        self._pos = len(self._view)
        return out

    def __len__(self) -> int:
        return len(self._view) - self._pos


def byte_view(data: Buffer) -> memoryview:
    """``data`` as a flat view of bytes (no copy); ValueError if it is not contiguous."""
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("S3 buffers must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def part_source(segs: list[memoryview], start: int, length: int) -> Callable[[], Buffer]:
    """Bytes ``start:start+length`` of the concatenation of ``segs``: a view when they lie in
    one buffer, else a copy made when the part is sent (so copies are bounded)."""
    pieces: list[memoryview] = []
    pos = 0
    for s in segs:
        lo, hi = max(start, pos), min(start + length, pos + len(s))
        if lo < hi:
            pieces.append(s[lo - pos : hi - pos])
        pos += len(s)
    if len(pieces) == 1:
        one = pieces[0]
        return lambda: one
    return lambda: b"".join(pieces)
