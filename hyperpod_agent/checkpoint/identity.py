"""Which run a checkpoint belongs to.

A run *is* its persistent directory. The first process to use the directory creates
``run.json`` there: a random run id and a random secret, mode 0600, written under a
temporary name and hard-linked into place, so ranks starting together agree on one; every
later process (a requeue, a restart) reads it. From it:

- the memory tier and the peer replicas of the run live in ``<job dir>/run-<namespace>/``,
  where the namespace hashes the run id with the directory's path. A new directory, a second
  run in the same job, or a job id Slurm hands out again never sees another run's fast tiers,
  and a copy of a directory (``cp -r``) starts its own;
- every rank's metadata records the run id and the save it belongs to (checked at commit
  and at restore);
- the secret authenticates the run's replica traffic (it reaches every rank through the
  shared persistent directory, readable by the owner only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hyperpod_agent.checkpoint import layout
from hyperpod_agent.checkpoint.errors import CheckpointStorageError

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
LOCK_FILE = ".lock"  # held (shared) by every live process of the run on the node
DEFAULT_MEMORY_ROOT = Path("/dev/shm/hyperpod-ckpt")
RUN_DIR_RE = re.compile(r"run-([0-9a-f]{32})", re.ASCII)
_HEX32 = re.compile(r"[0-9a-f]{32}", re.ASCII)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# The same in every task of one launch, different for the next launch (requeue, new step).
_LAUNCH_VARS = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_READ_TRIES = 50  # a file system without hard links shows a new file before its content


@dataclass(frozen=True)
class RunIdentity:
    """The identity of the run that owns a persistent directory."""

    run: str  # 32 hex digits, recorded in every rank's metadata
    secret: bytes  # authenticates the run's replica connections; never sent
    namespace: str  # 32 hex digits: names the run's memory tier and replica directory

    @property
    def dir_name(self) -> str:
        """Name of the run's directory inside a job's memory directory."""
        return f"run-{self.namespace}"


def namespace(run: str, persistent_dir: Path) -> str:
    """The run's fast-tier namespace: its id bound to the directory's path."""
    where = os.fsencode(os.path.abspath(persistent_dir))
    return hashlib.sha256(b"hyperpod-ckpt-ns\0" + run.encode() + b"\0" + where).hexdigest()[:32]


def parse(raw: bytes, where: Path) -> tuple[str, bytes]:
    """(run id, secret) of a ``run.json``; CheckpointStorageError naming the file if bad."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointStorageError(f"{where}: not a run identity file: {exc}") from None
    run = doc.get("run") if isinstance(doc, dict) else None
    secret = doc.get("secret") if isinstance(doc, dict) else None
    if not (isinstance(run, str) and _HEX32.fullmatch(run)):
        raise CheckpointStorageError(f"{where}: not a run identity file: bad 'run'")
    if not (isinstance(secret, str) and _HEX64.fullmatch(secret)):
        raise CheckpointStorageError(f"{where}: not a run identity file: bad 'secret'")
    return run, bytes.fromhex(secret)


def load_or_create(persistent_dir: Path) -> RunIdentity:
    """Read the run identity of ``persistent_dir``, creating it on first use."""
    path = persistent_dir / RUN_FILE
    for _ in range(_READ_TRIES):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            _create(path)
            continue
        except OSError as exc:
            raise CheckpointStorageError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if not raw:  # created without a link by another rank, not yet written
            time.sleep(0.02)
            continue
        run, secret = parse(raw, path)
        return RunIdentity(run, secret, namespace(run, persistent_dir))
    raise CheckpointStorageError(f"{path}: stays empty; remove it if no run uses this directory")


def _create(path: Path) -> None:
    doc = {
        "format": 1,
        "run": uuid.uuid4().hex,
        "secret": secrets.token_hex(32),
        "created": time.time(),
    }
    raw = json.dumps(doc).encode()
    tmp = path.with_name(f".tmp-{RUN_FILE}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another rank won: theirs is the run
        except FileExistsError:
            pass
        except OSError:
            _create_without_link(path, raw)
    except OSError as exc:
        raise CheckpointStorageError(f"{path}: cannot create: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    layout.fsync_dir(path.parent)


def _create_without_link(path: Path, raw: bytes) -> None:
    """For file systems without hard links: exclusive create; readers wait for content."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)


def launch_token(environ: Mapping[str, str], world_size: int) -> str:
    """Identify this launch of the job's tasks, the same on every rank without talking.

    Saves are tagged ``<launch>.<n>`` (n counts this process's saves), so a commit and a
    restore can tell a shard of this save from one an earlier launch left at the same step.
    A single process needs nobody's agreement and takes a random token.
    """
    if world_size == 1:
        return uuid.uuid4().hex[:16]
    text = "\n".join(f"{k}={environ.get(k, '')}" for k in _LAUNCH_VARS)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_job_dir(job_id: str | None) -> Path:
    """A job's memory directory under the default root: the Slurm job id, or ``local-<uid>``
    outside Slurm (each user their own, so one user's directory never blocks another's)."""
    return DEFAULT_MEMORY_ROOT / (job_id or f"local-{os.geteuid()}")


def other_runs(job_dir: Path, mine: RunIdentity) -> list[str]:
    """Names of the other runs' directories in a job's memory directory."""
    try:
        names = os.listdir(job_dir)
    except OSError:
        return []
    return sorted(n for n in names if RUN_DIR_RE.fullmatch(n) and n != mine.dir_name)


def record(tier: Path, mine: RunIdentity, persistent_dir: Path) -> None:
    """Say in the memory tier whose it is (for operators; the directory name is the key)."""
    path = tier / RUN_FILE
    if path.exists():
        return
    try:
        layout.write_json(
            path,
            {"format": 1, "run": mine.run, "persistent": os.path.abspath(persistent_dir)},
            sync=False,
        )
    except OSError as exc:
        log.warning("memory tier %s: cannot record its run: %s", tier, exc)
