"""Read-only views of a tier directory for the CLI: list, describe and verify steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperpod_agent.checkpoint import layout, validate
from hyperpod_agent.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    CorruptShardError,
)


def open_root(root: Path) -> Path:
    """Check a tier directory exists; raise naming it."""
    if not root.exists():
        raise CheckpointStorageError(f"{root}: no such directory")
    if not root.is_dir():
        raise CheckpointStorageError(f"{root}: not a directory")
    return root


def list_steps(root: Path) -> list[dict[str, Any]]:
    """One summary per step, oldest first."""
    out = []
    for step, info in sorted(layout.scan(open_root(root)).items()):
        ws = layout.step_world_size(root, step)
        d = layout.step_dir(root, step)
        size = sum(p.stat().st_size for p in d.glob("rank-*.bin"))
        out.append(
            {
                "step": step,
                "world_size": ws,
                "ranks": sorted(info.ranks),
                "committed": info.committed,
                "complete": info.complete(ws),
                "bytes": size,
            }
        )
    return out


def describe(root: Path, step: int) -> dict[str, Any]:
    """Every rank's leaves of a step (path, kind, dtype, shape, bytes, writer)."""
    info = layout.scan(open_root(root)).get(step)
    if info is None:
        raise CheckpointStorageError(f"{root}: no step {step}")
    ws = layout.step_world_size(root, step)
    ranks = []
    for r in sorted(info.ranks):
        meta, entries = _rank_meta(root, step, r, ws)
        leaves = [
            {
                "path": e["path"],
                "kind": e["kind"],
                "dtype": e["dtype"].strip('"'),
                "shape": e["shape"],
                "nbytes": e["nbytes"],
                "owner": e.get("owner", r),
            }
            for e in entries
        ]
        ranks.append(
            {"rank": r, "node": meta.get("node"), "data_size": meta["data_size"], "leaves": leaves}
        )
    return {
        "step": step,
        "world_size": ws,
        "committed": info.committed,
        "complete": info.complete(ws),
        "ranks": ranks,
    }


@dataclass
class Verdict:
    """Result of verifying one step."""

    step: int
    complete: bool
    problems: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Complete and every checksum matches."""
        return self.complete and not self.problems


def verify_step(root: Path, step: int) -> Verdict:
    """Read every shard of a step and check sizes and checksums."""
    info = layout.scan(open_root(root)).get(step)
    if info is None:
        raise CheckpointStorageError(f"{root}: no step {step}")
    ws = layout.step_world_size(root, step)
    verdict = Verdict(step, info.complete(ws))
    if ws is None:
        verdict.problems.append(f"step {step}: no readable metadata")
        return verdict
    d = layout.step_dir(root, step)
    verdict.missing = sorted(set(range(ws)) - info.ranks)
    owned: dict[int, set[str]] = {}
    refs: list[tuple[int, str, int]] = []
    for r in sorted(info.ranks):
        try:
            meta, entries = _rank_meta(root, step, r, ws)
            buf = layout.read_file(d / layout.data_name(r), meta["data_size"])
            layout.verify_entries(d / layout.data_name(r), buf, entries)
            owned[r] = {e["path"] for e in entries if "owner" not in e}
            refs += [(r, e["path"], e["owner"]) for e in entries if "owner" in e]
        except CheckpointError as exc:
            verdict.problems.append(str(exc))
    for r, path, owner in refs:
        if owner in owned and path not in owned[owner]:
            verdict.problems.append(
                f"{d / layout.data_name(owner)}: lacks leaf {path!r} that rank {r} relies on"
            )
    return verdict


def _rank_meta(
    root: Path, step: int, rank: int, world_size: int | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A rank's metadata, validated (CorruptShardError naming the file and the field)."""
    path = layout.step_dir(root, step) / layout.meta_name(rank)
    meta = layout.read_json(path)
    if world_size is None:
        raise CorruptShardError(f"{path}: no readable world size for step {step}")
    entries, _ = validate.rank_meta(meta, path, step=step, rank=rank, world_size=world_size)
    return meta, entries
