"""Settings of a Checkpointer from the environment of a torchrun or Slurm task.

| variable | meaning |
|---|---|
| HYPERPOD_CHECKPOINT_DIR | persistent tier: a directory or s3://bucket/prefix (required) |
| HYPERPOD_CHECKPOINT_S3 | s3://bucket/prefix: an object store behind a filesystem DIR |
| HYPERPOD_CHECKPOINT_S3_EVERY | write that tier every M-th save (1) |
| HYPERPOD_CHECKPOINT_JOB_KEY | the job DIR is for (the SPANK plugin sets it with DIR) |
| HYPERPOD_CHECKPOINT_DIRECT_IO | 0: write DIR through the page cache, never O_DIRECT (1) |
| HYPERPOD_CHECKPOINT_MEMORY_DIR | job memory directory (default /dev/shm/hyperpod-ckpt/<job>) |
| HYPERPOD_CHECKPOINT_PEERS | ``node=host:port,...`` for every node of the job |
| HYPERPOD_CHECKPOINT_SERVE | 1: local rank 0 hosts this node's replica server |
| HYPERPOD_CHECKPOINT_PERSISTENT_EVERY | write the persistent tier every M-th save (1) |
| HYPERPOD_CHECKPOINT_KEEP_MEMORY / _KEEP_PERSISTENT | steps kept per tier (2 / 3) |
| HYPERPOD_CHECKPOINT_REPLICATED | comma-separated paths identical on every rank |
| HYPERPOD_CHECKPOINT_PEER_STREAMS | TCP connections a restore from a peer uses (4) |
| HYPERPOD_CHECKPOINT_SECRET | the job's replica secret (default: the run's own, from run.json) |

Rank, world size and local rank come from RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; the node from SLURMD_NODENAME or the host name.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from typing import Any

from hyperpod_agent.checkpoint.errors import CheckpointConfigError
from hyperpod_agent.checkpoint.identity import JOB_KEY_RE, launch_token

PREFIX = "HYPERPOD_CHECKPOINT_"
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)  # not isdigit(): it accepts digits int() refuses


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int, low: int = 0) -> int:
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise CheckpointConfigError(f"{name}={raw!r}: expected an integer") from None
        if value < low:
            raise CheckpointConfigError(f"{name}={raw!r}: must be at least {low}")
        return value
    return default


def parse_peers(text: str, var: str = PREFIX + "PEERS") -> dict[str, tuple[str, int]]:
    """Parse ``node1=10.0.0.1:7000,node2=10.0.0.2:7000``; raise naming the bad item."""
    peers: dict[str, tuple[str, int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        node, eq, addr = item.partition("=")
        host, colon, port = addr.rpartition(":")
        if not eq or not node or not colon or not host or not _PORT.fullmatch(port):
            raise CheckpointConfigError(f"{var}: {item!r}: expected node=host:port")
        if not 0 < int(port) < 65536:
            raise CheckpointConfigError(f"{var}: {item!r}: port out of range")
        if node in peers:
            raise CheckpointConfigError(f"{var}: node {node!r} listed twice")
        peers[node] = (host.strip("[]"), int(port))
    return peers


def _job_key(env: Mapping[str, str]) -> str | None:
    name = PREFIX + "JOB_KEY"
    raw = env.get(name) or None
    if raw is not None and not JOB_KEY_RE.fullmatch(raw):
        raise CheckpointConfigError(
            f"{name}={raw!r}: expected 8-128 of A-Z, a-z, 0-9, '.', '_', ':', '-'"
        )
    return raw


def settings_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``Checkpointer`` from ``env``."""
    root = env.get(PREFIX + "DIR", "")
    if not root:
        raise CheckpointConfigError(f"{PREFIX}DIR is not set: no persistent checkpoint directory")
    world = _int(env, ("WORLD_SIZE", "SLURM_NTASKS"), 1, low=1)
    rank = _int(env, ("RANK", "SLURM_PROCID"), 0)
    if rank >= world:
        raise CheckpointConfigError(f"rank {rank} is outside world size {world}")
    job = env.get("SLURM_JOB_ID") or None
    kwargs: dict[str, Any] = {
        "persistent_dir": root,
        "memory_dir": env.get(PREFIX + "MEMORY_DIR") or None,
        "rank": rank,
        "world_size": world,
        "local_rank": _int(env, ("LOCAL_RANK", "SLURM_LOCALID"), 0),
        "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
        "peers": parse_peers(env.get(PREFIX + "PEERS", "")),
        "persistent_every": _int(env, (PREFIX + "PERSISTENT_EVERY",), 1, low=1),
        "keep_memory": _int(env, (PREFIX + "KEEP_MEMORY",), 2, low=1),
        "keep_persistent": _int(env, (PREFIX + "KEEP_PERSISTENT",), 3, low=1),
        "peer_streams": _int(env, (PREFIX + "PEER_STREAMS",), 4, low=1),
        # TOKEN: the variable's earlier name
        "secret": env.get(PREFIX + "SECRET") or env.get(PREFIX + "TOKEN") or None,
        "replicated": [p for p in env.get(PREFIX + "REPLICATED", "").split(",") if p],
        "job_id": job,
        "attempt": launch_token(env, world),
        "s3": env.get(PREFIX + "S3") or None,
        "s3_every": _int(env, (PREFIX + "S3_EVERY",), 1, low=1),
        "job_key": _job_key(env),
    }
    kwargs["serve"] = _flag(env, "SERVE", "0") and kwargs["local_rank"] == 0
    kwargs["direct_io"] = _flag(env, "DIRECT_IO", "1")
    return kwargs


def _flag(env: Mapping[str, str], name: str, default: str) -> bool:
    value = env.get(PREFIX + name, default)
    if value not in ("0", "1"):
        raise CheckpointConfigError(f"{PREFIX}{name}={value!r}: expected 0 or 1")
    return value == "1"
