"""Replacement providers and the factory that picks one from the config."""

from __future__ import annotations

from hyperpod_agent.controller.config import ProviderConfig
from hyperpod_agent.controller.providers.base import Provider, SlurmApi
from hyperpod_agent.controller.providers.command import CommandProvider
from hyperpod_agent.controller.providers.local import LocalProvider
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider


def make_provider(config: ProviderConfig, slurm: SlurmApi) -> Provider:
    """The provider named by ``[provider] kind``."""
    if config.kind == "command":
        return CommandProvider(slurm, config.command, config.command_timeout_s)
    if config.kind == "local":
        assert config.local_dir is not None  # checked by ProviderConfig
        return LocalProvider(slurm, config.local_dir, config.command_timeout_s)
    return SparePoolProvider(slurm)
