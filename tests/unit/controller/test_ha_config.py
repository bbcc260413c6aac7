"""``[ha]`` in controller.toml, and what ``build()`` does with it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ha_helpers import ha_config
from test_api import Api

from hyperpod_agent.controller.cli import build
from hyperpod_agent.controller.config import DEFAULT_PORT, ControllerConfig, parse_config
from hyperpod_agent.controller.store.url import PostgresLocation
from hyperpod_agent.errors import ConfigError, HyperpodError

P = Path("/etc/hyperpod/controller.toml")
PG = 'store = "postgresql://hyperpod@db.example:5432/hyperpod"\n'


def test_ha_is_off_by_default_with_working_defaults() -> None:
    cfg = ControllerConfig()
    assert cfg.ha.enabled is False
    assert (cfg.ha.lease_ttl_s, cfg.ha.renew_every_s, cfg.ha.clock_margin_s) == (4.0, 1.0, 0.5)
    assert cfg.controller_id() == f"{socket.gethostname()}:{DEFAULT_PORT}"


def test_ha_on_postgresql_parses() -> None:
    cfg = parse_config(
        PG + "listen_port = 9001\n[ha]\nenabled = true\nlease_ttl_s = 10\nrenew_every_s = 3\n", P
    )
    assert cfg.ha.enabled and cfg.controller_id() == f"{socket.gethostname()}:9001"
    named = parse_config(PG + '[ha]\nenabled = true\ncontroller_id = "head-2"\n', P)
    assert named.controller_id() == "head-2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[ha]\nenabled = true\n",
            "ha.enabled needs a PostgreSQL store",
        ),
        (
            'store = "sqlite:///var/lib/x.db"\n[ha]\nenabled = true\n',
            "ha.enabled needs a PostgreSQL store",
        ),
        (PG + "[ha]\nlease_ttl_s = 4\nrenew_every_s = 2\n", "lease_ttl_s (4) must be more"),
        (PG + "[ha]\nrenew_every_s = 0\n", "ha.renew_every_s"),
        (
            PG + "[ha]\nlease_ttl_s = 5\nrenew_every_s = 2\nclock_margin_s = 2.5\n",
            "the shortest a Slurm change is given",
        ),
        (PG + '[ha]\ncontroller_id = ""\n', "ha.controller_id"),
        (PG + "[ha]\nenable = true\n", "ha.enable"),
    ],
)
def test_bad_ha_config_is_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, P)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(f"{P}: ")


@pytest.mark.pg
def test_with_ha_several_controllers_build_on_one_database(
    pg_location: PostgresLocation,
) -> None:
    first = build(ha_config(pg_location, "ctl-a:8787"), None)
    second = build(ha_config(pg_location, "ctl-b:8787"), None)
    try:
        assert first.leadership is not None and second.leadership is not None
        assert first.leadership.controller_id == "ctl-a:8787"
        assert first.role() == second.role() == "standby"  # until a lease is taken
    finally:
        first.store.close()
        second.store.close()


@pytest.mark.pg
def test_without_ha_a_second_controller_is_still_refused(pg_location: PostgresLocation) -> None:
    cfg = ha_config(pg_location, "x").model_copy(update={"ha": ControllerConfig().ha})
    first = build(cfg, None)
    try:
        assert first.leadership is None and first.role() == "single"
        with pytest.raises(HyperpodError, match="another controller is running"):
            build(cfg, None)
    finally:
        first.store.close()


def test_a_single_controller_says_so_in_its_status(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        api.controller.reconcile_once()
        status = api.get("/v1/status").json()
        me = api.controller.config.controller_id()
        assert (status["role"], status["leader"], status["this_controller"]) == ("single", me, me)
        assert status["leader_since"] is not None
    finally:
        api.client.close()
