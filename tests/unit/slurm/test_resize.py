"""Job shrink and expansion through stand-in Slurm tools (argv, Slurm's noise, refusals);
the recipe itself runs on the real cluster in tests/integration/test_slurm_adapter.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_slurm_client import FAKE, Fake

from hyperpod_agent.errors import SlurmError


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    f = Fake(tmp_path)
    salloc = f.bin / "salloc"
    salloc.write_text(FAKE)
    salloc.chmod(0o755)
    return f


def test_shrink_keeps_the_named_nodes(fake: Fake) -> None:
    fake.client().shrink_job(12, ["node1", "node3", "node2"])
    assert fake.argvs() == [["scontrol", "update", "jobid=12", "NodeList=node[1-3]"]]


@pytest.mark.parametrize("keep", [[], ["node1;x"]])
def test_shrink_refuses_bad_input_before_any_command(fake: Fake, keep: list[str]) -> None:
    with pytest.raises(SlurmError):
        fake.client().shrink_job(12, keep)
    assert fake.argvs() == []


def test_an_expansion_is_a_helper_allocation_on_the_spare(fake: Fake) -> None:
    granted = "salloc: Pending job allocation 40\nsalloc: Granted job allocation 40\n"
    fake.answer("salloc", err=granted)
    assert fake.client().allocate_expansion(12, "node5", 10) == 40
    assert fake.argvs() == [
        [
            "salloc", "--no-shell", "-N1", "--nodelist=node5", "--immediate=10",
            "--dependency=expand:12", "--job-name=hyperpod-expand-12",
        ]
    ]  # fmt: skip


def test_an_expansion_that_is_not_granted_says_so(fake: Fake) -> None:
    said = (
        "salloc: Pending job allocation 41\n"
        "salloc: error: Unable to allocate resources: Connection timed out\n"
    )
    fake.answer("salloc", err=said, rc=1)
    with pytest.raises(SlurmError, match="no expansion on node5 for job 12 .helper job 41"):
        fake.client().allocate_expansion(12, "node5", 2)


def test_absorbing_ignores_slurms_unexpected_message_only(fake: Fake) -> None:
    fake.answer("scontrol", err="Unexpected message received for job 12\n", rc=1)
    fake.client().absorb_expansion(12, 40)
    assert fake.argvs()[-2:] == [
        ["scontrol", "update", "jobid=40", "NumNodes=0"],
        ["scontrol", "update", "jobid=12", "NumNodes=ALL"],
    ]
    fake.answer("scontrol", err="slurm_update error: Invalid job id specified\n", rc=1)
    with pytest.raises(SlurmError, match="Invalid job id"):
        fake.client().absorb_expansion(12, 40)


def test_absorbing_does_not_wait_out_slurms_size_lookup(fake: Fake) -> None:
    # 22.05's scontrol has merged the job when it starts a lookup that ends only at
    # MessageTimeout (10 s by default): the command is not waited for past a second.
    scontrol = fake.bin / "scontrol"
    scontrol.write_text('#!/bin/sh\ncase "$*" in *NumNodes=ALL*) /bin/sleep 5;; esac\nexit 0\n')
    scontrol.chmod(0o755)
    started = time.monotonic()
    fake.client().absorb_expansion(12, 40)
    assert time.monotonic() - started < 4.5
