"""The disk probe: mountinfo parsing, thresholds, the I/O thread and its deadline."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.disk import (
    DiskConfig,
    DiskProbe,
    IoResult,
    MountCheck,
    Space,
    judge_space,
    parse_mountinfo,
    run_io,
)

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
40 22 0:35 / /scratch\\040space rw,nosuid - tmpfs tmpfs rw,size=4096k
41 22 0:36 / /fsx ro,relatime - lustre 10.0.0.1@tcp:/fsx ro,flock
42 22 0:37 / /data rw - nfs4 srv:/export rw,vers=4.2
43 22 0:38 / /data rw - nfs4 srv:/other ro,vers=4.2
garbage line
"""


def fake_proc(root: Path, mountinfo: str) -> Path:
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "self" / "mountinfo").write_text(mountinfo)
    return root


def mountinfo_for(*paths: str, options: str = "rw") -> str:
    lines = [
        f"{20 + i} 1 0:{30 + i} / {p} {options},relatime - ext4 /dev/x{i} {options}"
        for i, p in enumerate(paths)
    ]
    return "\n".join(lines) + "\n"


def probe(tmp_path: Path, mountinfo: str, io: object = run_io, **cfg: object) -> DiskProbe:
    ctx = ProbeContext(node_name="node1", procfs_root=fake_proc(tmp_path / "proc", mountinfo))
    return DiskProbe(DiskConfig.model_validate(cfg), ctx, io=io)  # type: ignore[arg-type]


def space_io(space: Space, write_errno: int | None = None, latency: float = 0.001) -> object:
    def io(path: str, write: bool, probe_file: str) -> IoResult:
        return IoResult(latency if write and write_errno is None else None, write_errno, space)

    return io


ROOMY = Space(blocks=1000, blocks_avail=900, files=1000, files_avail=900)

# --- pure parts ----------------------------------------------------------------------------


def test_parse_mountinfo_fields_escapes_and_options() -> None:
    table = parse_mountinfo(MOUNTINFO)
    assert set(table) == {"/", "/mnt2", "/scratch space", "/fsx", "/data"}
    assert table["/"].fstype == "ext4" and table["/"].source == "/dev/sda1"
    assert not table["/"].readonly
    assert table["/fsx"].readonly
    assert table["/scratch space"].fstype == "tmpfs"


def test_parse_mountinfo_stacked_mount_last_wins_and_super_ro_counts() -> None:
    entry = parse_mountinfo(MOUNTINFO)["/data"]
    assert entry.source == "srv:/other"
    assert entry.readonly  # read-only superblock under a rw mount


@pytest.mark.parametrize(
    ("avail", "code", "status"),
    [(500, None, None), (100, "fs_space_low", Status.WARN), (30, "fs_full", Status.FAIL)],
)
def test_judge_space_blocks(avail: int, code: str | None, status: Status | None) -> None:
    check = MountCheck(path="/scratch")
    findings = judge_space(check, Space(1000, avail, 1000, 1000))
    assert [(f.code, f.status) for f in findings] == ([(code, status)] if code else [])


def test_judge_space_inodes_and_zero_totals() -> None:
    check = MountCheck(path="/scratch", inodes_warn_pct=20, inodes_fail_pct=5)
    low = judge_space(check, Space(1000, 1000, 100, 10))
    assert [(f.code, f.status, f.action) for f in low] == [
        ("fs_inodes_low", Status.WARN, Action.MONITOR)
    ]
    full = judge_space(check, Space(1000, 1000, 100, 2))
    assert full[0].code == "fs_inodes_full" and full[0].action is Action.DRAIN
    assert "2.0% inodes free" in full[0].message
    assert judge_space(check, Space(0, 0, 0, 0)) == []


def test_full_action_is_configurable() -> None:
    check = MountCheck(path="/scratch", full_action=Action.RESET)
    assert judge_space(check, Space(100, 0, 100, 100))[0].action is Action.RESET


# --- probe against real directories --------------------------------------------------------


def test_defaults_check_root_space_without_writing(tmp_path: Path) -> None:
    calls: list[tuple[str, bool]] = []

    def io(path: str, write: bool, probe_file: str) -> IoResult:
        calls.append((path, write))
        return IoResult(space=ROOMY)

    out = probe(tmp_path, mountinfo_for("/"), io).check()
    assert out.status is Status.OK
    assert calls == [("/", False)]


def test_healthy_writable_mount_measures_latency(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    p = probe(tmp_path, mountinfo_for(str(data)), mounts=[{"path": str(data), "name": "data"}])
    out = p.check()
    assert out.status is Status.OK, out.message
    assert "data write" in out.message and "ms" in out.message
    assert list(data.iterdir()) == []  # the probe file is removed


def test_required_mount_missing_fails(tmp_path: Path) -> None:
    out = probe(tmp_path, mountinfo_for("/"), mounts=[{"path": "/scratch"}]).check()
    assert out.status is Status.FAIL
    assert [(f.component, f.code) for f in out.findings] == [("/scratch", "fs_missing")]


def test_optional_mount_missing_is_ignored(tmp_path: Path) -> None:
    p = probe(tmp_path, mountinfo_for("/"), mounts=[{"path": "/opt/x", "required": False}])
    out = p.check()
    assert (out.status, out.message) == (Status.OK, "0 mount(s) ok, 1 optional mount(s) absent")


def test_mounted_readonly_fails_and_skips_the_write(tmp_path: Path) -> None:
    calls: list[bool] = []

    def io(path: str, write: bool, probe_file: str) -> IoResult:
        calls.append(write)
        return IoResult(space=ROOMY)

    p = probe(tmp_path, mountinfo_for("/fsx", options="ro"), io, mounts=[{"path": "/fsx"}])
    out = p.check()
    assert out.status is Status.FAIL
    assert [f.code for f in out.findings] == ["fs_readonly"]
    assert calls == [False]


def test_erofs_on_write_is_readonly(tmp_path: Path) -> None:
    io = space_io(ROOMY, write_errno=errno.EROFS)
    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert [f.code for f in out.findings] == ["fs_readonly"]


def test_other_write_error_fails(tmp_path: Path) -> None:
    io = space_io(ROOMY, write_errno=errno.EIO)
    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert out.status is Status.FAIL
    assert out.findings[0].code == "fs_write_error"
    assert "Input/output error" in out.findings[0].message


def test_enospc_reports_full_once(tmp_path: Path) -> None:
    io = space_io(Space(1000, 0, 1000, 1000), write_errno=errno.ENOSPC)
    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert [f.code for f in out.findings] == ["fs_full"]
    io = space_io(ROOMY, write_errno=errno.ENOSPC)  # e.g. a quota: statvfs looks fine
    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert [f.code for f in out.findings] == ["fs_full"]


def test_slow_write_warns(tmp_path: Path) -> None:
    io = space_io(ROOMY, latency=2.5)
    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert out.status is Status.WARN
    assert out.findings[0].code == "fs_slow"
    assert "2.50s" in out.findings[0].message


def test_statvfs_error_fails(tmp_path: Path) -> None:
    def io(path: str, write: bool, probe_file: str) -> IoResult:
        return IoResult(error="statvfs: Transport endpoint is not connected")

    out = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}]).check()
    assert out.findings[0].code == "fs_error"


def test_io_function_crash_raises_for_the_runner(tmp_path: Path) -> None:
    def io(path: str, write: bool, probe_file: str) -> IoResult:
        raise ValueError("bug")

    p = probe(tmp_path, mountinfo_for("/fsx"), io, mounts=[{"path": "/fsx"}])
    with pytest.raises(RuntimeError, match="bug"):
        p.check()


def test_missing_mountinfo_raises(tmp_path: Path) -> None:
    ctx = ProbeContext(node_name="n", procfs_root=tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        DiskProbe(DiskConfig(), ctx).check()


def test_real_run_io_on_a_directory(tmp_path: Path) -> None:
    result = run_io(str(tmp_path), True, ".probe")
    assert result.write_errno is None and result.write_latency_s is not None
    assert result.space is not None and result.space.blocks > 0
    bad = run_io(str(tmp_path / "absent"), True, ".probe")
    assert bad.write_errno == errno.ENOENT and bad.error is not None


# --- hung filesystems ----------------------------------------------------------------------


def test_hung_io_fails_on_time_and_is_not_restarted(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[str] = []

    def io(path: str, write: bool, probe_file: str) -> IoResult:
        calls.append(path)
        release.wait(10)
        return IoResult(0.001, None, ROOMY)

    p = probe(
        tmp_path,
        mountinfo_for("/fsx"),
        io,
        mounts=[{"path": "/fsx"}],
        io_timeout_s=0.2,
        latency_warn_s=0.1,
    )
    try:
        start = time.monotonic()
        out = p.check()
        assert time.monotonic() - start < 2
        assert out.status is Status.FAIL
        assert [f.code for f in out.findings] == ["fs_hung"]
        again = p.check()
        assert again.findings[0].code == "fs_hung"
        assert "still stuck" in again.findings[0].message
        assert calls == ["/fsx"]  # no second I/O piled onto the stuck mount
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while p.check().status is not Status.OK and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.check().status is Status.OK
    assert len(calls) >= 2


def test_one_hung_mount_does_not_hide_the_others(tmp_path: Path) -> None:
    release = threading.Event()

    def io(path: str, write: bool, probe_file: str) -> IoResult:
        if path == "/fsx":
            release.wait(10)
        return IoResult(space=Space(100, 1, 100, 100))

    p = probe(
        tmp_path,
        mountinfo_for("/fsx", "/scratch"),
        io,
        mounts=[{"path": "/fsx"}, {"path": "/scratch"}],
        io_timeout_s=0.2,
        latency_warn_s=0.1,
    )
    try:
        out = p.check()
    finally:
        release.set()
    assert {(f.component, f.code) for f in out.findings} == {
        ("/fsx", "fs_hung"),
        ("/scratch", "fs_full"),
    }


# --- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        {"mounts": [{"path": "relative"}]},
        {"mounts": [{"path": "/a"}, {"path": "/a/"}]},
        {"mounts": [{"path": "/a", "free_warn_pct": 5, "free_fail_pct": 10}]},
        {"mounts": [{"path": "/a", "inodes_warn_pct": 1, "inodes_fail_pct": 2}]},
        {"mounts": [{"path": "/a", "bogus": 1}]},
        {"io_timeout_s": 10, "timeout_s": 10},
        {"latency_warn_s": 5, "io_timeout_s": 3},
        {"probe_file": "../escape"},
        {"mounts": [{"path": "/" + "x" * 70}]},
        {"mounts": [{"path": "/a", "name": ""}]},
    ],
)
def test_config_rejects_bad_values(cfg: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DiskConfig.model_validate(cfg)


def test_config_normalises_paths_and_defaults() -> None:
    cfg = DiskConfig.model_validate({"mounts": [{"path": "/scratch/"}]})
    assert cfg.mounts[0].path == "/scratch"
    default = DiskConfig()
    assert [(m.path, m.write_probe) for m in default.mounts] == [("/", False)]


def test_long_paths_need_a_short_name(tmp_path: Path) -> None:
    long_path = "/" + "d" * 70
    cfg = {"mounts": [{"path": long_path, "name": "scratch"}]}
    out = probe(tmp_path, mountinfo_for("/"), **cfg).check()
    assert [(f.component, f.code) for f in out.findings] == [("scratch", "fs_missing")]
