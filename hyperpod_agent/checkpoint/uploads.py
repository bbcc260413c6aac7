"""Object-store uploads that run on after their save.

The next save waits for the previous one (back-pressure: staging memory stays bounded),
but not for its object-store uploads: a store that is slow, throttles or hangs must not
hold the training loop. Such an upload reads the save's staging buffer, a memory-tier file
that no later save stages into until the upload is done (the slot is pinned, staging.py).
Each such tier has one upload in flight, on its own thread; a save due for the tier while
that upload still runs skips it, and says so in its handle. Without a memory tier the
staging buffer is process memory every save reuses, so the upload is waited for as any
other tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from hyperpod_agent.checkpoint.handle import SKIPPED
from hyperpod_agent.checkpoint.persistent import PersistentTier
from hyperpod_agent.checkpoint.staging import Slot, StagingPool

log = logging.getLogger(__name__)

Plan = dict[str, "Future[None] | str"]  # tier -> the upload's future, or why it is skipped


class Uploads:
    """The uploads of one Checkpointer's detachable tiers."""

    def __init__(self, tiers: Sequence[PersistentTier], pool: StagingPool, rank: int):
        self._pool, self._rank = pool, rank
        self._threads = {
            t.name: ThreadPoolExecutor(1, thread_name_prefix=f"hyperpod-ckpt-{t.name}")
            for t in tiers
            if t.detach
        }
        self._tiers = [t for t in tiers if t.detach]
        self._last: dict[str, tuple[int, Future[None]]] = {}  # tier -> step, its upload

    def plan(self, step: int, index: int, slot: Slot) -> Plan:
        """Which uploads of save number ``index`` (of ``step``) run on after it, and which
        are skipped. Called by the training thread, under the checkpointer's lock."""
        out: Plan = {}
        for tier in self._tiers:
            if not (slot.mapped and index % tier.every == 0):
                continue
            busy = self._last.get(tier.name)
            if busy is not None and not busy[1].done():
                out[tier.name] = f"{SKIPPED}: the upload of step {busy[0]} is still running"
                log.info(
                    "rank %d: step %d: %s tier %s", self._rank, step, tier.name, out[tier.name]
                )
                continue
            fut: Future[None] = Future()
            self._last[tier.name] = (step, fut)
            out[tier.name] = fut
        return out

    def start(
        self,
        tier: PersistentTier,
        slot: Slot,
        run: Callable[[], None],
        skip: Callable[[str], None],
        done: Future[None],
    ) -> None:
        """Run ``run`` (the tier's write, recording its own outcome) on the tier's thread,
        with ``slot`` pinned until it returns; ``skip(why)`` if it cannot start."""
        self._pool.pin(slot)

        def upload() -> None:
            try:
                run()
            finally:
                self._pool.unpin(slot)
                done.set_result(None)

        try:
            self._threads[tier.name].submit(upload)
        except RuntimeError:  # closing: nothing will run it
            self._pool.unpin(slot)
            skip("not written: the checkpointer is closing")
            done.set_result(None)

    def running(self) -> list[Future[None]]:
        """The last upload of each tier (done or not)."""
        return [f for _, f in self._last.values()]

    def close(self) -> None:
        """Wait for the uploads in flight and stop their threads."""
        for t in self._threads.values():
            t.shutdown(wait=True)
