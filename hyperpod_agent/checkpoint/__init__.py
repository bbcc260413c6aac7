"""Tiered checkpoints for training scripts: memory, peer replica, persistent.

from hyperpod_agent.checkpoint import Checkpointer
ckpt = Checkpointer.from_env()
restored = ckpt.load_latest()
...
ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
"""

from hyperpod_agent.checkpoint.checkpointer import Checkpointer
from hyperpod_agent.checkpoint.errors import (
    CheckpointConfigError,
    CheckpointError,
    CheckpointStorageError,
    CorruptShardError,
    ReplicaError,
    TemplateMismatchError,
    UnsupportedStateError,
)
from hyperpod_agent.checkpoint.handle import SaveHandle
from hyperpod_agent.checkpoint.replica import ReplicaServer
from hyperpod_agent.checkpoint.restore import RestoreInfo
from hyperpod_agent.checkpoint.s3config import S3Options

__all__ = [
    "CheckpointConfigError",
    "CheckpointError",
    "CheckpointStorageError",
    "Checkpointer",
    "CorruptShardError",
    "ReplicaError",
    "ReplicaServer",
    "RestoreInfo",
    "S3Options",
    "SaveHandle",
    "TemplateMismatchError",
    "UnsupportedStateError",
]
