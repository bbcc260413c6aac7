"""What a tier reads of the checkpointer it writes for: the rank, the run, the settings.

The tiers (persistent.py, s3tier.py) and the halves of a save and a restore (durable.py,
loader.py) take this interface, not ``Checkpointer``, so that checkpointer.py imports them
and nothing imports it back. durable.py and loader.py widen it with what they use besides.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from hyperpod_agent.checkpoint.identity import RunIdentity


class Context(Protocol):
    """One rank's checkpointer as its persistent tiers see it (read only)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def run(self) -> RunIdentity:
        """The run whose checkpoints these are (identity.py)."""

    @property
    def overlap(self) -> bool:
        """Write while the state is still being staged (else wait for the whole buffer)."""

    @property
    def keep_persistent(self) -> int: ...

    @property
    def commit_timeout(self) -> float:
        """How long rank 0 waits for every rank's metadata before a commit fails."""

    @property
    def replicated(self) -> Collection[str]:
        """Leaves every rank holds alike, stored once (balance.py)."""

    @property
    def replica_group(self) -> Sequence[int]:
        """The ranks that share the replicated leaves with this one."""

    def rank_meta(
        self, step: int, save: str, skeleton: Any, entries: list[dict[str, Any]], size: int
    ) -> dict[str, Any]:
        """This rank's metadata of one save in one tier."""
