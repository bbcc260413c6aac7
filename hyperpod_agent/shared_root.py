"""Directories every user of a node shares, like /tmp: mode 1777, owned by root.

The checkpoint memory tier (``/dev/shm/hyperpod-ckpt``) and the progress records
(``/dev/shm/hyperpod-progress``) each live under such a root: every user's job creates its
own directory there, and the sticky bit stops anyone from removing or renaming another's.
The node agent, as root, makes the root so at start (``prepare_shared_root``); a job that
finds no root creates one with the same mode (``open_shared_root``), owned by its user
until the agent takes it over.

The names a job leaves under the memory root are here too, as the agent must read them
without importing the checkpoint library (and numpy with it): a job's directory
``<root>/<job id>/`` holds one directory per run, ``run-<namespace>/``, with a ``.lock``
every live process of the run holds shared, and the spare staging files of its ranks.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

log = logging.getLogger(__name__)

MODE = 0o1777

DEFAULT_MEMORY_ROOT = Path("/dev/shm/hyperpod-ckpt")
RUN_DIR_RE = re.compile(r"run-([0-9a-f]{32})", re.ASCII)  # names a run's directory
LOCK_FILE = ".lock"  # held (shared) by every live process of the run on the node
SPARE_PREFIX = ".staging-rank-"  # a rank's spare staging file, not yet a step's data


def open_shared_root(path: Path) -> int:
    """A descriptor of the directory ``path`` (O_NOFOLLOW: a symbolic link is refused),
    created with mode 1777 if missing. Its parent must exist. Raises OSError."""
    try:
        os.mkdir(path, 0o700)  # opened to everyone below, once we hold it
        created = True
    except FileExistsError:
        created = False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        # Through the descriptor: what we change is what we made, not what replaced it.
        if created and os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, MODE)  # mkdir's mode passes through the umask; this one does not
    except OSError:
        os.close(fd)
        raise
    return fd


def prepare_shared_root(path: Path) -> None:
    """As root: make ``path`` a real directory owned by root with mode 1777 (like /tmp), so
    every user can create a private job directory in it and nobody can remove another's.

    Whatever a user left there first (a symbolic link, a file, a directory of their own)
    is replaced or taken over. Raises OSError if that fails.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        log.warning("shared root %s was not a directory; replacing it", path)
        os.unlink(path)  # a planted symbolic link goes, not what it points to
    fd = open_shared_root(path)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_gid != 0:
            log.warning("shared root %s belonged to uid %d; taking it over", path, st.st_uid)
            os.fchown(fd, 0, 0)
        if stat.S_IMODE(st.st_mode) != MODE:
            os.fchmod(fd, MODE)
    finally:
        os.close(fd)
