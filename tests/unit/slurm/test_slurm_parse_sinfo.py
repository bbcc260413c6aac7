"""sinfo --json -> Node, on captured output and on edge cases."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm.parse import parse_scontrol_nodes, parse_sinfo_json, split_state

Capture = Callable[[str], str]


def _by_name(text: str) -> dict[str, Any]:
    return {n.name: n for n in parse_sinfo_json(text)}


def test_idle_drained_and_spare_nodes(capture: Capture) -> None:
    nodes = _by_name(capture("sinfo_a.json"))
    assert list(nodes) == ["node1", "node2", "node3", "node4", "node5"]
    assert nodes["node4"].state == "IDLE"
    assert nodes["node4"].flags == frozenset()
    assert not nodes["node4"].drained and nodes["node4"].responding
    assert nodes["node4"].reason == "" and nodes["node4"].reason_time is None
    spare = nodes["node5"]
    assert (spare.state, spare.flags, spare.reason) == ("IDLE", {"DRAIN"}, "hyperpod:spare")
    assert spare.drained
    assert spare.reason_user == "root"
    assert spare.reason_time == datetime(2026, 11, 22, 6, 39, 46, tzinfo=UTC)


def test_reason_with_spaces_semicolon_and_equals_is_kept_whole(capture: Capture) -> None:
    node3 = _by_name(capture("sinfo_a.json"))["node3"]
    assert node3.reason == "hyperpod:replace gpu3 xid79 GPU has fallen off the bus; key=value a=b"


def test_node_in_two_partitions_and_address(capture: Capture) -> None:
    node1 = _by_name(capture("sinfo_a.json"))["node1"]
    assert node1.state == "MIXED"
    assert node1.partitions == ("main", "debug")
    assert (node1.address, node1.port) == ("127.0.0.1", 20828)
    assert node1.boot_time == datetime(2026, 11, 22, 6, 35, 59, tzinfo=UTC)
    assert node1.slurmd_start_time == datetime(2026, 11, 22, 6, 39, 33, tzinfo=UTC)


def test_not_responding_then_down(capture: Capture) -> None:
    nr = _by_name(capture("sinfo_nr.json"))["node4"]
    assert nr.state == "IDLE"
    assert nr.flags == {"COMPLETING", "NOT_RESPONDING"}
    assert not nr.responding
    down = _by_name(capture("sinfo_down.json"))["node4"]
    assert (down.state, down.flags, down.reason) == ("DOWN", {"NOT_RESPONDING"}, "Not responding")
    assert down.drained and not down.responding


def test_reboot_requested_and_fail(capture: Capture) -> None:
    nodes = _by_name(capture("sinfo_b.json"))
    assert nodes["node1"].flags == {"DRAIN", "REBOOT_REQUESTED"}
    assert nodes["node1"].reason == "hyperpod:reboot xid79 test"
    assert (nodes["node2"].state, nodes["node2"].flags) == ("MIXED", {"FAIL"})
    assert nodes["node2"].reason == "Action:Replace"
    assert nodes["node2"].drained


def test_slurmctld_unreachable_is_a_slurm_error_not_a_parse_error(capture: Capture) -> None:
    with pytest.raises(SlurmError, match="Slurm reported an error: Unspecified error") as exc:
        parse_sinfo_json(capture("sinfo_ctld_down.json"))
    assert not isinstance(exc.value, SlurmParseError)


@pytest.mark.parametrize("suffix", ["a", "down", "b"])
def test_scontrol_fallback_agrees_with_json(capture: Capture, utc: None, suffix: str) -> None:
    from_json = parse_sinfo_json(capture(f"sinfo_{suffix}.json"))
    from_text = parse_scontrol_nodes(capture(f"scontrol_nodes_{suffix}.txt"))
    assert from_text == from_json


def _doc(*nodes: dict[str, Any]) -> str:
    return json.dumps({"meta": {}, "errors": [], "nodes": list(nodes)})


def test_node_listed_once_per_partition_is_merged() -> None:
    base = {"name": "gpu1", "state": "idle", "state_flags": [], "partitions": ["main"]}
    other = dict(base, partitions=["debug"])
    again = dict(base, partitions=["main", "debug"])
    nodes = parse_sinfo_json(_doc(base, other, again, {"name": "gpu2", "partitions": ["main"]}))
    assert [n.name for n in nodes] == ["gpu1", "gpu2"]
    assert nodes[0].partitions == ("main", "debug")


def test_missing_keys_are_tolerated() -> None:
    (node,) = parse_sinfo_json(_doc({"name": "n1"}))
    assert node.name == "n1"
    assert node.state == "UNKNOWN"
    assert node.flags == frozenset() and node.partitions == ()
    assert node.port is None and node.boot_time is None and node.reason_time is None


def test_unusable_numbers_are_unknown() -> None:
    text = '{"nodes": [{"name": "n1", "port": NaN, "boot_time": 1e300, "reason_changed_at": -5}]}'
    (node,) = parse_sinfo_json(text)
    assert node.port is None and node.boot_time is None and node.reason_time is None


def test_empty_node_list() -> None:
    assert parse_sinfo_json(_doc()) == []


def test_newer_slurm_shapes_are_accepted() -> None:
    raw = {
        "name": "n1",
        "state": ["IDLE", "DRAIN"],
        "boot_time": {"set": True, "infinite": False, "number": 1795329359},
        "reason_changed_at": {"set": False, "infinite": False, "number": 0},
        "port": {"set": True, "number": 6818},
    }
    (node,) = parse_sinfo_json(_doc(raw))
    assert (node.state, node.flags, node.port) == ("IDLE", frozenset({"DRAIN"}), 6818)
    assert node.boot_time == datetime.fromtimestamp(1795329359, tz=UTC)
    assert node.reason_time is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty output"),
        ("   \n", "empty output"),
        ("sinfo: error: something", "not JSON"),
        ('{"nodes": [', "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"meta": {}}', "no 'nodes' key"),
        ('{"nodes": {"name": "n1"}}', "'nodes' is dict, expected a list"),
        ('{"nodes": ["n1"]}', "nodes[0] is str, expected an object"),
        ('{"nodes": [{"state": "idle"}]}', "nodes[0] has no name"),
        ('{"nodes": [{"name": {"a": 1}}]}', "nodes[0].name is dict, expected a string"),
        ('{"nodes": [{"name": "n1", "state_flags": 5}]}', "node n1.state_flags is int"),
        ('{"nodes": [{"name": "n1", "partitions": [1]}]}', "node n1.partitions is list"),
        ('{"nodes": [{"name": "n1", "port": "x"}]}', "node n1.port is str, expected a number"),
        ('{"nodes": [{"name": "n1", "boot_time": true}]}', "node n1.boot_time is bool"),
        ('{"nodes": [{"name": "n1", "state": 3}]}', "node n1.state is int"),
    ],
)
def test_unexpected_output_raises_a_precise_parse_error(text: str, why: str) -> None:
    with pytest.raises(SlurmParseError, match=r"^sinfo --json: unexpected output: ") as exc:
        parse_sinfo_json(text)
    assert why in str(exc.value)


@pytest.mark.parametrize(
    ("state", "base", "flags"),
    [
        ("idle", "IDLE", set()),
        ("MIXED+DRAIN+REBOOT_REQUESTED", "MIXED", {"DRAIN", "REBOOT_REQUESTED"}),
        ("DOWN+NOT_RESPONDING", "DOWN", {"NOT_RESPONDING"}),
        ("down*", "DOWN", set()),
        ("IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}),
        (["DRAIN", "IDLE"], "IDLE", {"DRAIN"}),
        ("", "UNKNOWN", set()),
        (None, "UNKNOWN", set()),
    ],
)
def test_split_state(state: Any, base: str, flags: set[str]) -> None:
    assert split_state(state) == (base, frozenset(flags))
