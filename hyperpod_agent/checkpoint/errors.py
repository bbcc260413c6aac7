"""Typed errors of the checkpoint library; each is one line naming what went wrong and where."""

from __future__ import annotations

from hyperpod_agent.errors import HyperpodError


class CheckpointError(HyperpodError):
    """Base class of every checkpoint failure."""

    exit_code = 6


class CheckpointConfigError(CheckpointError):
    """A setting or environment variable is missing or invalid."""

    exit_code = 3


class UnsupportedStateError(CheckpointError):
    """The state holds a value we cannot store; raised before anything is written."""


class TemplateMismatchError(CheckpointError):
    """A stored state does not match the template given to ``load``."""


class CheckpointStorageError(CheckpointError):
    """A tier's directory is missing, not a directory, or cannot be written."""


class CorruptShardError(CheckpointError):
    """A shard file is missing, truncated or fails its checksum."""


class ReplicaError(CheckpointError):
    """The peer replica server could not be reached or refused a request."""
