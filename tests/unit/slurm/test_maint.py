"""Maintenance reservations: parsing ``scontrol show reservation -o`` (captured from
Slurm 22.05) and the argument lists of the calls."""

from __future__ import annotations

import pytest

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm.maint import check_name, parse_reservations

ARGV = ["scontrol", "show", "reservation", "-o"]
# scontrol show reservation -o, Slurm 22.05.8, a reservation made by create_maint_reservation
CAPTURED = (
    "ReservationName=hyperpod-check-1-1795562222 StartTime=2026-11-24T22:58:04 "
    "EndTime=2026-11-24T23:28:04 Duration=00:30:00 Nodes=node[4-5] NodeCnt=2 CoreCnt=4 "
    "Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=4 Users=root "
    "Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) "
    "Watts=n/a MaxStartDelay=(null)\n"
)


def test_a_captured_reservation() -> None:
    [r] = parse_reservations(CAPTURED, ARGV)
    assert r.name == "hyperpod-check-1-1795562222"
    assert r.nodes == ("node4", "node5")
    assert r.flags == {"MAINT", "SPEC_NODES"} and r.users == ("root",) and r.state == "ACTIVE"


def test_none_and_several() -> None:
    assert parse_reservations("No reservations in the system\n", ARGV) == []
    two = CAPTURED + CAPTURED.replace("hyperpod-check-1-", "other-")
    assert [r.name for r in parse_reservations(two, ARGV)][1].startswith("other-")


def test_output_we_do_not_know_is_a_parse_error() -> None:
    with pytest.raises(SlurmParseError, match="expected ReservationName="):
        parse_reservations("Something=else\n", ARGV)


@pytest.mark.parametrize("name", ["", "a b", "x;rm", "-rf", "a" * 65, "node1\n"])
def test_names_are_checked_before_any_command(name: str) -> None:
    with pytest.raises(SlurmError, match="invalid reservation name"):
        check_name(name)
