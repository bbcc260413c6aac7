"""Is a directory safe for root to write code or trusted data into?

Whoever can write a directory, any directory above it, or a symlink on the way to it,
can replace what root writes there. ``unsafe_dir`` walks the path from ``/`` without
trusting it and says why it is unsafe, or None.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path


def unsafe_dir(path: Path, trusted: Collection[int]) -> str | None:
    """Why ``path`` is unsafe, or None: every directory from ``/`` to it, and every
    symlink followed on the way, must be owned by a ``trusted`` uid and writable by
    nobody else; a sticky one (``/tmp``) only above a directory that exists. A part that
    does not exist yet is made later: the last directory that exists decides."""
    chain, current, hops = [Path("/")], Path("/"), 0
    parts = list(path.parts[1:])
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        step = current / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            break  # made at the first run: the last directory that exists decides
        except OSError as exc:
            return f"{step}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if st.st_uid not in trusted:
                return f"{step} is a symlink owned by uid {st.st_uid}, not root"
            if hops > 40:
                return f"{path}: too many levels of symbolic links"
            target = Path(os.readlink(step))
            current = Path("/") if target.is_absolute() else current
            parts[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return f"{step} is not a directory"
        current = step
        chain.append(step)
    if chain[-1] != current:  # after '..' or a symlink: where the lookup ended
        chain.append(current)
    for i, where in enumerate(chain):
        try:
            st = os.lstat(where)
        except OSError as exc:
            return f"{where}: {exc.strerror}"
        if st.st_uid not in trusted:
            return f"{where} is owned by uid {st.st_uid}, not root"
        shared = st.st_mode & 0o022
        # sticky: others cannot replace the next directory, which exists and is ours
        if shared and (i == len(chain) - 1 or not st.st_mode & stat.S_ISVTX):
            return f"{where} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None
