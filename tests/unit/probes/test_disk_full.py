"""A full disk, from the probe to the controller's policy: users fill what they can
write, so a full mount drains the node (DRAIN) and is never a reason to reboot or
replace it, however often it fills, and it never counts toward a lemon; a nearly full
one only warns; a read-only mount or an I/O error keeps its reboot. The probe's own
file is never one a user made for it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.node_rules import USER_FILLABLE
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.health import Action, Status, Verdict
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.disk import (
    DiskConfig,
    DiskProbe,
    IoResult,
    MountCheck,
    Space,
    judge_space,
    run_io,
)
from hyperpod_agent.slurm.models import Node

NOW = 1_800_000_000.0
FULL = Space(blocks=1000, blocks_avail=5, files=1000, files_avail=900)
NO_INODES = Space(blocks=1000, blocks_avail=900, files=1000, files_avail=5)
ROOMY = Space(blocks=1000, blocks_avail=900, files=1000, files_avail=900)


def probe_once(tmp_path: Path, result: IoResult) -> list[tuple[str, Status, Action]]:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text("21 1 0:31 / /scratch rw,relatime - tmpfs tmpfs rw\n")
    ctx = ProbeContext(node_name="node2", procfs_root=tmp_path / "proc")
    cfg = DiskConfig.model_validate({"mounts": [{"path": "/scratch", "name": "scratch"}]})
    out = DiskProbe(cfg, ctx, io=lambda path, write, name: result).check()
    return [(f.code, f.status, f.action) for f in out.findings]


# --- the probe: what a full mount asks for --------------------------------------------


@pytest.mark.parametrize(("space", "code"), [(FULL, "fs_full"), (NO_INODES, "fs_inodes_full")])
def test_a_full_mount_is_a_failure_that_asks_for_a_drain(space: Space, code: str) -> None:
    [finding] = judge_space(MountCheck(path="/scratch"), space)
    assert (finding.code, finding.status, finding.action) == (code, Status.FAIL, Action.DRAIN)
    assert not finding.urgent


def test_the_default_is_a_drain_for_every_mount() -> None:
    cfg = DiskConfig.model_validate({"mounts": [{"path": "/scratch"}, {"path": "/tmp"}]})
    assert {m.full_action for m in [*cfg.mounts, *DiskConfig().mounts]} == {Action.DRAIN}


@pytest.mark.parametrize(
    ("space", "code"),
    [(Space(1000, 80, 1000, 900), "fs_space_low"), (Space(1000, 900, 1000, 80), "fs_inodes_low")],
)
def test_a_filling_mount_only_warns(space: Space, code: str) -> None:
    [finding] = judge_space(MountCheck(path="/scratch"), space)
    assert (finding.code, finding.status, finding.action) == (code, Status.WARN, Action.MONITOR)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_a_write_refused_for_space_is_full_too(tmp_path: Path, err: int) -> None:
    findings = probe_once(tmp_path, IoResult(write_errno=err, space=ROOMY))
    assert findings == [("fs_full", Status.FAIL, Action.DRAIN)]


@pytest.mark.parametrize(
    ("result", "code"),
    [
        (IoResult(write_errno=errno.EROFS, space=ROOMY), "fs_readonly"),
        (IoResult(write_errno=errno.EIO, space=ROOMY), "fs_write_error"),
        (IoResult(error="statvfs: Transport endpoint is not connected"), "fs_error"),
    ],
)
def test_read_only_and_io_errors_keep_their_reboot(
    tmp_path: Path, result: IoResult, code: str
) -> None:
    assert probe_once(tmp_path, result) == [(code, Status.FAIL, Action.REBOOT)]


def test_a_site_may_still_ask_for_a_reboot_of_a_full_tmpfs() -> None:
    check = MountCheck(path="/scratch", full_action=Action.REBOOT)
    assert judge_space(check, FULL)[0].action is Action.REBOOT


# --- the probe file: never a user's ------------------------------------------------------


def test_a_symlink_planted_at_the_probe_files_name_is_not_followed(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    planted = scratch / f".hyperpod-probe.{os.getpid()}"  # the name it used to take
    planted.symlink_to(victim)
    result = run_io(str(scratch), True, ".hyperpod-probe")
    assert result.write_errno is None and result.write_latency_s is not None
    assert victim.read_text() == "root:secret\n"
    assert sorted(p.name for p in scratch.iterdir()) == [planted.name]  # ours is gone


def test_a_file_planted_at_the_probe_files_name_is_left_alone(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    planted = scratch / f".hyperpod-probe.{os.getpid()}"
    planted.write_text("mine\n")
    assert run_io(str(scratch), True, ".hyperpod-probe").write_errno is None
    assert planted.read_text() == "mine\n"


# --- the policy: a full disk drained, never rebooted or replaced, never a lemon --------------


def row(code: str, action: str, first_seen: float, fid: int, component: str) -> FaultRow:
    return FaultRow(
        fid, "node2", component, code, "FAIL", action, False, first_seen, first_seen, 1,
        "0.5% space free", None, "disk",
    )  # fmt: skip


def plan(
    open_faults: list[FaultRow], history: list[FaultRow], node2: Node | None = None
) -> list[tuple[str, str]]:
    nodes = {f"node{i}": Node(f"node{i}", "IDLE", partitions=("main",)) for i in range(1, 11)}
    if node2 is not None:
        nodes["node2"] = node2
    health = {n: NodeHealth(Verdict.HEALTHY, NOW - 1, NOW - 1) for n in nodes}
    if open_faults:
        health["node2"] = NodeHealth(Verdict.FAULTY, NOW - 1, NOW - 1)
    snap = Snapshot(
        nodes=nodes,
        health=health,
        open_faults=open_faults,
        history=history + [f for f in open_faults if f not in history],
        started_at=NOW - 3600,
    )
    decision = decide(snap, ControllerConfig(), NOW)
    return [(a.kind.value, a.reason) for a in decision.actions if a.node == "node2"]


def full_disk(fid: int, first_seen: float, code: str = "fs_full") -> FaultRow:
    [finding] = judge_space(MountCheck(path="/scratch", name="scratch"), FULL)
    return row(code, finding.action.value, first_seen, fid, "scratch")  # as the store has it


DRAINED = "hyperpod:drain scratch fs_full 0.5% space free"


def test_a_full_disk_drains_the_node_however_often_it_fills() -> None:
    history = [full_disk(i, NOW - 3600 * i) for i in range(1, 8)]  # filled again and again
    assert plan([full_disk(100, NOW - 60)], history) == [("drain", DRAINED)]


def test_a_node_drained_for_a_full_disk_stays_out_while_full_and_comes_back_once_emptied() -> None:
    out = Node("node2", "IDLE", flags=frozenset({"DRAIN"}), reason=DRAINED, partitions=("main",))
    history = [full_disk(i, NOW - 3600 * i) for i in range(1, 8)]
    assert plan([full_disk(100, NOW - 7200)], history, out) == []  # no reboot, ever
    assert plan([], history, out) == [("resume", "")]


def test_a_full_disk_never_makes_a_lemon_of_a_node() -> None:
    filled = [full_disk(i, NOW - 3600 * i) for i in range(1, 5)]
    filled += [full_disk(i, NOW - 3600 * i, "fs_space_low") for i in range(5, 9)]
    xid = row("xid79", "REBOOT", NOW - 60, 200, "gpu3")
    assert [k for k, _ in plan([xid], filled)] == ["reboot"]  # a first fault, not a lemon
    # what does make a lemon still does
    repeats = [row("xid13", "MONITOR", NOW - 86400 * d, 300 + d, "gpu3") for d in (1, 2, 3, 4)]
    assert [k for k, _ in plan([xid], repeats)] == ["hold"]


def test_a_full_tmpfs_set_to_reboot_still_never_makes_a_lemon() -> None:
    """The space codes are exempt whatever a site made them ask for."""
    filled = [row("fs_full", "REBOOT", NOW - 3600 * i, i, "scratch") for i in range(1, 6)]
    xid = row("xid79", "REBOOT", NOW - 60, 200, "gpu3")
    assert [k for k, _ in plan([xid], filled)] == ["reboot"]


def test_the_lemon_exemption_names_the_disk_probes_space_codes() -> None:
    low = judge_space(MountCheck(path="/s"), Space(100, 8, 100, 8))
    full = judge_space(MountCheck(path="/s"), Space(100, 1, 100, 1))
    assert {f.code for f in low + full} == USER_FILLABLE
