"""slurmctld's version and the job-expansion gate (slurm/version.py): step retry's merge
of a spare runs only on a release the drills showed it safe on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperpod_agent.slurm.version import (
    expansion_refusal,
    parse_version,
    version_from_config,
)

# As `scontrol show config` prints it (22.05.8, abridged).
CONFIG = """Configuration data as of 2026-11-28T09:00:00
AccountingStorageBackupHost = (null)
SLURM_CONF              = /etc/slurm/slurm.conf
SLURM_VERSION           = 22.05.8
SrunEpilog              = (null)
"""


def test_the_version_is_slurmctlds_line() -> None:
    assert version_from_config(CONFIG) == "22.05.8"
    assert version_from_config(CONFIG.replace("22.05.8", "25.11.7")) == "25.11.7"
    assert version_from_config("SLURM_CONF = /x\n") is None
    assert version_from_config("") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("22.05.8", (22, 5, 8)),
        ("25.11.0-0rc1", (25, 11, 0)),
        ("26.05.3", (26, 5, 3)),
        (" 24.11.1 ", (24, 11, 1)),
        ("22.05", None),
        ("x22.05.8", None),
        ("22.05.8; rm -rf", None),
        ("", None),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == expected


def test_expansion_runs_only_where_it_was_shown_safe() -> None:
    assert expansion_refusal("22.05.8") == ""
    assert expansion_refusal("22.05.11") == ""
    assert "crashes slurmctld 25.11.7" in expansion_refusal("25.11.7")
    assert "crashes slurmctld 26.05.3" in expansion_refusal("26.05.3")
    assert "not shown safe on Slurm 24.11.1" in expansion_refusal("24.11.1")
    assert "not known" in expansion_refusal(None)
    assert "not one we know" in expansion_refusal("garbage")


@given(st.text(max_size=40))
def test_any_text_is_refused_or_a_shown_safe_release(text: str) -> None:
    why = expansion_refusal(text)
    parsed = parse_version(text)
    assert why == "" or why.startswith("job expansion refused")
    assert (why == "") == (parsed is not None and parsed[:2] == (22, 5))
