"""Two or more controllers on one PostgreSQL database, each with its own clock and a
tap on the one in-memory Slurm they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctl_helpers import FakeSlurm, config
from test_service import Clock

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.leadership import Leadership
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.url import PostgresLocation

TTL = 6.0
RENEW = 2.0
__all__ = ["RENEW", "TTL", "Clock", "Member", "Tap", "ha_config"]


class Tap:
    """The shared FakeSlurm as one controller sees it: every call it makes is listed."""

    def __init__(self, slurm: FakeSlurm) -> None:
        self.slurm = slurm
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.slurm, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return target(*args, **kwargs)

        return call


def ha_config(location: PostgresLocation, cid: str, **extra: Any) -> ControllerConfig:
    return config(
        store=location.url,  # type: ignore[arg-type]
        store_password_file=str(location.password_file),  # type: ignore[arg-type]
        ha={"enabled": True, "controller_id": cid, "lease_ttl_s": TTL, "renew_every_s": RENEW},
        # Act on a fault at once: the shared-cause wait has tests of its own.
        policy={"shared_cause_window_s": 0},
        **extra,
    )


class Member:
    """One controller of an HA pair: its store, clock, Slurm tap and leadership."""

    def __init__(
        self,
        location: PostgresLocation,
        cid: str,
        slurm: FakeSlurm,
        clock: Clock | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.config = ha_config(location, cid)
        self.store = Store(self.config.store_location())
        self.leadership = Leadership(
            self.store, cid, TTL, RENEW, clock=self.clock, on_change=on_change
        )
        self.slurm = Tap(slurm)
        self.controller = Controller(
            self.config,
            self.store,
            self.slurm,  # type: ignore[arg-type]
            SparePoolProvider(self.slurm),  # type: ignore[arg-type]
            clock=self.clock,
            leadership=self.leadership,
        )

    def close(self) -> None:
        self.leadership.stop(release=False)
        self.store.close()
