"""Steps of the persistent tier in an object store: commit, discovery and retention.

The keys mirror the filesystem tier (layout.py) under the store's prefix::

    step-0000000100/rank-00003.bin    a rank's leaf bytes
    step-0000000100/rank-00003.json   its metadata (CRC-32 per leaf), written after the data
    step-0000000100/step.json         the manifest, written last by rank 0: the commit

An object store has no rename, but every PUT (and multipart completion) is atomic: an object
is whole or absent. So each file is written straight under its final name, and the order of
the writes carries the guarantees the filesystem tier gets from rename:

- a step is visible (committed) only once its manifest exists, and the manifest is written
  only after every rank's metadata is listed;
- retention deletes a step's manifest in a request of its own, before the rest, so a step
  half deleted by a killed job is never taken for complete;
- a step a killed job half wrote has no manifest: discovery ignores it, and retention removes
  it once it is older than the steps kept (a newer one may still be in flight).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from hyperpod_agent.checkpoint import layout
from hyperpod_agent.checkpoint.layout import StepInfo
from hyperpod_agent.checkpoint.s3store import S3Store

log = logging.getLogger(__name__)

_KEY = re.compile(r"^step-(\d{10})/(.+)$")
_SHARD = re.compile(r"^rank-(\d{5})\.json$")


def step_prefix(step: int) -> str:
    """The key prefix of ``step`` (same name as the filesystem tier's step directory)."""
    return f"step-{step:010d}/"


def scan(store: S3Store) -> dict[int, StepInfo]:
    """What the store holds of each step, from one listing (nothing is read or verified)."""
    steps: dict[int, StepInfo] = {}
    for obj in store.list_objects("step-"):
        m = _KEY.match(obj.name)
        if not m:
            continue
        info = steps.setdefault(int(m.group(1)), StepInfo(int(m.group(1))))
        shard = _SHARD.match(m.group(2))
        if shard:
            info.ranks.add(int(shard.group(1)))
        elif m.group(2) == layout.STEP_META:
            info.committed = True
    return steps


def commit(store: S3Store, step: int, manifest: dict[str, Any]) -> None:
    """Write the manifest of ``step``: the step becomes visible. Call it only once every
    rank's metadata is in the store (``scan(store)[step].complete(world_size)``)."""
    body = json.dumps(manifest, separators=(",", ":")).encode()
    store.put(step_prefix(step) + layout.STEP_META, body)


def latest_committed(store: S3Store) -> int | None:
    """The newest committed step, or None."""
    done = [s for s, info in scan(store).items() if info.committed]
    return max(done) if done else None


def prunable(steps: dict[int, StepInfo], keep: int) -> list[int]:
    """Steps retention removes: every step, committed or not, older than the ``keep``-th
    newest committed one. Newer uncommitted steps may still be written: never listed."""
    done = sorted((s for s, i in steps.items() if i.committed), reverse=True)
    if keep < 1 or len(done) <= keep:
        return []
    return [s for s in sorted(steps) if s < done[keep - 1]]


def prune(store: S3Store, keep: int) -> list[int]:
    """Apply retention; the manifest of each step goes first, in its own request. Return
    the steps removed."""
    removed = prunable(scan(store), keep)
    for step in removed:
        store.delete([step_prefix(step) + layout.STEP_META])
        store.delete(o.name for o in store.list_objects(step_prefix(step)))
        log.debug("pruned step %d under %s", step, store.location.uri())
    return removed
