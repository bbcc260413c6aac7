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
  shared persistent directory, readable by the owner only);
- the job key, when the job has one (the SPANK plugin gives every submission its own and
  binds it to the ``<checkpoint_root>/<job id>`` directory it chooses), says which job the
  directory was made for: a job whose id Slurm hands out again after its state was reset
  finds the old job's directory, and is refused it rather than restoring from it.

In an object store (s3tier.py) the same document is the object ``run.json`` under the
prefix; ranks agree on it without a link (rank 0 creates it, the others wait for it).
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hyperpod_agent.checkpoint import layout
from hyperpod_agent.checkpoint.errors import CheckpointStorageError
from hyperpod_agent.shared_root import DEFAULT_MEMORY_ROOT, RUN_DIR_RE

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
_HEX32 = re.compile(r"[0-9a-f]{32}", re.ASCII)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# What a job key may be: the plugin's are 32 hex digits; a site or user may set its own.
JOB_KEY_RE = re.compile(r"[0-9A-Za-z._:-]{8,128}", re.ASCII)
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
    job_key: str | None = None  # the job the persistent directory was made for, if known

    @property
    def dir_name(self) -> str:
        """Name of the run's directory inside a job's memory directory."""
        return f"run-{self.namespace}"


class OtherJobError(CheckpointStorageError):
    """The persistent directory was made for another job (another job key)."""


def location(persistent: Path | str) -> str:
    """How a persistent tier is named in the namespace and in messages: a directory's
    absolute path, or an object store's ``s3://bucket/prefix``."""
    if isinstance(persistent, str) and persistent.startswith("s3://"):
        return persistent
    return os.path.abspath(persistent)


def namespace(run: str, persistent: Path | str) -> str:
    """The run's fast-tier namespace: its id bound to the persistent tier's location."""
    where = os.fsencode(location(persistent))
    return hashlib.sha256(b"hyperpod-ckpt-ns\0" + run.encode() + b"\0" + where).hexdigest()[:32]


def new_document(job_key: str | None) -> bytes:
    """A fresh ``run.json``: a random run id and secret, and the job key if there is one."""
    doc: dict[str, object] = {
        "format": 1,
        "run": uuid.uuid4().hex,
        "secret": secrets.token_hex(32),
        "created": time.time(),
    }
    if job_key is not None:
        doc["job_key"] = job_key
    return json.dumps(doc).encode()


def parse(raw: bytes, where: object) -> tuple[str, bytes, str | None]:
    """(run id, secret, job key) of a ``run.json``; CheckpointStorageError naming it if bad."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointStorageError(f"{where}: not a run identity file: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointStorageError(f"{where}: not a run identity file: not an object")
    run, secret, key = doc.get("run"), doc.get("secret"), doc.get("job_key")
    if not (isinstance(run, str) and _HEX32.fullmatch(run)):
        raise CheckpointStorageError(f"{where}: not a run identity file: bad 'run'")
    if not (isinstance(secret, str) and _HEX64.fullmatch(secret)):
        raise CheckpointStorageError(f"{where}: not a run identity file: bad 'secret'")
    if key is not None and not (isinstance(key, str) and JOB_KEY_RE.fullmatch(key)):
        raise CheckpointStorageError(f"{where}: not a run identity file: bad 'job_key'")
    return run, bytes.fromhex(secret), key


def identify(raw: bytes, where: object, persistent: Path | str, job_key: str | None) -> RunIdentity:
    """The identity in a ``run.json`` read from ``where``, for a job with ``job_key``.

    A job with a key accepts only a directory made for the same key: another key, or no
    key at all, means the directory was made by another submission (Slurm reuses job ids
    after its state is reset), and OtherJobError says so before anything is read or
    written. A job without a key checks nothing (a directory shared by a chain of jobs).
    """
    run, secret, theirs = parse(raw, where)
    if job_key is not None and theirs != job_key:
        made = f"job key {theirs}" if theirs else "no job key"
        raise OtherJobError(
            f"{where}: these checkpoints belong to another job ({made}), not to this one "
            f"(job key {job_key}): a job id handed out again? Nothing was restored or "
            "overwritten; move the directory away, or give this job its own "
            "HYPERPOD_CHECKPOINT_DIR"
        )
    return RunIdentity(run, secret, namespace(run, persistent), theirs)


def load_or_create(
    persistent_dir: Path,
    job_key: str | None = None,
    adopt: Callable[[], bytes | None] | None = None,
) -> RunIdentity:
    """Read the run identity of ``persistent_dir``, creating it on first use.

    ``adopt``: where to look for an existing identity before making a new one (the object
    store behind the directory, which outlives it); it returns a ``run.json`` it has
    already checked with :func:`identify`, or None.
    """
    path = persistent_dir / RUN_FILE
    for _ in range(_READ_TRIES):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            found = adopt() if adopt is not None else None
            _create(path, found if found is not None else new_document(job_key))
            continue
        except OSError as exc:
            raise CheckpointStorageError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if not raw:  # created without a link by another rank, not yet written
            time.sleep(0.02)
            continue
        return identify(raw, path, persistent_dir, job_key)
    raise CheckpointStorageError(f"{path}: stays empty; remove it if no run uses this directory")


def _create(path: Path, raw: bytes) -> None:
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


def record(tier: Path, mine: RunIdentity, persistent: Path | str) -> None:
    """Say in the memory tier whose it is (for operators; the directory name is the key)."""
    path = tier / RUN_FILE
    if path.exists():
        return
    try:
        layout.write_json(
            path, {"format": 1, "run": mine.run, "persistent": location(persistent)}, sync=False
        )
    except OSError as exc:
        log.warning("memory tier %s: cannot record its run: %s", tier, exc)
