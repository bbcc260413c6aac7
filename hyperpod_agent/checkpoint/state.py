"""Turn a nested training state into a JSON skeleton plus a list of array leaves, and back.

Paths name a value inside the state with ``/`` between keys and list indices, e.g.
``optimizer/state/0/exp_avg``; every error and every ``replicated`` declaration uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hyperpod_agent.checkpoint import _torch
from hyperpod_agent.checkpoint.errors import TemplateMismatchError, UnsupportedStateError

Kind = Literal["np", "npscalar", "torch", "bytes", "bytearray"]
ALIGN = 64  # every leaf starts on a cache-line boundary so typed views are aligned


@dataclass
class Leaf:
    """One array-like value of the state and where its bytes go in a shard."""

    path: str
    kind: Kind
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    value: Any = None
    offset: int = 0

    def describe(self) -> dict[str, Any]:
        """The JSON form stored in a shard's metadata (without offset or checksum)."""
        return {
            "path": self.path,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
        }


def _child(path: str, key: object) -> str:
    return f"{path}/{key}" if path else str(key)


def _np_dtype_str(dtype: np.dtype[Any]) -> str:
    import json

    return json.dumps(np.lib.format.dtype_to_descr(dtype))


def np_dtype(text: str) -> np.dtype[Any]:
    """Inverse of the stored NumPy dtype description."""
    import json

    descr = json.loads(text)
    if isinstance(descr, list):
        descr = [tuple(f) for f in descr]
    return np.lib.format.descr_to_dtype(descr)


def flatten(state: Any) -> tuple[Any, list[Leaf]]:
    """Split ``state`` into a JSON-able skeleton and its leaves; raise naming the first bad path."""
    leaves: list[Leaf] = []

    def walk(value: Any, path: str) -> Any:
        if value is None or (
            isinstance(value, bool | int | float | str) and not isinstance(value, np.generic)
        ):
            return {"t": "val", "v": value}
        if isinstance(value, dict):
            keys: list[str | int] = []
            nodes = []
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, str | int):
                    raise UnsupportedStateError(
                        f"{_child(path, key)}: dict keys must be str or int, "
                        f"not {type(key).__name__}"
                    )
                keys.append(key)
                nodes.append(walk(item, _child(path, key)))
            return {"t": "dict", "k": keys, "v": nodes}
        if isinstance(value, list | tuple):
            kind = "list" if isinstance(value, list) else "tuple"
            return {"t": kind, "v": [walk(v, _child(path, i)) for i, v in enumerate(value)]}
        leaf = _leaf(value, path or "<root>")
        leaves.append(leaf)
        return {"t": "leaf", "i": len(leaves) - 1}

    skeleton = walk(state, "")
    return skeleton, leaves


def _leaf(value: Any, path: str) -> Leaf:
    if isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise UnsupportedStateError(f"{path}: NumPy arrays of dtype object are not supported")
        kind: Kind = "np" if isinstance(value, np.ndarray) else "npscalar"
        return Leaf(path, kind, _np_dtype_str(arr.dtype), arr.shape, arr.nbytes, arr)
    if isinstance(value, bytes | bytearray):
        kind = "bytes" if isinstance(value, bytes) else "bytearray"
        return Leaf(path, kind, "uint8", (len(value),), len(value), value)
    if _torch.is_tensor(value):
        dtype, shape, nbytes = _torch.describe(path, value)
        return Leaf(path, "torch", dtype, shape, nbytes, value)
    raise UnsupportedStateError(
        f"{path}: values of type {type(value).__module__}.{type(value).__qualname__} "
        "are not supported (use NumPy arrays, torch tensors, bytes, scalars, str, None, "
        "dict, list or tuple)"
    )


def layout(leaves: list[Leaf]) -> int:
    """Give each leaf an aligned offset; return the total size of the shard."""
    pos = 0
    for leaf in leaves:
        pos = -(-pos // ALIGN) * ALIGN
        leaf.offset = pos
        pos += leaf.nbytes
    return pos


def copy_leaf(leaf: Leaf, buf: np.ndarray) -> None:
    """Copy one leaf's bytes into ``buf`` at its offset (handles strides, byte order, devices)."""
    dest = buf[leaf.offset : leaf.offset + leaf.nbytes]
    if leaf.kind == "torch":
        _torch.copy_into(dest, leaf.value, leaf.dtype, leaf.shape)
    elif leaf.kind in ("bytes", "bytearray"):
        dest[:] = np.frombuffer(leaf.value, dtype=np.uint8)
    elif leaf.nbytes:
        np.copyto(dest.view(np_dtype(leaf.dtype)).reshape(leaf.shape), leaf.value, casting="no")


def materialize(entry: dict[str, Any], raw: np.ndarray, device: Any = None) -> Any:
    """Rebuild a leaf value from its stored description and raw bytes (``raw`` is kept)."""
    kind = entry["kind"]
    shape = tuple(entry["shape"])
    if kind == "torch":
        return _torch.from_bytes(raw, entry["dtype"], shape, device)
    if kind == "bytes":
        return raw.tobytes()
    if kind == "bytearray":
        return bytearray(raw.tobytes())
    dtype = np_dtype(entry["dtype"])
    arr = raw.view(dtype).reshape(shape) if raw.size else np.empty(shape, dtype=dtype)
    return arr[()] if kind == "npscalar" else arr


def rebuild(skeleton: Any, values: list[Any]) -> Any:
    """Inverse of :func:`flatten` given the materialized leaves."""
    t = skeleton["t"]
    if t == "val":
        return skeleton["v"]
    if t == "leaf":
        return values[skeleton["i"]]
    if t == "dict":
        return {k: rebuild(v, values) for k, v in zip(skeleton["k"], skeleton["v"], strict=True)}
    items = [rebuild(v, values) for v in skeleton["v"]]
    return items if t == "list" else tuple(items)


def check_template(
    skeleton: Any, entries: list[dict[str, Any]], template: Any, path: str = ""
) -> dict[int, Any]:
    """Check a stored skeleton against ``template``; return leaf index -> torch device wanted.

    Containers must have the same keys, arrays the same kind, dtype and shape; plain values in
    the template are placeholders and take the stored value.
    """
    where = path or "<root>"
    t = skeleton["t"]
    devices: dict[int, Any] = {}
    if t == "dict":
        if not isinstance(template, dict):
            raise TemplateMismatchError(
                f"{where}: checkpoint has a dict, template has {type(template).__name__}"
            )
        stored = list(skeleton["k"])
        missing = [k for k in template if k not in stored]
        extra = [k for k in stored if k not in template]
        if missing:
            raise TemplateMismatchError(f"{_child(path, missing[0])}: missing in the checkpoint")
        if extra:
            raise TemplateMismatchError(
                f"{_child(path, extra[0])}: in the checkpoint but not in the template"
            )
        for key, node in zip(stored, skeleton["v"], strict=True):
            devices.update(check_template(node, entries, template[key], _child(path, key)))
        return devices
    if t in ("list", "tuple"):
        if not isinstance(template, list | tuple) or len(template) != len(skeleton["v"]):
            raise TemplateMismatchError(
                f"{where}: checkpoint has a {t} of {len(skeleton['v'])}, template has "
                f"{type(template).__name__}"
                + (f" of {len(template)}" if isinstance(template, list | tuple) else "")
            )
        for i, node in enumerate(skeleton["v"]):
            devices.update(check_template(node, entries, template[i], _child(path, i)))
        return devices
    if t == "val":
        return devices
    entry = entries[skeleton["i"]]
    if template is None or isinstance(template, bool | int | float | str):
        return devices
    want = _leaf(template, where)
    if want.kind != entry["kind"] and {want.kind, entry["kind"]} != {"np", "npscalar"}:
        raise TemplateMismatchError(
            f"{where}: checkpoint has {entry['kind']}, template has {want.kind}"
        )
    if want.dtype != entry["dtype"] and want.kind not in ("bytes", "bytearray"):
        raise TemplateMismatchError(
            f"{where}: dtype {_show(entry['dtype'])} in the checkpoint, "
            f"{_show(want.dtype)} in the template"
        )
    if want.kind not in ("bytes", "bytearray") and tuple(entry["shape"]) != want.shape:
        raise TemplateMismatchError(
            f"{where}: shape {tuple(entry['shape'])} in the checkpoint, "
            f"{want.shape} in the template"
        )
    if want.kind == "torch":
        devices[skeleton["i"]] = template.device
    return devices


def _show(dtype: str) -> str:
    return dtype.strip('"')
