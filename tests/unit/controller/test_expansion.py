"""controller/expansion.py: slurmctld's version read at most every RECHECK_S (a failed
read every FAILED_RECHECK_S), logged when the answer changes, never read by the API."""

from __future__ import annotations

import logging

import pytest

from hyperpod_agent.controller.expansion import (
    FAILED_RECHECK_S,
    NOT_READ,
    RECHECK_S,
    ExpansionGuard,
)
from hyperpod_agent.errors import SlurmError


class Reader:
    def __init__(self) -> None:
        self.version: str | None = "22.05.8"
        self.fail = False
        self.reads = 0

    def slurmctld_version(self) -> str | None:
        self.reads += 1
        if self.fail:
            raise SlurmError(["scontrol", "show", "config"], 1, "", "slurmctld not answering")
        return self.version


def test_the_version_is_read_once_per_recheck_and_fresh_when_asked() -> None:
    slurm, t = Reader(), [1000.0]
    guard = ExpansionGuard(slurm, lambda: t[0])
    assert guard.known() == NOT_READ and slurm.reads == 0
    assert guard.refusal() == "" and guard.refusal() == "" and slurm.reads == 1
    slurm.version = "25.11.7"
    t[0] += RECHECK_S - 1
    assert guard.refusal() == "" and slurm.reads == 1  # cached
    assert "crashes slurmctld 25.11.7" in guard.refusal(fresh=True) and slurm.reads == 2
    assert guard.known() == guard.refusal() and guard.version == "25.11.7"


def test_a_failed_read_is_refused_cached_briefly_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm, t = Reader(), [1000.0]
    slurm.fail = True
    guard = ExpansionGuard(slurm, lambda: t[0])
    with caplog.at_level(logging.INFO, logger="hyperpod_agent.controller.expansion"):
        for _ in range(50):  # a pass or an API request each
            assert "could not be read" in guard.refusal()
        t[0] += FAILED_RECHECK_S + 1
        assert "could not be read" in guard.refusal()
    assert slurm.reads == 2
    assert len([r for r in caplog.records if "could not be read" in r.getMessage()]) == 1
    slurm.fail = False
    t[0] += FAILED_RECHECK_S + 1
    assert guard.refusal() == ""
