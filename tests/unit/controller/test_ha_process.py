"""Two real controller processes with ``[ha]`` on one PostgreSQL database (no Slurm:
an empty slurm.conf makes every Slurm read fail at once): one leads, the standby
refuses admin writes, and SIGTERM to the leader hands the lease over at once."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_helpers import port_free

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.client import ControllerClient, ControllerError, ControllerUnreachable
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.url import PostgresLocation

pytestmark = pytest.mark.pg
PORTS = range(18500, 18600)
WAIT_S = 30.0
# Far longer than any wait below: a takeover within it is the released lease, not
# an expired one.
TTL_S = 600.0


class Head:
    """``python -m hyperpod_agent.controller.cli run`` with [ha] on the test database."""

    def __init__(self, tmp: Path, name: str, port: int, location: PostgresLocation) -> None:
        self.name = name
        self.port = port
        secret = tmp / "secret"
        if not secret.exists():
            secret.write_text("s" * 48)
        (tmp / "slurm.conf").write_text("")
        self.config = tmp / f"{name}.toml"
        self.config.write_text(
            f"listen_port = {port}\n"
            f'store = "{location.url}"\n'
            f'store_password_file = "{location.password_file}"\n'
            f'slurm_conf = "{tmp / "slurm.conf"}"\n'
            "reconcile_interval_s = 0.5\n"
            "[auth]\n"
            'mode = "token"\n'
            f'token_secret_file = "{secret}"\n'
            "[policy]\n"
            "heartbeat_timeout_s = 30\n"
            "[ha]\n"
            "enabled = true\n"
            f'controller_id = "{name}"\n'
            f"lease_ttl_s = {TTL_S}\n"
            "renew_every_s = 0.2\n"
        )
        self.auth = AuthConfig.model_validate({"mode": "token", "token_secret_file": str(secret)})
        self.log = (tmp / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_agent.controller.cli", "run"]
            + ["--config", str(self.config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.client = ControllerClient(
            f"http://127.0.0.1:{port}", ClientAuth(self.auth), timeout=5.0
        )

    def status(self) -> dict[str, Any] | None:
        try:
            return dict(self.client.status())
        except ControllerUnreachable:
            return None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WAIT_S)
        finally:
            self.log.close()


def wait_for(what: str, check: Any) -> Any:
    """Poll ``check`` until it gives something true; bounded."""
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.1)):
        got = check()
        if got:
            return got
        done.wait(0.1)
    raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")


@pytest.fixture
def heads(pg_location: PostgresLocation, tmp_path: Path) -> Iterator[list[Head]]:
    ports = [p for p in random.sample(PORTS, len(PORTS)) if port_free(p)][:2]
    assert len(ports) == 2, "no free loopback ports in 18500-18599"
    made = [
        Head(tmp_path, n, p, pg_location) for n, p in zip(("head1", "head2"), ports, strict=True)
    ]
    yield made
    for h in made:
        h.stop()


def test_one_leads_and_sigterm_hands_over_at_once(
    heads: list[Head], pg_location: PostgresLocation
) -> None:
    statuses = wait_for(
        "both controllers to answer with a leader",
        lambda: (s := [h.status() for h in heads]) and all(x and x["leader"] for x in s) and s,
    )
    roles = sorted(s["role"] for s in statuses)
    assert roles == ["leader", "standby"], statuses
    leader = next(h for h, s in zip(heads, statuses, strict=True) if s["role"] == "leader")
    standby = next(h for h in heads if h is not leader)
    assert {s["leader"] for s in statuses} == {leader.name}
    with pytest.raises(ControllerError) as info:
        standby.client.action("node1", "drain", "test")
    assert info.value.code == "not_leader" and leader.name in info.value.detail
    assert leader.stop() == 0
    store = Store(pg_location)
    try:
        lease = store.lease()
        assert lease is not None and lease.holder != leader.name  # released, not left
    finally:
        store.close()
    after = wait_for(
        "the standby to lead",
        lambda: (s := standby.status()) and s["role"] == "leader" and s,
    )
    assert after["leader"] == standby.name
