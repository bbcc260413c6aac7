"""Balanced saving: which rank writes each tensor that several data-parallel ranks hold."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hyperpod_agent.checkpoint.state import Leaf


def is_replicated(path: str, replicated: Collection[str]) -> bool:
    """A path is replicated if it, or a container above it, is declared replicated."""
    if path in replicated:
        return True
    parts = path.split("/")
    return any("/".join(parts[:i]) in replicated for i in range(1, len(parts)))


def assign_owners(
    leaves: Sequence[Leaf], replicated: Collection[str], group: Sequence[int]
) -> dict[str, int]:
    """Greedy by bytes, largest first, to the least-loaded rank (lowest rank on ties).

    Every rank of ``group`` holds the same replicated leaves, so every rank computes the same
    assignment with no communication. Leaves that are not replicated are not in the result.
    """
    ranks = sorted(set(group))
    load = dict.fromkeys(ranks, 0)
    owners: dict[str, int] = {}
    rep = [leaf for leaf in leaves if is_replicated(leaf.path, replicated)]
    for leaf in sorted(rep, key=lambda lf: (-lf.nbytes, lf.path)):
        owner = min(ranks, key=lambda r: (load[r], r))
        owners[leaf.path] = owner
        load[owner] += leaf.nbytes
    return owners
