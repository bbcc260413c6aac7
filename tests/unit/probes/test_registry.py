"""The probe registry and the config section that mirrors it stay in sync."""

from __future__ import annotations

import typing

from hyperpod_agent.probes.base import Probe, ProbeConfig
from hyperpod_agent.probes.registry import PROBES, ProbesConfig


def test_every_probe_has_a_config_field_of_its_model() -> None:
    fields = ProbesConfig.model_fields
    for name, cls in PROBES.items():
        assert name in fields, f"ProbesConfig has no field {name!r}"
        assert fields[name].annotation is cls.config_model, name


def test_every_config_field_has_a_probe() -> None:
    assert set(ProbesConfig.model_fields) == set(PROBES)


def test_registry_names_match_probe_names() -> None:
    for name, cls in PROBES.items():
        assert issubclass(cls, Probe)
        assert cls.name == name
        assert issubclass(cls.config_model, ProbeConfig)


def test_defaults_construct() -> None:
    cfg = ProbesConfig()
    for name in PROBES:
        assert isinstance(getattr(cfg, name), PROBES[name].config_model)
    assert typing.get_type_hints(ProbesConfig)
