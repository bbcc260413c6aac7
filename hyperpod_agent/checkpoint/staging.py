"""Staging buffers that are the memory tier's own files.

A save copies the state once, into a file of the memory tier mapped into this process; the
memory tier is then published by renaming that file into its step directory, with no second
copy. When retention drops an old step, its data file is renamed back to a spare and its
mapping reused by a later save, so the pages stay allocated and mapped: staging costs one
memcpy into warm memory, the same as into a reused anonymous buffer.

Space is reserved with fallocate before the first write, so a full ``/dev/shm`` is an error
at reservation (the save falls back to an anonymous buffer and reports the memory tier as
failed) rather than a SIGBUS in the middle of the copy.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hyperpod_agent.shared_root import SPARE_PREFIX

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Slot:
    """One staging buffer: a mapped file of the memory tier, or anonymous memory."""

    array: np.ndarray
    path: Path | None = None  # where the file is now (a spare name or a step's data file)
    fd: int = -1
    map: mmap.mmap | None = None
    step: int | None = None  # the step whose data file this is, once published
    error: str = ""  # why the memory tier could not be used (anonymous slots only)
    ident: tuple[int, int] = field(default=(0, 0))
    pins: int = 0  # uploads still reading the buffer: it is not staged into again until 0

    @property
    def mapped(self) -> bool:
        """True if this slot is a memory-tier file."""
        return self.map is not None

    def still_ours(self) -> bool:
        """The file at ``path`` is still the one we mapped (nobody wiped or replaced it)."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def close(self) -> None:
        """Unmap and close (the file itself stays)."""
        if self.map is not None:
            self.array = np.empty(0, dtype=np.uint8)
            try:
                self.map.close()
            except BufferError:
                # A caller still holds a view (a save in flight); the mapping goes with it.
                pass
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class StagingPool:
    """Staging slots of one rank in one memory-tier directory (None: no memory tier, every
    save stages in process memory)."""

    def __init__(self, root: Path | None, rank: int):
        self.root, self.rank = root, rank
        self._slots: list[Slot] = []
        self._anon = Slot(np.empty(0, dtype=np.uint8))
        self._swept = False
        self._pin_lock = threading.Lock()

    def _prefix(self) -> str:
        return f"{SPARE_PREFIX}{self.rank:05d}-"

    def _sweep(self) -> None:
        """Remove spares left by an earlier process of this rank (they hold /dev/shm memory)."""
        if self.root is None:
            return
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if name.startswith(self._prefix()):
                try:
                    os.unlink(self.root / name)
                except OSError:
                    pass

    def acquire(self, size: int) -> Slot:
        """A slot of ``size`` bytes not holding a kept step; a mapped one when space allows."""
        if not self._swept:  # on the first save, so a reader never touches the directory
            self._sweep()
            self._swept = True
        for slot in list(self._slots):
            if slot.pins:
                continue  # an upload still reads it (retired or not, wiped or not)
            if not slot.still_ours():
                # Wiped from under us (or replaced): release the mapping, or the memory of
                # the unlinked file stays held by this process.
                self._drop(slot)
                continue
            if slot.step is not None:
                continue
            if self._fit(slot, size):
                return slot
            self._drop(slot, unlink=True)
        created = self._create(size)
        if created is not None:
            self._slots.append(created)
            return created
        if self._anon.array.size < size:
            self._anon.array = np.empty(size, dtype=np.uint8)
        return self._anon

    def prepare(self, size: int) -> None:
        """Have a spare of ``size`` bytes ready for the next save (called in the background,
        so the next save does not pay for allocating and populating fresh pages)."""
        if not self._swept:
            return
        if any(slot.step is None and not slot.pins for slot in self._slots):
            return  # a spare of another size is resized at the next save (its pages stay)
        created = self._create(size, quiet=True)
        if created is not None:
            self._slots.append(created)

    def _fit(self, slot: Slot, size: int) -> bool:
        """Resize a spare's file and mapping to exactly ``size`` bytes; False if we cannot."""
        if slot.array.size == size:
            return True
        assert slot.map is not None
        try:
            slot.array = np.empty(0, dtype=np.uint8)
            slot.map.close()
            slot.map = None
            os.ftruncate(slot.fd, size)
            if size:
                os.posix_fallocate(slot.fd, 0, size)
            slot.map, slot.array = _map(slot.fd, size)
            return True
        except (OSError, BufferError, ValueError) as exc:
            log.warning("memory tier %s: cannot resize a staging file: %s", self.root, exc)
            return False

    def _create(self, size: int, quiet: bool = False) -> Slot | None:
        if self.root is None:
            return None
        path = self.root / f"{self._prefix()}{uuid.uuid4().hex[:12]}"
        fd = -1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            if size:
                os.posix_fallocate(fd, 0, size)
            m, array = _map(fd, size)
        except (OSError, ValueError) as exc:
            if fd >= 0:
                os.close(fd)
                fd = -1
            path.unlink(missing_ok=True)
            if quiet:
                return None
            why = getattr(exc, "strerror", None) or str(exc)
            self._anon.error = f"no room for a {size}-byte staging file in {self.root}: {why}"
            log.warning("memory tier: %s; staging in process memory", self._anon.error)
            return None
        st = os.fstat(fd)
        return Slot(array, path, fd, m, None, "", (st.st_dev, st.st_ino))

    def publish(self, slot: Slot, step: int, dest: Path) -> None:
        """The slot's file becomes ``dest`` (a step's data file), atomically."""
        assert slot.path is not None
        os.replace(slot.path, dest)
        slot.path, slot.step = dest, step

    def pin(self, slot: Slot) -> None:
        """An upload reads the slot after its save is done: keep it out of staging."""
        with self._pin_lock:
            slot.pins += 1

    def unpin(self, slot: Slot) -> None:
        """The upload is done with the slot."""
        with self._pin_lock:
            slot.pins -= 1

    def forget(self, slot: Slot) -> None:
        """A slot whose publish failed goes back to being a spare (or is dropped)."""
        if slot.step is None and not slot.still_ours():
            self._drop(slot)

    def holds(self, step: int) -> Slot | None:
        """The slot whose file is ``step``'s data file, if any."""
        for slot in self._slots:
            if slot.step == step:
                return slot
        return None

    def retire(self, step: int) -> bool:
        """Retention dropped ``step``: turn its data file back into a spare. False if the
        file is not one of ours any more (the caller deletes whatever is there)."""
        slot = self.holds(step)
        if slot is None:
            return False
        slot.step = None
        if self.root is None or not slot.still_ours():
            self._drop(slot)
            return False
        spare = self.root / f"{self._prefix()}{uuid.uuid4().hex[:12]}"
        try:
            os.replace(slot.path, spare)  # type: ignore[arg-type]
        except OSError:
            self._drop(slot)
            return False
        slot.path = spare
        return True

    def _drop(self, slot: Slot, unlink: bool = False) -> None:
        if unlink and slot.path is not None and slot.still_ours():
            slot.path.unlink(missing_ok=True)
        slot.close()
        if slot in self._slots:
            self._slots.remove(slot)

    def close(self) -> None:
        """Unmap everything; spare files are removed, published ones stay as the tier."""
        for slot in list(self._slots):
            self._drop(slot, unlink=slot.step is None)
        self._anon.array = np.empty(0, dtype=np.uint8)


def _map(fd: int, size: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """Map ``size`` bytes of ``fd`` with the pages populated up front."""
    if size == 0:
        # mmap cannot map an empty file; an empty state needs no buffer.
        return mmap.mmap(-1, 1), np.empty(0, dtype=np.uint8)
    m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    return m, np.frombuffer(m, dtype=np.uint8)


class StagingAborted(Exception):
    """Staging failed in the training thread; background writers drop what they started."""


class Progress:
    """How far the training thread has staged a save. Background writers start on the
    first leaves while later ones are still being copied, so a save is durable about one
    disk write after the call rather than one staging copy plus one disk write."""

    _NOTIFY_EVERY = 4 << 20  # waking the writers per small leaf would cost more than it gains

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._staged = 0
        self._told = 0
        self._error: BaseException | None = None

    def advance(self, upto: int) -> None:
        """Bytes [0, upto) of the staging buffer hold their final values."""
        self._staged = upto  # read under the lock by waiters; a stale value only delays them
        if upto - self._told >= self._NOTIFY_EVERY:
            self._notify()

    def finish(self, total: int) -> None:
        """Everything is staged."""
        self._staged = total
        self._notify()

    def fail(self, exc: BaseException) -> None:
        """Staging raised: every waiter raises StagingAborted."""
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _notify(self) -> None:
        with self._cond:
            self._told = self._staged
            self._cond.notify_all()

    def wait(self, upto: int) -> None:
        """Block until bytes [0, upto) are staged; raise StagingAborted if staging failed."""
        with self._cond:
            while self._told < upto and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise StagingAborted(f"staging failed: {self._error}") from self._error
