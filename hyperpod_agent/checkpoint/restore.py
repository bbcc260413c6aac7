"""Reading one rank's shard of one step from one tier, verified, into a state."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import layout, state
from hyperpod_agent.checkpoint.errors import CheckpointError, CorruptShardError
from hyperpod_agent.checkpoint.replica import ReplicaClient


@dataclass
class RestoreInfo:
    """Where the last restore came from and which shards were skipped on the way."""

    step: int
    tier: str
    source: str
    fallbacks: list[str] = field(default_factory=list)


class Source:
    """One place a shard can be read from: a tier directory or a peer's replica server."""

    tier: str

    def label(self, step: int, name: str) -> str:
        """How a shard file of this source is named in messages."""
        raise NotImplementedError

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        """A rank's metadata for a step."""
        raise NotImplementedError

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        """A rank's whole data file."""
        raise NotImplementedError

    def data_range(self, step: int, rank: int, offset: int, size: int) -> np.ndarray:
        """Part of a rank's data file."""
        return self.data(step, rank, offset + size)[offset : offset + size]


class DirSource(Source):
    """A tier directory (memory or persistent)."""

    def __init__(self, tier: str, root: Path):
        self.tier, self.root = tier, root

    def label(self, step: int, name: str) -> str:
        return str(layout.step_dir(self.root, step) / name)

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        return layout.read_json(layout.step_dir(self.root, step) / layout.meta_name(rank))

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        return layout.read_file(layout.step_dir(self.root, step) / layout.data_name(rank), size)

    def data_range(self, step: int, rank: int, offset: int, size: int) -> np.ndarray:
        path = layout.step_dir(self.root, step) / layout.data_name(rank)
        return layout.read_range(path, offset, size)


class PeerSource(Source):
    """Another node's replica server."""

    tier = "peer"

    def __init__(self, node: str, client: ReplicaClient, streams: int = 1):
        self.node, self.client, self.streams = node, client, streams

    def label(self, step: int, name: str) -> str:
        return f"peer {self.node}:step-{step:010d}/{name}"

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        raw = self.client.get(step, layout.meta_name(rank))
        try:
            obj = json.loads(raw.tobytes())
        except ValueError as exc:
            raise CorruptShardError(
                f"{self.label(step, layout.meta_name(rank))}: unreadable metadata: {exc}"
            ) from exc
        if not isinstance(obj, dict) or obj.get("format") != layout.FORMAT:
            raise CorruptShardError(
                f"{self.label(step, layout.meta_name(rank))}: not a checkpoint metadata file"
            )
        return obj

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        # A short or long file is a ReplicaError naming the shard; the loader falls back.
        return self.client.fetch(step, layout.data_name(rank), size, self.streams)


def read_state(src: Source, step: int, rank: int, world_size: int, template: Any) -> Any:
    """Read, verify and rebuild ``rank``'s state of ``step`` from ``src``.

    Raises CorruptShardError naming the shard when anything is missing or wrong, and
    TemplateMismatchError (before reading any data) when the template does not fit.
    """
    meta_label = src.label(step, layout.meta_name(rank))
    meta = src.meta(step, rank)
    try:
        entries: list[dict[str, Any]] = meta["entries"]
        skeleton = meta["skeleton"]
        if meta["step"] != step or meta["rank"] != rank:
            raise CorruptShardError(
                f"{meta_label}: metadata is for step {meta['step']} rank {meta['rank']}"
            )
        if meta["world_size"] != world_size:
            raise CheckpointError(
                f"step {step} was saved by {meta['world_size']} ranks, this job has {world_size}"
            )
        size = int(meta["data_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptShardError(f"{meta_label}: incomplete metadata: {exc}") from exc
    devices = state.check_template(skeleton, entries, template) if template is not None else {}
    buf = src.data(step, rank, size)
    data_label = src.label(step, layout.data_name(rank))
    layout.verify_entries(data_label, buf, entries)
    values = []
    owner_metas: dict[int, dict[str, dict[str, Any]]] = {}
    for i, e in enumerate(entries):
        if "owner" in e:
            raw = _owned_elsewhere(src, step, int(e["owner"]), e["path"], owner_metas)
        else:
            raw = buf[e["offset"] : e["offset"] + e["nbytes"]]
        values.append(state.materialize(e, raw, devices.get(i)))
    return state.rebuild(skeleton, values)


def _owned_elsewhere(
    src: Source, step: int, owner: int, path: str, cache: dict[int, dict[str, dict[str, Any]]]
) -> np.ndarray:
    """A replicated leaf that rank ``owner`` wrote for everyone (persistent tier)."""
    if owner not in cache:
        cache[owner] = {e["path"]: e for e in src.meta(step, owner)["entries"]}
    e = cache[owner].get(path)
    label = src.label(step, layout.data_name(owner))
    if e is None or "owner" in e:
        raise CorruptShardError(f"{label}: does not hold replicated leaf {path!r}")
    raw = src.data_range(step, owner, int(e["offset"]), int(e["nbytes"]))
    if layout.checksum(raw) != e["crc32"]:
        raise CorruptShardError(f"{label}: checksum mismatch in leaf {path!r}")
    return raw
