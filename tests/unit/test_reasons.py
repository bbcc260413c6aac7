from __future__ import annotations

import pytest

from hyperpod_agent.reasons import (
    MAX_REASON,
    SPARE,
    OwnedReason,
    Verb,
    format_reason,
    owned,
    parse_admin_request,
    parse_reason,
)


def test_format_is_canonical() -> None:
    text = format_reason(Verb.REPLACE, "gpu3", "xid79", "GPU has fallen off the bus")
    assert text == "hyperpod:replace gpu3 xid79 GPU has fallen off the bus"


def test_format_collapses_whitespace_and_bounds_length() -> None:
    text = format_reason(Verb.DRAIN, "ib 0", "link\tdown", "a\n  b" + "x" * 500)
    assert "\n" not in text and "\t" not in text
    assert text.startswith("hyperpod:drain ib_0 link_down a b")
    assert len(text) == MAX_REASON


def test_spare_reason() -> None:
    assert format_reason(Verb.SPARE) == SPARE == "hyperpod:spare"


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("hyperpod:reboot gpu0 xid79 lost", OwnedReason(Verb.REBOOT, "gpu0", "xid79", "lost")),
        (
            "hyperpod:hold gpu1 lemon 5 faults in 7 d",
            OwnedReason(Verb.HOLD, "gpu1", "lemon", "5 faults in 7 d"),
        ),
        (
            "  HYPERPOD:Drain agent heartbeat_lost",
            OwnedReason(Verb.DRAIN, "agent", "heartbeat_lost", ""),
        ),
        ("hyperpod:spare", OwnedReason(Verb.SPARE, "-", "-", "")),
        ("hyperpod:explode gpu0 x", None),
        ("maintenance", None),
        ("NHC: check_fs_mount: /scratch not mounted", None),
        ("", None),
    ],
)
def test_parse_reason(reason: str, expected: OwnedReason | None) -> None:
    assert parse_reason(reason) == expected


def test_round_trip() -> None:
    for verb in (Verb.DRAIN, Verb.RESET, Verb.REBOOT, Verb.REPLACE, Verb.HOLD):
        parsed = parse_reason(format_reason(verb, "gpu2", "xid48", "row remap"))
        assert parsed == OwnedReason(verb, "gpu2", "xid48", "row remap")


@pytest.mark.parametrize(
    ("reason", "owns"),
    [
        ("hyperpod:drain x", True),
        (" hyperpod:spare", True),
        ("maintenance", False),
        ("Action:Replace", False),
        ("NHC:x", False),
        ("hyperpodish", False),
    ],
)
def test_owned(reason: str, owns: bool) -> None:
    assert owned(reason) is owns


@pytest.mark.parametrize(
    ("reason", "verb"),
    [
        ("Action:Replace", Verb.REPLACE),
        ("Action:Reboot", Verb.REBOOT),
        ("action : reboot", Verb.REBOOT),
        ("  ACTION:REPLACE  ", Verb.REPLACE),
        ("action:replace\t", Verb.REPLACE),
        ("Action:Drain", None),
        ("Action:Replace now please", None),
        ("maintenance", None),
        ("", None),
    ],
)
def test_admin_requests_are_parsed_tolerantly(reason: str, verb: Verb | None) -> None:
    assert parse_admin_request(reason) == verb


def test_control_characters_never_reach_slurm() -> None:
    text = format_reason(Verb.HOLD, "admin", "request", "bad\x01\x1b[31mred\x7f")
    assert text == "hyperpod:hold admin request bad [31mred"


# -- who owns a node ---------------------------------------------------------------
from hyperpod_agent.reasons import Owner, owner_of  # noqa: E402
from hyperpod_agent.slurm.models import Node  # noqa: E402


def _drained(reason: str, user: str = "slurm", state: str = "IDLE") -> Node:
    return Node("n1", state, frozenset({"DRAIN"}), reason=reason, reason_user=user)


@pytest.mark.parametrize(
    ("reason", "user", "expected"),
    [
        ("hyperpod:reboot gpu0 xid79 lost", "root", Owner.US),
        ("hyperpod:spare", "root", Owner.SPARE),
        ("Action:Replace", "root", Owner.REQUEST),
        (" action : reboot ", "alice", Owner.REQUEST),
        ("Not responding", "slurm", Owner.SLURM),
        ("Node unexpectedly rebooted", "slurm", Owner.SLURM),
        ("reboot timed out", "slurm", Owner.SLURM),
        ("Not responding", "", Owner.SLURM),  # Slurm always names a user; unknown is not a human
        # Slurm's texts are matched whole, never as a prefix: these are humans' notes.
        ("Not responding to IPMI - RMA 1234, keep out", "slurm", Owner.OTHER),
        ("Node unexpectedly rebooted - investigating, keep out", "slurm", Owner.OTHER),
        ("not responding", "slurm", Owner.OTHER),
        ("maintenance : reboot timed out", "slurm", Owner.OTHER),
        # Slurm's text written by somebody else is that somebody's.
        ("Not responding", "alice", Owner.OTHER),
        ("maintenance", "root", Owner.OTHER),
        ("NHC: check_fs_mount: /scratch not mounted", "root", Owner.OTHER),
        ("", "root", Owner.OTHER),  # out of service for no stated reason: not ours either
    ],
)
def test_owner_of_drained_node(reason: str, user: str, expected: Owner) -> None:
    assert owner_of(_drained(reason, user), ("slurm",)) is expected


def test_owner_of_down_node_with_slurm_reason() -> None:
    down = Node("n1", "DOWN", frozenset({"NOT_RESPONDING"}), "Not responding", "slurm")
    assert owner_of(down, ("slurm",)) is Owner.SLURM


def test_a_node_in_service_has_no_owner() -> None:
    assert owner_of(Node("n1", "IDLE"), ("slurm",)) is Owner.NONE
    # A stale reason on a node in service does not make it anybody's.
    assert owner_of(Node("n1", "MIXED", reason="maintenance"), ("slurm",)) is Owner.NONE


def test_slurm_user_is_configurable() -> None:
    node = _drained("Not responding", "root")
    assert owner_of(node, ("slurm",)) is Owner.OTHER
    assert owner_of(node, ("root",)) is Owner.SLURM
