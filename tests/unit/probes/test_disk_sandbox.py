"""The disk probe and the agent's sandbox: a write the unit was never allowed is a
configuration finding; a filesystem that went read-only on the node is a fault."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes._sysfs import MountEntry
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.baseline import BaselineSource
from hyperpod_agent.probes.disk import (
    DiskConfig,
    DiskProbe,
    IoResult,
    MountCheck,
    Space,
    sandbox_denies,
)

SPACE = Space(1000, 900, 1000, 900)


def line(i: int, path: str, opts: str = "rw", fstype: str = "xfs", source: str = "") -> str:
    return (
        f"{30 + i} 1 0:{40 + i} / {path} {opts},relatime - {fstype} {source or f'/dev/x{i}'} {opts}"
    )


def tables(tmp_path: Path, node: list[str], own: list[str] | None) -> Path:
    """A procfs root with the node's mount table (PID 1) and the agent's own."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True, exist_ok=True)
    (proc / "1" / "mountinfo").write_text("\n".join(node) + "\n")
    if own is not None:
        (proc / "self").mkdir(exist_ok=True)
        (proc / "self" / "mountinfo").write_text("\n".join(own) + "\n")
    return proc


class Io:
    """Records which mounts were written; answers ``errno`` to writes."""

    def __init__(self, write_errno: int | None = None) -> None:
        self.write_errno = write_errno
        self.writes: list[str] = []

    def __call__(self, path: str, write: bool, probe_file: str) -> IoResult:
        if not write:
            return IoResult(None, None, SPACE)
        self.writes.append(path)
        if self.write_errno is not None:
            return IoResult(None, self.write_errno, SPACE)
        return IoResult(0.001, None, SPACE)


def probe(proc: Path, io: Io, baseline: Path | None = None, **mount: object) -> DiskProbe:
    cfg = DiskConfig(mounts=[MountCheck.model_validate({"path": "/scratch", **mount})])
    ctx = ProbeContext(
        node_name="node1",
        procfs_root=proc,
        baseline=BaselineSource(baseline, "node1") if baseline else None,
    )
    return DiskProbe(cfg, ctx, io=io)


# --- the pure rule ------------------------------------------------------------------------


def entry(ro: bool = False, fstype: str = "xfs", source: str = "/dev/x") -> MountEntry:
    return MountEntry("/scratch", fstype, source, frozenset({"ro" if ro else "rw"}))


@pytest.mark.parametrize(
    ("node", "own", "denied"),
    [
        (entry(), entry(), False),
        (entry(), entry(ro=True), True),  # ProtectSystem=strict without ReadWritePaths
        (entry(), None, True),  # hidden from the agent (InaccessiblePaths)
        (entry(), entry(fstype="tmpfs", source="tmpfs"), True),  # covered (TemporaryFileSystem)
        (entry(ro=True), entry(ro=True), False),  # read-only on the node: the node's fault
    ],
)
def test_sandbox_denies(node: MountEntry, own: MountEntry | None, denied: bool) -> None:
    assert sandbox_denies(node, own) is denied


# --- by default, write only where the unit may -------------------------------------------


def test_default_write_probe_skips_a_mount_read_only_in_the_sandbox(tmp_path: Path) -> None:
    proc = tables(tmp_path, [line(0, "/scratch")], [line(0, "/scratch", "ro")])
    io = Io()
    out = probe(proc, io).check()
    assert out.status is Status.OK, out
    assert io.writes == []
    assert "not written (read-only in the agent's sandbox): /scratch" in out.message


def test_default_write_probe_writes_where_the_unit_may(tmp_path: Path) -> None:
    proc = tables(tmp_path, [line(0, "/scratch")], [line(0, "/scratch")])
    io = Io()
    assert probe(proc, io).check().status is Status.OK
    assert io.writes == ["/scratch"]


def test_without_the_agents_own_table_the_node_table_decides(tmp_path: Path) -> None:
    io = Io()
    probe(tables(tmp_path, [line(0, "/scratch")], None), io).check()
    assert io.writes == ["/scratch"]


def test_write_probe_false_never_writes(tmp_path: Path) -> None:
    io = Io()
    probe(tables(tmp_path, [line(0, "/scratch")], None), io, write_probe=False).check()
    assert io.writes == []


def test_mount_config_default_is_auto() -> None:
    assert MountCheck(path="/scratch").write_probe is None
    assert DiskConfig().mounts[0].write_probe is False  # "/": statvfs only


# --- refused writes ------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_forced_write_refused_by_the_sandbox_is_configuration(tmp_path: Path, code: int) -> None:
    proc = tables(tmp_path, [line(0, "/scratch")], [line(0, "/scratch", "ro")])
    out = probe(proc, Io(code), write_probe=True).check()
    (finding,) = out.findings
    assert (finding.code, finding.status, finding.action) == (
        "config_write_denied",
        Status.WARN,
        Action.NONE,
    )
    assert not finding.urgent
    assert "ReadWritePaths=/scratch" in finding.message


def test_erofs_where_the_agent_may_write_is_a_fault(tmp_path: Path) -> None:
    # rw in both tables, yet EROFS: the filesystem went read-only under us (ext4 abort)
    proc = tables(tmp_path, [line(0, "/scratch")], [line(0, "/scratch")])
    out = probe(proc, Io(errno.EROFS)).check()
    (finding,) = out.findings
    assert (finding.code, finding.status, finding.action) == (
        "fs_readonly",
        Status.FAIL,
        Action.REBOOT,
    )


def test_read_only_on_the_node_is_a_fault_whatever_the_sandbox(tmp_path: Path) -> None:
    proc = tables(tmp_path, [line(0, "/scratch", "ro")], [line(0, "/scratch", "ro")])
    out = probe(proc, Io(), write_probe=True).check()
    assert [(f.code, f.action) for f in out.findings] == [("fs_readonly", Action.REBOOT)]


def test_eacces_before_any_write_is_configuration_after_one_a_fault(tmp_path: Path) -> None:
    proc = tables(tmp_path, [line(0, "/scratch", fstype="nfs4")], None)
    never = probe(proc, Io(errno.EACCES)).check()
    assert [f.code for f in never.findings] == ["config_write_denied"]
    assert "never allowed" in never.findings[0].message
    io = Io()
    p = probe(proc, io)
    assert p.check().status is Status.OK
    io.write_errno = errno.EACCES  # it could write, and now cannot
    assert [f.code for f in p.check().findings] == ["fs_write_error"]


def test_eio_is_still_a_fault_in_the_sandbox(tmp_path: Path) -> None:
    proc = tables(tmp_path, [line(0, "/scratch")], [line(0, "/scratch", "ro")])
    out = probe(proc, Io(errno.EIO), write_probe=True).check()
    assert [f.code for f in out.findings] == ["fs_write_error"]


# --- the baseline ----------------------------------------------------------------------------


def test_baseline_mount_missing_fails_even_if_optional(tmp_path: Path) -> None:
    base = tmp_path / "baseline.toml"
    base.write_text('version = 1\nnode = "node1"\n[disk]\nmounts = ["/scratch", "/fsx"]\n')
    proc = tables(tmp_path, [line(0, "/")], None)
    out = probe(proc, Io(), baseline=base, required=False).check()
    assert sorted((f.component, f.code) for f in out.findings) == [
        ("/fsx", "fs_missing"),
        ("/scratch", "fs_missing"),
    ]


def test_optional_mount_not_in_the_baseline_may_be_absent(tmp_path: Path) -> None:
    base = tmp_path / "baseline.toml"
    base.write_text('version = 1\nnode = "node1"\n[disk]\nmounts = []\n')
    proc = tables(tmp_path, [line(0, "/")], None)
    assert probe(proc, Io(), baseline=base, required=False).check().status is Status.OK


# --- a real file system and a real sandbox ----------------------------------------------------

SANDBOXED = textwrap.dedent(
    """
    import sys
    from hyperpod_agent.probes.base import ProbeContext
    from hyperpod_agent.probes.disk import DiskConfig, DiskProbe
    force = True if sys.argv[2] == "force" else None
    cfg = DiskConfig(mounts=[{"path": sys.argv[1], "name": "t", "write_probe": force}])
    out = DiskProbe(cfg, ProbeContext(node_name="n1")).check()
    print(out.status.value, *[f.code for f in out.findings])
    """
)


def real_mounts_possible() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def in_namespace(script: str, *args: str) -> str:
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.root
@pytest.mark.skipif(not real_mounts_possible(), reason="needs root and unshare")
@pytest.mark.parametrize(
    ("mode", "expect"), [("force", "WARN config_write_denied"), ("auto", "OK")]
)
def test_real_read_only_bind_in_the_agents_namespace(
    tmp_path: Path, mode: str, expect: str
) -> None:
    # The node (PID 1's namespace) sees a read-write tmpfs; the agent, in its own mount
    # namespace, sees it bind-remounted read-only, as ProtectSystem=strict does.
    mnt = tmp_path / "scratch"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        script = f'mount -o remount,bind,ro "$1"\nexec {sys.executable} -c "$3" "$1" "$2"'
        out = in_namespace(script, str(mnt), mode, SANDBOXED)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
    assert out == expect


@pytest.mark.root
@pytest.mark.skipif(not real_mounts_possible(), reason="needs root and unshare")
def test_real_read_only_remount_on_the_node_is_a_fault(tmp_path: Path) -> None:
    mnt = tmp_path / "data"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        cfg = DiskConfig.model_validate({"mounts": [{"path": str(mnt), "name": "data"}]})
        out = DiskProbe(cfg, ProbeContext(node_name="n1")).check()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
    assert [(f.code, f.action) for f in out.findings] == [("fs_readonly", Action.REBOOT)]
