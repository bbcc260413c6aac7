"""torch.distributed.checkpoint (DCP) into the persistent tier, with the same step discovery.

DCP checkpoints go to ``<persistent>/dcp/step-NNNNNNNNNN/``. DCP's coordinator writes the
``.metadata`` file last (temporary name, fsync, rename), so it is the step's commit marker, as
``step.json`` is for our own shards. Use this for FSDP/TP models whose state is DTensors and
needs DCP's resharding on load; the memory and peer tiers stay with ``Checkpointer.save``.

    writer = dcp_writer(ckpt, step)
    torch.distributed.checkpoint.save(state, storage_writer=writer)
    found = dcp_latest(ckpt)
    if found:
        step, reader = found
        torch.distributed.checkpoint.load(state, storage_reader=reader)
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperpod_agent.checkpoint.errors import CheckpointConfigError

if TYPE_CHECKING:
    from hyperpod_agent.checkpoint.checkpointer import Checkpointer

_STEP_RE = re.compile(r"step-([0-9]{10})", re.ASCII)  # fullmatch: see layout.py
COMMIT = ".metadata"


def dcp_root(ckpt: Checkpointer) -> Path:
    """Directory under the persistent tier that holds DCP steps (DCP's own writer and reader
    need a file system: an object-store persistent tier has none)."""
    if ckpt.persistent_dir is None:
        raise CheckpointConfigError(
            f"DCP checkpoints need a filesystem persistent tier, not {ckpt.persistent.location}"
        )
    return ckpt.persistent_dir / "dcp"


def dcp_steps(ckpt: Checkpointer) -> list[int]:
    """Committed DCP steps, oldest first."""
    root = dcp_root(ckpt)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    steps = []
    for e in entries:
        m = _STEP_RE.fullmatch(e.name)
        if m and (Path(e.path) / COMMIT).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def dcp_writer(ckpt: Checkpointer, step: int, **kwargs: Any) -> Any:
    """A DCP ``FileSystemWriter`` for ``step`` (fsync on), after applying retention."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    kwargs.setdefault("sync_files", True)
    path = dcp_root(ckpt) / f"step-{step:010d}"
    if ckpt.rank == 0:
        dcp_prune(ckpt, ckpt.keep_persistent)
    return FileSystemWriter(path, **kwargs)


def dcp_latest(ckpt: Checkpointer) -> tuple[int, Any] | None:
    """(step, FileSystemReader) of the newest committed DCP step, or None."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    steps = dcp_steps(ckpt)
    if not steps:
        return None
    return steps[-1], FileSystemReader(dcp_root(ckpt) / f"step-{steps[-1]:010d}")


def dcp_prune(ckpt: Checkpointer, keep: int) -> list[int]:
    """Delete DCP steps older than the newest ``keep`` committed ones."""
    steps = dcp_steps(ckpt)
    if len(steps) <= keep:
        return []
    oldest_kept = steps[-keep]
    root = dcp_root(ckpt)
    removed = []
    for e in os.scandir(root):
        m = _STEP_RE.fullmatch(e.name)
        if m and int(m.group(1)) < oldest_kept:
            # The commit marker goes first so a half-deleted step is never taken as complete.
            (Path(e.path) / COMMIT).unlink(missing_ok=True)
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(int(m.group(1)))
    return sorted(removed)
