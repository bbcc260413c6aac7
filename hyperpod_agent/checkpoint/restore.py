"""Reading one rank's shard of one step from one tier, verified, into a state."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import layout, state, validate
from hyperpod_agent.checkpoint.errors import CorruptShardError
from hyperpod_agent.checkpoint.replica_client import ReplicaClient


@dataclass
class RestoreInfo:
    """Where the last restore came from and which shards were skipped on the way."""

    step: int
    tier: str
    source: str
    fallbacks: list[str] = field(default_factory=list)


class Source:
    """One place a shard can be read from: a tier directory or a peer's replica server.

    ``run`` (fast tiers): the run id every metadata read here must carry; a shard of
    another run is refused. ``committed`` (persistent tier): a step's ``step.json`` names
    the save it committed, and a rank's metadata of another save is refused.
    """

    tier: str
    run: str | None = None
    committed: bool = False

    def label(self, step: int, name: str) -> str:
        """How a shard file of this source is named in messages."""
        raise NotImplementedError

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        """A rank's metadata for a step."""
        raise NotImplementedError

    def size(self, step: int, rank: int) -> int | None:
        """The size of a rank's data file, if known before fetching it."""
        return None

    def commit_save(self, step: int) -> str | None:
        """The save a committed step is made of (None: not recorded, or not applicable)."""
        return None

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        """A rank's whole data file."""
        raise NotImplementedError

    def data_range(self, step: int, rank: int, offset: int, size: int) -> np.ndarray:
        """Part of a rank's data file."""
        return self.data(step, rank, offset + size)[offset : offset + size]


class DirSource(Source):
    """A tier directory (memory or persistent)."""

    def __init__(self, tier: str, root: Path, run: str | None = None, committed: bool = False):
        self.tier, self.root, self.run, self.committed = tier, root, run, committed
        self._saves: dict[int, str | None] = {}

    def label(self, step: int, name: str) -> str:
        return str(layout.step_dir(self.root, step) / name)

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        return layout.read_json(layout.step_dir(self.root, step) / layout.meta_name(rank))

    def size(self, step: int, rank: int) -> int | None:
        try:
            return os.stat(layout.step_dir(self.root, step) / layout.data_name(rank)).st_size
        except FileNotFoundError:
            raise CorruptShardError(
                f"{self.label(step, layout.data_name(rank))}: missing"
            ) from None
        except OSError as exc:
            raise CorruptShardError(
                f"{self.label(step, layout.data_name(rank))}: unreadable: {exc.strerror or exc}"
            ) from None

    def commit_save(self, step: int) -> str | None:
        if not self.committed:
            return None
        if step not in self._saves:
            doc = layout.read_json(layout.step_dir(self.root, step) / layout.STEP_META)
            save = doc.get("save")
            self._saves[step] = save if isinstance(save, str) else None
        return self._saves[step]

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        return layout.read_file(layout.step_dir(self.root, step) / layout.data_name(rank), size)

    def data_range(self, step: int, rank: int, offset: int, size: int) -> np.ndarray:
        path = layout.step_dir(self.root, step) / layout.data_name(rank)
        return layout.read_range(path, offset, size)


class PeerSource(Source):
    """Another node's replica server (the client is bound to this run's namespace)."""

    tier = "peer"

    def __init__(self, node: str, client: ReplicaClient, streams: int = 1, run: str | None = None):
        self.node, self.client, self.streams, self.run = node, client, streams, run

    def label(self, step: int, name: str) -> str:
        return f"peer {self.node}:step-{step:010d}/{name}"

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        raw = self.client.get(step, layout.meta_name(rank))
        return layout.parse_meta(raw.tobytes(), self.label(step, layout.meta_name(rank)))

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        # The size is the peer's own claim: refuse one no buffer here could hold. A short or
        # long file is a ReplicaError naming the shard; the loader falls back.
        validate.fits_in_memory(size, self.label(step, layout.data_name(rank)))
        return self.client.fetch(step, layout.data_name(rank), size, self.streams)


def _checked_meta(
    src: Source, step: int, rank: int, world_size: int
) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """A rank's metadata from ``src``, validated, of this run and of the committed save."""
    label = src.label(step, layout.meta_name(rank))
    meta = src.meta(step, rank)
    entries, skeleton = validate.rank_meta(meta, label, step=step, rank=rank, world_size=world_size)
    size = src.size(step, rank)
    if size is not None and size != meta["data_size"]:
        raise CorruptShardError(
            f"{src.label(step, layout.data_name(rank))}: size differs from its metadata "
            f"({meta['data_size']} bytes expected, {size} found)"
        )
    if src.run is not None and meta.get("run") != src.run:
        raise CorruptShardError(
            f"{label}: belongs to another run ({meta.get('run')!r}), not this one; ignoring it"
        )
    want = src.commit_save(step)
    if want is not None and meta.get("save") != want:
        raise CorruptShardError(
            f"{label}: written by save {meta.get('save')!r}, but step {step} was committed "
            f"for save {want!r}"
        )
    return meta, entries, skeleton


def read_state(src: Source, step: int, rank: int, world_size: int, template: Any) -> Any:
    """Read, verify and rebuild ``rank``'s state of ``step`` from ``src``.

    Raises CorruptShardError naming the shard when anything is missing or wrong, and
    TemplateMismatchError (before reading any data) when the template does not fit.
    """
    meta, entries, skeleton = _checked_meta(src, step, rank, world_size)
    devices = state.check_template(skeleton, entries, template) if template is not None else {}
    buf = src.data(step, rank, meta["data_size"])
    data_label = src.label(step, layout.data_name(rank))
    layout.verify_entries(data_label, buf, entries)
    values = []
    owner_entries: dict[int, dict[str, dict[str, Any]]] = {}
    for i, e in enumerate(entries):
        if "owner" in e:
            raw = _owned_elsewhere(src, step, e, world_size, owner_entries)
        else:
            raw = buf[e["offset"] : e["offset"] + e["nbytes"]]
        values.append(state.materialize(e, raw, devices.get(i)))
    return state.rebuild(skeleton, values)


def _owned_elsewhere(
    src: Source,
    step: int,
    ref: dict[str, Any],
    world_size: int,
    cache: dict[int, dict[str, dict[str, Any]]],
) -> np.ndarray:
    """A replicated leaf that rank ``ref["owner"]`` wrote for everyone (persistent tier)."""
    owner, path = ref["owner"], ref["path"]
    if owner not in cache:
        _, entries, _ = _checked_meta(src, step, owner, world_size)
        cache[owner] = {e["path"]: e for e in entries}
    e = cache[owner].get(path)
    label = src.label(step, layout.data_name(owner))
    if e is None or "owner" in e or e["nbytes"] != ref["nbytes"]:
        raise CorruptShardError(f"{label}: does not hold replicated leaf {path!r}")
    raw = src.data_range(step, owner, e["offset"], e["nbytes"])
    if layout.checksum(raw) != e["crc32"]:
        raise CorruptShardError(f"{label}: checksum mismatch in leaf {path!r}")
    return raw
