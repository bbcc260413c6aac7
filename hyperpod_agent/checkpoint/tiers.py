"""Open a run's durable tiers: a directory or an object store, and the object store behind
a directory if there is one, with the run identity they hold.

Apart from persistent.py, which s3tier.py builds on, so that neither imports the other.
"""

from __future__ import annotations

import os
from pathlib import Path

from hyperpod_agent.checkpoint import _threads, identity, layout, perms
from hyperpod_agent.checkpoint.errors import CheckpointConfigError
from hyperpod_agent.checkpoint.persistent import DirTier, PersistentTier
from hyperpod_agent.checkpoint.s3config import S3Options, is_s3_url
from hyperpod_agent.checkpoint.s3tier import S3Tier


def open_tiers(
    persistent_dir: str | os.PathLike[str],
    persistent_every: int,
    s3: str | None,
    s3_every: int,
    s3_options: S3Options | None,
    job_key: str | None,
    rank: int,
    wait: float,
    direct_io: bool = True,
) -> tuple[list[PersistentTier], identity.RunIdentity]:
    """The persistent tier (a directory or an object store), the object store behind a
    directory if any, and the run identity they hold (made on first use; with an object
    store as the persistent tier, rank 0 makes it and the others wait up to ``wait``)."""
    tiers: list[PersistentTier] = []
    try:
        if is_s3_url(persistent_dir):
            if s3 is not None:
                raise CheckpointConfigError(
                    f"s3={s3}: the object store tier goes behind a filesystem persistent "
                    f"directory; the persistent tier is already {persistent_dir}"
                )
            store = S3Tier(str(persistent_dir), s3_options, every=persistent_every)
            tiers.append(store)
            # Rank 0 creates the identity; the others wait for it (as for a commit).
            return tiers, store.load_identity(rank, job_key, wait)
        path = perms.persistent_dir(Path(persistent_dir))
        root = layout.ensure_dir(path, "persistent tier")
        tiers.append(DirTier(root, persistent_every, direct_io))
        adopt = None
        if s3 is not None:
            if not is_s3_url(s3):
                raise CheckpointConfigError(f"s3={s3!r}: expected s3://bucket/prefix")
            behind = S3Tier(
                s3,
                s3_options,
                every=s3_every,
                name="s3",
                nice=_threads.NETWORK,
                mirror_of=path / identity.RUN_FILE,
            )
            tiers.append(behind)
            adopt = behind.adopt(job_key)
        return tiers, identity.load_or_create(path, job_key, adopt)
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
