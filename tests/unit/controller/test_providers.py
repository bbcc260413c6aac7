from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, node, ts

from hyperpod_agent.controller.config import ProviderConfig
from hyperpod_agent.controller.providers import make_provider
from hyperpod_agent.controller.providers.base import ProviderError, ReplaceStatus
from hyperpod_agent.controller.providers.command import CommandProvider, came_back
from hyperpod_agent.controller.providers.local import LocalProvider
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider

SPARE = "hyperpod:spare"


def test_factory_picks_the_configured_provider(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2))
    assert isinstance(make_provider(ProviderConfig(), slurm), SparePoolProvider)
    cmd = make_provider(ProviderConfig(kind="command", command=["/bin/true"]), slurm)
    assert isinstance(cmd, CommandProvider) and cmd.resumes_node
    local = make_provider(ProviderConfig(kind="local", local_dir=tmp_path), slurm)
    assert isinstance(local, LocalProvider)


def test_local_provider_runs_the_harness_node_reboot(tmp_path: Path) -> None:
    provider = LocalProvider(FakeSlurm(cluster(2)), tmp_path, 30)
    assert provider.command == [
        sys.executable,
        "-m",
        "hyperpod_agent",
        "local-cluster",
        "node-reboot",
        "--dir",
        str(tmp_path),
    ]


def test_spare_pool_confirms_the_spare_the_policy_promised() -> None:
    nodes = {
        "a1": node("a1", partitions=("a",)),
        "s1": node("s1", flags=("DRAIN", "NOT_RESPONDING"), reason=SPARE, partitions=("a",)),
        "s2": node("s2", flags=("DRAIN",), reason=SPARE, partitions=("a", "b")),
        "s3": node("s3", flags=("DRAIN",), reason="maintenance", partitions=("a",)),
    }
    provider = SparePoolProvider(FakeSlurm(nodes))
    assert provider.prepare("a1", nodes, {"spare": "s2"}) == {"spare": "s2"}
    # The provider never picks a spare itself: only the policy knows which are healthy.
    with pytest.raises(ProviderError, match="no spare ready in partitions a .s1: x. for a1"):
        provider.prepare("a1", nodes, {"no_spare": "no spare ready in partitions a (s1: x)"})
    for gone in ("s1", "s3", "nowhere"):  # not responding, not a spare, not in Slurm
        with pytest.raises(ProviderError, match=f"spare {gone} is no longer a responding spare"):
            provider.prepare("a1", nodes, {"spare": gone})


def test_spare_pool_poll() -> None:
    nodes = {"s": node("s", flags=("DRAIN",), reason=SPARE)}
    provider = SparePoolProvider(FakeSlurm(nodes))
    assert provider.poll({"spare": "s"}, nodes, NOW) is ReplaceStatus.PENDING
    assert provider.poll({"spare": "s"}, {"s": node("s")}, NOW) is ReplaceStatus.DONE
    assert provider.poll({"spare": "gone"}, nodes, NOW) is ReplaceStatus.FAILED


def test_came_back_needs_a_newer_start_and_a_responding_node() -> None:
    assert not came_back(None, NOW)
    assert not came_back(node("n"), NOW)
    fresh = node("n", boot_time=NOW + 5)
    assert came_back(fresh, NOW) and not came_back(fresh, NOW + 10)
    dead = node("n", flags=("NOT_RESPONDING",), boot_time=NOW + 5)
    assert not came_back(dead, NOW)
    assert ts(NOW).timestamp() == NOW


def test_command_provider_missing_executable(tmp_path: Path) -> None:
    provider = CommandProvider(FakeSlurm(cluster(2)), [str(tmp_path / "nope")], 5)
    with pytest.raises(ProviderError, match="nope node1"):
        provider.replace("node1", "hyperpod:replace gpu0 xid54 x", {}, NOW)
