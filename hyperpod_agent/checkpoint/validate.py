"""Check a rank's metadata before anything is allocated or read on its word.

Metadata comes from a file another process wrote or from a peer over the network: a torn,
stale, corrupt or hostile document must make the restore fall back to the next source with
one line naming the file and the field, never crash it (a ``KeyError``, a ``MemoryError``
from an absurd size, an object dtype whose "values" would be pointers). Every size is tied
to the others: a leaf's bytes are its shape times its dtype's size, leaves are packed at
the aligned offsets the writer uses, the data size ends at the last leaf (the caller checks
it against the file's size). With a template, the shapes and dtypes are the template's
(checked next, in ``state.check_template``), so nothing bigger than the caller's own state
is allocated.
"""

from __future__ import annotations

import math
from typing import Any

from hyperpod_agent.checkpoint import _torch
from hyperpod_agent.checkpoint.errors import CheckpointError, CorruptShardError
from hyperpod_agent.checkpoint.state import ALIGN, np_dtype

KINDS = frozenset({"np", "npscalar", "torch", "bytes", "bytearray"})
MAX_DEPTH = 256  # containers nested deeper than any real training state
MAX_DIMS = 64


class _Bad(Exception):
    """One field is wrong; turned into a CorruptShardError naming the file."""


def _int(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{what} is {value!r}, not an integer")
    if value < low or (high is not None and value >= high):
        raise _Bad(f"{what} {value} is out of range")
    return value


def rank_meta(
    meta: dict[str, Any],
    label: object,
    *,
    step: int,
    rank: int,
    world_size: int,
) -> tuple[list[dict[str, Any]], Any]:
    """Validate one rank's metadata; return (entries, skeleton).

    Raises CorruptShardError naming ``label`` and the bad field, or CheckpointError when the
    checkpoint was saved by a job of another world size (no other source will differ).
    """
    try:
        got_step, got_rank = _int(meta.get("step"), "step"), _int(meta.get("rank"), "rank")
        if (got_step, got_rank) != (step, rank):
            raise _Bad(f"metadata is for step {got_step} rank {got_rank}")
        saved_by = _int(meta.get("world_size"), "world_size", 1)
        if saved_by != world_size:
            raise CheckpointError(
                f"step {step} was saved by {saved_by} ranks, this job has {world_size}"
            )
        data_size = _int(meta.get("data_size"), "data_size")
        raw = meta.get("entries")
        if not isinstance(raw, list):
            raise _Bad("entries is not a list")
        entries = [_entry(e, i, rank, world_size) for i, e in enumerate(raw)]
        _packing(entries, data_size)
        skeleton = meta.get("skeleton")
        seen: set[int] = set()
        _skeleton(skeleton, len(entries), seen, 0)
        if len(seen) != len(entries):
            raise _Bad(f"skeleton uses {len(seen)} of {len(entries)} leaves")
    except _Bad as exc:
        raise CorruptShardError(f"{label}: bad metadata: {exc}") from None
    return entries, skeleton


def _entry(e: object, i: int, rank: int, world_size: int) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise _Bad(f"leaf {i} is not an object")
    where = f"leaf {i}"
    if not isinstance(e.get("path"), str):
        raise _Bad(f"{where}: path is not a string")
    where = f"leaf {e['path']!r}"
    kind, dtype, shape = e.get("kind"), e.get("dtype"), e.get("shape")
    if kind not in KINDS:
        raise _Bad(f"{where}: unknown kind {kind!r}")
    if not isinstance(dtype, str):
        raise _Bad(f"{where}: dtype is not a string")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise _Bad(f"{where}: shape is not a list of at most {MAX_DIMS} sizes")
    dims = [_int(d, f"{where}: a dimension") for d in shape]
    itemsize = _itemsize(kind, dtype, where)
    if kind in ("bytes", "bytearray") and len(dims) != 1:
        raise _Bad(f"{where}: {kind} must have one dimension")
    if kind == "npscalar" and dims:
        raise _Bad(f"{where}: a scalar has no dimensions")
    nbytes = _int(e.get("nbytes"), f"{where}: nbytes")
    if nbytes != math.prod(dims) * itemsize:
        raise _Bad(f"{where}: nbytes {nbytes} does not match shape {dims} of {dtype}")
    if "owner" in e:
        owner = _int(e["owner"], f"{where}: owner", 0, world_size)
        if owner == rank:
            raise _Bad(f"{where}: refers to its own rank")
    else:
        _int(e.get("offset"), f"{where}: offset")
        _int(e.get("crc32"), f"{where}: crc32", 0, 1 << 32)
    return e


def _itemsize(kind: str, dtype: str, where: str) -> int:
    if kind in ("bytes", "bytearray"):
        if dtype != "uint8":
            raise _Bad(f"{where}: {kind} with dtype {dtype!r}")
        return 1
    if kind == "torch":
        size = _torch.element_size(dtype)  # CheckpointError if torch is not installed
        if size is None:
            raise _Bad(f"{where}: unknown torch dtype {dtype!r}")
        return size
    try:
        dt = np_dtype(dtype)
    except Exception as exc:  # noqa: BLE001 - any parse failure of stored text is corruption
        raise _Bad(f"{where}: unreadable dtype {dtype!r}: {exc}") from None
    if dt.hasobject:
        raise _Bad(f"{where}: dtype {dtype!r} holds Python objects")
    return int(dt.itemsize)


def _packing(entries: list[dict[str, Any]], data_size: int) -> None:
    """Leaves stored in this file sit at the writer's aligned offsets and fill it exactly."""
    pos = 0
    for e in entries:
        if "owner" in e:
            continue
        pos += -pos % ALIGN
        if e["offset"] != pos:
            raise _Bad(f"leaf {e['path']!r}: offset {e['offset']}, expected {pos}")
        pos += e["nbytes"]
    if pos != data_size:
        raise _Bad(f"data_size {data_size}, but the leaves end at {pos}")


def _skeleton(node: object, n: int, seen: set[int], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Bad(f"skeleton nested deeper than {MAX_DEPTH}")
    if not isinstance(node, dict):
        raise _Bad("skeleton node is not an object")
    t = node.get("t")
    if t == "val":
        v = node.get("v", ...)
        if v is not None and not isinstance(v, bool | int | float | str):
            raise _Bad(f"skeleton value of type {type(v).__name__}")
    elif t == "leaf":
        i = _int(node.get("i"), "skeleton leaf index", 0, n)
        if i in seen:
            raise _Bad(f"skeleton uses leaf {i} twice")
        seen.add(i)
    elif t in ("dict", "list", "tuple"):
        children = node.get("v")
        if not isinstance(children, list):
            raise _Bad(f"skeleton {t} without a list of values")
        if t == "dict":
            keys = node.get("k")
            if not isinstance(keys, list) or len(keys) != len(children):
                raise _Bad("skeleton dict keys do not match its values")
            if any(isinstance(k, bool) or not isinstance(k, str | int) for k in keys):
                raise _Bad("skeleton dict key is not a str or int")
        for child in children:
            _skeleton(child, n, seen, depth + 1)
    else:
        raise _Bad(f"skeleton node of unknown type {t!r}")


def fits_in_memory(size: int, label: str) -> None:
    """Refuse, as corruption, a size no buffer on this node could hold (a peer's claim)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
            else:
                return
    except (OSError, ValueError):
        return
    if size > avail:
        raise CorruptShardError(
            f"{label}: claims {size} bytes, more than this node has free ({avail})"
        )
