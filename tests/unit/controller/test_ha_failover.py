"""Clients holding several controller URLs, against real HTTP servers (uvicorn on
loopback): a URL that refuses connections or answers ``503 not_leader`` is skipped for
the next, each URL at most once per request."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import FakeSlurm, cluster
from ha_helpers import Member
from store_helpers import port_free

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.client import (
    ControllerClient,
    ControllerError,
    ControllerUnreachable,
    parse_urls,
)
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.api.server import make_server
from hyperpod_agent.controller.store.url import PostgresLocation
from hyperpod_agent.errors import ConfigError

PORTS = range(18500, 18600)
WAIT_S = 10.0


def free_ports(count: int) -> list[int]:
    ports = [p for p in random.sample(PORTS, len(PORTS)) if port_free(p)]
    assert len(ports) >= count, "no free loopback ports in 18500-18599"
    return ports[:count]


class Served:
    """A controller's API served by uvicorn on a loopback port of the range."""

    def __init__(self, member: Member, auth: AuthConfig, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        app = create_app(member.controller, ServerAuth(auth))
        self.server = make_server(app, "127.0.0.1", port)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.listener]}, daemon=True
        )
        self.thread.start()
        for _ in range(200):  # bounded: 10 s
            if self.server.started:
                break
            threading.Event().wait(0.05)
        assert self.server.started, "uvicorn did not start"
        self.url = f"http://127.0.0.1:{port}"
        self.hits = 0
        member.controller.wake.clear()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)
        self.listener.close()


class Pair:
    def __init__(self, location: PostgresLocation, tmp: Path) -> None:
        secret = tmp / "secret"
        secret.write_text("s" * 48)
        self.auth = AuthConfig.model_validate({"mode": "token", "token_secret_file": str(secret)})
        slurm = FakeSlurm(cluster(4))
        self.leader = Member(location, "ctl-a", slurm)
        self.standby = Member(location, "ctl-b", slurm)
        assert self.leader.leadership.tick() and not self.standby.leadership.tick()
        self.leader.controller.reconcile_once()
        refused, lead_port, standby_port = free_ports(3)
        self.refused = f"http://127.0.0.1:{refused}"  # nothing listens there
        self.served = [
            Served(self.leader, self.auth, lead_port),
            Served(self.standby, self.auth, standby_port),
        ]
        self.lead_url, self.standby_url = (s.url for s in self.served)

    def client(self, *urls: str) -> ControllerClient:
        return ControllerClient(list(urls), ClientAuth(self.auth), timeout=WAIT_S)

    def close(self) -> None:
        for s in self.served:
            s.close()
        self.leader.close()
        self.standby.close()


@pytest.fixture
def pair(pg_location: PostgresLocation, tmp_path: Path) -> Iterator[Pair]:
    made = Pair(pg_location, tmp_path)
    yield made
    made.close()


@pytest.mark.pg
def test_a_refused_connection_goes_to_the_next_url(pair: Pair) -> None:
    client = pair.client(pair.refused, pair.lead_url)
    assert client.status()["role"] == "leader"
    answer = client.action("node3", "drain", "bad fan")
    assert answer["node"] == "node3"
    assert [a.node for a in pair.leader.store.open_actions()] == ["node3"]


@pytest.mark.pg
def test_a_standby_answer_goes_to_the_next_url(pair: Pair) -> None:
    client = pair.client(pair.standby_url, pair.lead_url)
    assert client.action("node2", "reboot")["kind"] == "reboot"
    # reads are answered by the first that answers, the standby included
    assert pair.client(pair.standby_url, pair.lead_url).status()["role"] == "standby"


@pytest.mark.pg
def test_each_url_is_tried_once_then_the_last_error_is_raised(pair: Pair) -> None:
    client = pair.client(pair.refused, pair.standby_url)
    with pytest.raises(ControllerError) as info:
        client.action("node2", "drain")
    assert info.value.code == "not_leader" and "ctl-a" in info.value.detail
    with pytest.raises(ControllerUnreachable):
        pair.client(pair.refused).status()
    assert pair.leader.store.open_actions() == []


@pytest.mark.pg
def test_a_single_url_works_as_before(pair: Pair) -> None:
    client = ControllerClient(pair.lead_url, ClientAuth(pair.auth), timeout=WAIT_S)
    assert client.url == pair.lead_url and client.status()["role"] == "leader"


def test_urls_parse_from_a_list_or_a_comma_separated_string() -> None:
    assert parse_urls("http://a:1") == ("http://a:1",)
    assert parse_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    assert parse_urls(["http://a:1", "http://b:2", "http://a:1"]) == ("http://a:1", "http://b:2")
    for bad in ("", " , ", "http://a:1,ftp://b", []):
        with pytest.raises(ConfigError):
            parse_urls(bad)
