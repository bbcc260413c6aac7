"""Directories only their user controls.

A memory tier lives in a directory shared by every user of the node (``/dev/shm/hyperpod-
ckpt``, root-owned, mode 1777 like /tmp: the node agent creates it so). A job's directory
there is mode 0700, and before use we check that it is a real directory owned by us and that
nobody else could replace it (every directory above it is owned by root or by us, and one
that others may write has the sticky bit). Otherwise another user could read our state,
hand us theirs, or pre-create a future job's directory. A persistent directory inside a
world-writable parent (a ``checkpoint_root`` of mode 1777) gets the same checks.
How such a root is made (``prepare_shared_root``) is shared with the progress records
(hyperpod_agent/shared_root.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hyperpod_agent.checkpoint.errors import CheckpointStorageError


class UnsafeDirectoryError(CheckpointStorageError):
    """A directory another user controls (or could replace) is not used."""


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _replaceable(st: os.stat_result) -> bool:
    """Others may write in it and nothing stops them renaming our entries (no sticky bit)."""
    return bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX


def check_ancestors(path: Path, what: str) -> None:
    """Every directory above ``path`` is owned by root or us, and sticky if others write it."""
    me = os.geteuid()
    here = Path(os.path.realpath(path.parent))
    for d in (here, *here.parents):
        st = os.stat(d)
        if st.st_uid not in (0, me):
            raise UnsafeDirectoryError(
                f"{what} {path}: {d} belongs to uid {st.st_uid}, who could replace it "
                "(the node agent creates the memory root owned by root, mode 1777)"
            )
        if _replaceable(st):
            raise UnsafeDirectoryError(
                f"{what} {path}: {d} is writable by others (mode {_mode(st)}) "
                "without the sticky bit"
            )


def _make_mine(path: Path, what: str, private: bool) -> None:
    """Create ``path`` (0700) unless it exists, then check it is ours; see _check_mine."""
    try:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        _check_mine(path, what, private)
    except OSError as exc:
        raise CheckpointStorageError(f"{what} {path}: cannot use: {exc.strerror or exc}") from exc


def _check_mine(path: Path, what: str, private: bool) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(f"{what} {path}: is a symbolic link; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointStorageError(f"{what} {path}: exists and is not a directory")
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafeDirectoryError(
            f"{what} {path}: belongs to uid {st.st_uid}, not to this user (uid {me}); "
            "refusing to use it"
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectoryError(
            f"{what} {path}: others may write in it (mode {_mode(st)}); refusing to use it"
        )
    if private and st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, and nobody else could write in it: just close it


def private_dir(path: Path, what: str) -> Path:
    """Create (mode 0700) or check a directory that only this user may use; see module doc.

    Raises UnsafeDirectoryError naming the directory and why, or CheckpointStorageError if
    it cannot be created.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        check_ancestors(path, what)
    except OSError as exc:
        raise CheckpointStorageError(f"{what} {path}: cannot use: {exc.strerror or exc}") from exc
    _make_mine(path, what, private=True)
    return path


def persistent_dir(path: Path, what: str = "persistent tier") -> Path:
    """Check a persistent directory whose parent anyone may write (a ``checkpoint_root`` of
    mode 1777): it must be ours and closed to others' writes; we create it 0700. A parent
    that is not world-writable is the site's or the user's choice and is trusted as is."""
    parent = Path(os.path.abspath(path)).parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        return path  # created below a directory we create: nobody else could have
    except OSError as exc:
        raise CheckpointStorageError(f"{what} {path}: cannot use: {exc.strerror or exc}") from exc
    if not pst.st_mode & stat.S_IWOTH:
        return path
    if not pst.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            f"{what} {path}: {parent} is world-writable without the sticky bit: anyone "
            "could replace the checkpoints"
        )
    _make_mine(path, what, private=False)
    return path
