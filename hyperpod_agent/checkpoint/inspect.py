"""Read-only views of a tier directory for the CLI: list, describe and verify steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperpod_agent.checkpoint import layout
from hyperpod_agent.checkpoint.errors import CheckpointStorageError, CorruptShardError


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
    ranks = []
    for r in sorted(info.ranks):
        meta = layout.read_json(layout.step_dir(root, step) / layout.meta_name(r))
        leaves = [
            {
                "path": e["path"],
                "kind": e["kind"],
                "dtype": e["dtype"].strip('"'),
                "shape": e["shape"],
                "nbytes": e["nbytes"],
                "owner": e.get("owner", r),
            }
            for e in meta["entries"]
        ]
        ranks.append(
            {"rank": r, "node": meta.get("node"), "data_size": meta["data_size"], "leaves": leaves}
        )
    ws = layout.step_world_size(root, step)
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
            meta = layout.read_json(d / layout.meta_name(r))
            buf = layout.read_file(d / layout.data_name(r), int(meta["data_size"]))
            layout.verify_entries(d / layout.data_name(r), buf, meta["entries"])
            owned[r] = {e["path"] for e in meta["entries"] if "owner" not in e}
            refs += [(r, e["path"], int(e["owner"])) for e in meta["entries"] if "owner" in e]
        except CorruptShardError as exc:
            verdict.problems.append(str(exc))
    for r, path, owner in refs:
        if owner in owned and path not in owned[owner]:
            verdict.problems.append(
                f"{d / layout.data_name(owner)}: lacks leaf {path!r} that rank {r} relies on"
            )
    return verdict
