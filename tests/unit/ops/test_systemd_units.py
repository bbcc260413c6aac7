"""systemd/*.service: both units verify cleanly and have the properties production needs.

tests/unit/agent/test_systemd_unit.py holds the agent's own contract (its cache
directory, the devices its probes need). This module checks what every unit we ship
must have, the controller's own contract, that each unit's defaults agree with the
code it starts, and that the agent's sandbox does not make its own probes lie.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SYSTEMD = ROOT / "systemd"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

Unit = dict[str, dict[str, list[str]]]


@dataclass(frozen=True)
class Expect:
    """What one unit must say, and where its daemon writes by default."""

    binary: str
    slurm_unit: str
    config_path: Path
    loop_interval_s: float
    writes: tuple[Path, ...]


def _agent() -> Expect:
    from hyperpod_agent.agent.config import DEFAULT_CONFIG_PATH, AgentConfig

    cfg = AgentConfig()
    writes: tuple[Path, ...] = (cfg.cache_path, cfg.state_dir)
    if cfg.auto_resume_markers is not None:
        writes += (cfg.auto_resume_markers,)
    if cfg.memory_tier.cleanup:
        writes += (cfg.memory_tier.root / "12345",)  # a finished job's memory tier
    writes += (cfg.progress_dir / "12345",)  # a finished job's progress records
    return Expect(
        "hyperpod-agent", "slurmd.service", DEFAULT_CONFIG_PATH, cfg.effective_cycle_s(), writes
    )


def _controller() -> Expect:
    from hyperpod_agent.controller.config import DEFAULT_PATH, ControllerConfig

    cfg = ControllerConfig()
    lock = cfg.state_db.with_name(cfg.state_db.name + ".lock")
    # A pass may take up to a few Slurm calls, each bounded by slurm_timeout_s.
    return Expect(
        "hyperpod-controller",
        "slurmctld.service",
        DEFAULT_PATH,
        cfg.reconcile_interval_s + 3 * cfg.slurm_timeout_s,
        (cfg.state_db, lock),
    )


EXPECT = {"hyperpod-agent": _agent, "hyperpod-controller": _controller}
NAMES = sorted(EXPECT)


# ---------------------------------------------------------------- helpers


def parse_unit(text: str) -> Unit:
    """Sections -> key -> values, with systemd's rules for continuations and resets."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical = re.sub(r"\\\n", " ", text)
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        values = section.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()  # an empty assignment resets a list setting
    return unit


_SPAN = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 0.001}


def timespan(value: str) -> float:
    """Seconds in a systemd time span such as ``60``, ``2min`` or ``1min 30s``."""
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    for number, unit in parts:
        total += float(number) * _SPAN[unit]
    return total


def load(name: str) -> Unit:
    return parse_unit((SYSTEMD / f"{name}.service").read_text())


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}: expected one value, got {values}"
    return values[0]


def words(unit: Unit, section: str, key: str) -> set[str]:
    return {w for v in unit.get(section, {}).get(key, []) for w in v.split()}


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail(
            "systemd-analyze not found: install systemd (apt-get install systemd; "
            "scripts/setup.sh does it)"
        )
    return found


def entry_point(binary: str) -> Path:
    path = Path(sys.executable).parent / binary
    if not path.exists():
        pytest.fail(f"{path} missing: install the package (pip install -e .)")
    return path


def verify(text: str, name: str, tmp: Path) -> tuple[int, list[str]]:
    """Exit status of ``systemd-analyze verify`` and its complaints about this unit."""
    unit = tmp / f"{name}.service"
    unit.write_text(text)
    proc = subprocess.run(
        [systemd_analyze(), "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # verify exits 0 on unknown keys and unparsable values; it only warns about them.
    complaints = [ln for ln in proc.stderr.splitlines() if unit.name in ln]
    return proc.returncode, complaints


def runnable(name: str) -> str:
    """The unit's text with ExecStart pointed at this environment's entry point."""
    text = (SYSTEMD / f"{name}.service").read_text()
    exe = one(parse_unit(text), "Service", "ExecStart").split()[0]
    return text.replace(f"ExecStart={exe}", f"ExecStart={entry_point(Path(exe).name)}")


# ---------------------------------------------------------------- helpers' own tests


def test_parse_unit_rules() -> None:
    unit = parse_unit(
        textwrap.dedent("""\
        [Unit]
        After=a.service \\
          b.service
        # comment
        [Service]
        ExecStart=/bin/x
        ExecStart=
        ExecStart=/bin/y
        """)
    )
    assert unit["Unit"]["After"] == ["a.service    b.service"]
    assert unit["Service"]["ExecStart"] == ["/bin/y"]
    assert timespan("60") == 60 and timespan("2min") == 120 and timespan("1min 30s") == 90


def test_verify_reports_mistakes(tmp_path: Path) -> None:
    text = runnable("hyperpod-controller").replace(
        "Restart=always", "Restart=always\nBogusKey=1\nProtectSystem=bananas"
    )
    rc, complaints = verify(text, "broken", tmp_path)
    assert rc == 0  # which is why complaints are checked too
    assert len(complaints) == 2 and "BogusKey" in complaints[0], complaints
    missing = text.replace(str(entry_point("hyperpod-controller")), "/nonexistent/hyperpod")
    rc, _ = verify(missing, "missing", tmp_path)
    assert rc != 0


# ---------------------------------------------------------------- every unit


@pytest.mark.parametrize("name", NAMES)
def test_systemd_analyze_verify_is_clean(name: str, tmp_path: Path) -> None:
    rc, complaints = verify(runnable(name), name, tmp_path)
    assert (rc, complaints) == (0, [])


def test_every_shipped_unit_is_checked() -> None:
    assert sorted(p.stem for p in SYSTEMD.glob("*.service")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_execstart_matches_the_entry_point(name: str, tmp_path: Path) -> None:
    expect = EXPECT[name]()
    argv = one(load(name), "Service", "ExecStart").split()
    assert Path(argv[0]).is_absolute() and Path(argv[0]).name == expect.binary
    assert expect.binary in SCRIPTS
    assert argv[1:] == ["--config", str(expect.config_path)]
    # The installed entry point accepts these arguments (click parses them before --help).
    proc = subprocess.run(
        [str(entry_point(expect.binary)), *argv[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_ordering(name: str) -> None:
    unit, expect = load(name), EXPECT[name]()
    assert "network-online.target" in words(unit, "Unit", "Wants")
    after = words(unit, "Unit", "After")
    assert {"network-online.target", "munge.service", expect.slurm_unit} <= after
    assert one(unit, "Unit", "StartLimitIntervalSec") == "0"  # never stop restarting
    assert "multi-user.target" in words(unit, "Install", "WantedBy")
    assert one(unit, "Unit", "Description") and one(unit, "Unit", "Documentation")


@pytest.mark.parametrize("name", NAMES)
def test_documentation_link_points_at_a_doc(name: str) -> None:
    url = one(load(name), "Unit", "Documentation")
    match = re.fullmatch(r"https://github\.com/[^/]+/[^/]+/blob/main/(docs/[\w.-]+\.md)", url)
    assert match, url
    assert (ROOT / match.group(1)).is_file()


@pytest.mark.parametrize("name", NAMES)
def test_restart_and_watchdog(name: str) -> None:
    unit, expect = load(name), EXPECT[name]()
    svc = "Service"
    assert one(unit, svc, "Restart") in {"always", "on-failure"}
    assert timespan(one(unit, svc, "RestartSec")) > 0
    assert timespan(one(unit, svc, "TimeoutStopSec")) > 0
    assert one(unit, svc, "Type") == "notify"
    assert one(unit, svc, "NotifyAccess") == "main"
    # Several loop intervals, so one slow pass is not a restart.
    assert timespan(one(unit, svc, "WatchdogSec")) >= 3 * expect.loop_interval_s


HARDENING = {
    "NoNewPrivileges": {"yes"},
    "ProtectSystem": {"strict", "full"},
    "ProtectHome": {"yes", "read-only", "tmpfs"},
    "PrivateTmp": {"yes"},
    "RestrictSUIDSGID": {"yes"},
    "LockPersonality": {"yes"},
    "RestrictRealtime": {"yes"},
    "RestrictNamespaces": {"yes"},
    "ProtectHostname": {"yes"},
    "ProtectClock": {"yes"},
    "ProtectKernelModules": {"yes"},
    "ProtectKernelTunables": {"yes"},
    "ProtectControlGroups": {"yes"},
    "SystemCallArchitectures": {"native"},
}


@pytest.mark.parametrize("name", NAMES)
def test_hardening(name: str) -> None:
    unit = load(name)
    for key, allowed in HARDENING.items():
        assert one(unit, "Service", key) in allowed, key
    families = words(unit, "Service", "RestrictAddressFamilies")
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families  # munge, sd_notify, HTTP
    assert "AF_PACKET" not in families and not any(f.startswith("~") for f in families)


def writable_roots(unit: Unit) -> list[Path]:
    svc = unit["Service"]
    roots = [Path("/run") / d for v in svc.get("RuntimeDirectory", []) for d in v.split()]
    roots += [Path("/var/lib") / d for v in svc.get("StateDirectory", []) for d in v.split()]
    roots += [Path(p.lstrip("-+")) for v in svc.get("ReadWritePaths", []) for p in v.split()]
    return roots


@pytest.mark.parametrize("name", NAMES)
def test_default_paths_are_writable(name: str) -> None:
    unit, expect = load(name), EXPECT[name]()
    roots = writable_roots(unit)
    # strict: all of / is read-only but the listed roots and the API filesystems (/dev,
    # /proc, /sys, per systemd.exec); full: only /usr, /boot, /etc.
    strict = one(unit, "Service", "ProtectSystem") == "strict"
    readonly = [Path("/")] if strict else [Path("/usr"), Path("/boot"), Path("/etc")]
    api = [Path("/dev"), Path("/proc"), Path("/sys")] if strict else []
    for path in expect.writes:
        blocked = any(path.is_relative_to(r) for r in readonly)
        blocked = blocked and not any(path.is_relative_to(a) for a in api)
        assert not blocked or any(path.is_relative_to(r) for r in roots), (
            f"{path} is read-only; writable: {roots}"
        )
    assert all(r.is_relative_to("/run") or r.is_relative_to("/var") for r in roots), roots


def test_controller_contract() -> None:
    unit = load("hyperpod-controller")
    assert one(unit, "Service", "StateDirectory") == "hyperpod"
    assert int(one(unit, "Service", "StateDirectoryMode"), 8) & 0o007 == 0  # fault history
    assert one(unit, "Service", "UMask") == "0027"
    # The controller needs no GPU and no kernel log, unlike the agent.
    assert one(unit, "Service", "PrivateDevices") == "yes"
    assert one(unit, "Service", "ProtectKernelLogs") == "yes"


def test_agent_runtime_directory_survives_restarts() -> None:
    unit = load("hyperpod-agent")
    assert one(unit, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert int(one(unit, "Service", "RuntimeDirectoryMode"), 8) & 0o005 == 0o005  # slurmd reads


# ---------------------------------------------------------------- the agent in its sandbox

SANDBOX_PROBE = """
import sys
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.disk import DiskConfig, DiskProbe
outcome = DiskProbe(DiskConfig(), ProbeContext(node_name="n1")).check()
print(outcome.status.value, outcome.message)
"""


def sandboxed(protect_system: str, newroot: Path) -> list[str]:
    """argv running the default disk probe the way systemd confines a unit's root.

    systemd builds ProtectSystem=strict by bind-mounting the root elsewhere, remounting
    it read-only, moving it onto / and chrooting into it; this does the same in a new
    mount namespace (ProtectSystem=full only makes /usr, /boot and /etc read-only).
    """
    steps = [f"mount --rbind / {newroot}"]
    if protect_system == "strict":
        # Only the root mount turns read-only; mounts below it keep their own flags.
        steps.append(f"mount -o remount,bind,ro {newroot}")
    else:
        for path in ("usr", "boot", "etc"):
            target = newroot / path
            steps.append(
                f"if [ -d {target} ]; then mount --rbind {target} {target} && "
                f"mount -o remount,bind,ro {target}; fi"
            )
    steps += [
        f"cd {newroot}",
        "mount --move . /",
        f"exec chroot . {sys.executable} -c '{SANDBOX_PROBE}'",
    ]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", "\n".join(steps)]


def run_sandboxed(mode: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("unshare") is None:
        pytest.fail("unshare not found (util-linux)")
    newroot = tmp_path / "root"
    newroot.mkdir()
    return subprocess.run(
        sandboxed(mode, newroot),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ),
        check=False,
    )


@pytest.mark.root
def test_sandbox_harness_leaves_a_writable_root_alone(tmp_path: Path) -> None:
    # With ProtectSystem=full the root stays writable: the default probe must say OK,
    # so the harness itself does not make the probe fail.
    proc = run_sandboxed("full", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK "), proc.stdout


@pytest.mark.root
def test_agent_default_disk_probe_is_ok_inside_the_unit_sandbox(tmp_path: Path) -> None:
    proc = run_sandboxed(one(load("hyperpod-agent"), "Service", "ProtectSystem"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK "), proc.stdout


# ---------------------------------------------------------------- the controller on PostgreSQL

# Where provisioning expects the store's password (docs/controller.md "High availability").
PASSWORD_FILE = Path("/etc/hyperpod/store.password")
# Settings that cut a service off the network, or from some of it.
NETWORK_CUTS = (
    "PrivateNetwork",
    "IPAddressDeny",
    "IPAddressAllow",
    "RestrictNetworkInterfaces",
    "NetworkNamespacePath",
)


def hidden_paths(unit: Unit) -> list[Path]:
    """Paths the service cannot read: made inaccessible, or covered by an empty tmpfs."""
    svc = unit["Service"]
    paths = [Path(p.lstrip("-+")) for v in svc.get("InaccessiblePaths", []) for p in v.split()]
    paths += [Path(v.split(":")[0]) for v in svc.get("TemporaryFileSystem", [])]
    home = svc.get("ProtectHome", ["no"])[-1]
    if home in ("yes", "tmpfs"):
        paths += [Path("/home"), Path("/root"), Path("/run/user")]
    if svc.get("PrivateTmp", ["no"])[-1] == "yes":
        paths += [Path("/tmp"), Path("/var/tmp")]
    return paths


def store_blockers(unit: Unit) -> list[str]:
    """What in a unit would keep a controller from its remote PostgreSQL store."""
    svc = unit["Service"]
    found = [f"{key}={svc[key][-1]}" for key in NETWORK_CUTS if svc.get(key)]
    if svc.get("PrivateNetwork") == ["no"]:
        found.remove("PrivateNetwork=no")
    families = words(unit, "Service", "RestrictAddressFamilies")
    if families and not {"AF_INET", "AF_INET6"} <= families:
        found.append(f"RestrictAddressFamilies={' '.join(sorted(families))}")
    if any(PASSWORD_FILE.is_relative_to(p) for p in hidden_paths(unit)):
        found.append(f"{PASSWORD_FILE} hidden")
    if svc.get("PrivateUsers", ["no"])[-1] == "yes":
        found.append("PrivateUsers=yes (a root-only password file is unreadable)")
    return found


def test_store_blockers_finds_what_cuts_the_store_off() -> None:
    text = (SYSTEMD / "hyperpod-controller.service").read_text()
    broken = text.replace(
        "[Service]\n",
        "[Service]\nPrivateNetwork=yes\nIPAddressDeny=any\nInaccessiblePaths=/etc/hyperpod\n",
    )
    assert store_blockers(parse_unit(broken)) == [
        "PrivateNetwork=yes",
        "IPAddressDeny=any",
        f"{PASSWORD_FILE} hidden",
    ]
    unix_only = text.replace("AF_UNIX AF_INET AF_INET6", "AF_UNIX")
    assert store_blockers(parse_unit(unix_only)) == ["RestrictAddressFamilies=AF_UNIX"]


def test_controller_reaches_a_remote_store() -> None:
    # With [ha] every head node runs this one unit, leader and standby alike, against a
    # PostgreSQL server elsewhere.
    unit = load("hyperpod-controller")
    assert store_blockers(unit) == []
    # Started after a database on the same host (no effect when it is remote).
    assert "postgresql.service" in words(unit, "Unit", "After")


def test_provisioning_refuses_the_password_paths_the_unit_hides() -> None:
    from hyperpod_agent.provision.controllers import HIDDEN_FROM_UNIT

    hidden = hidden_paths(load("hyperpod-controller"))
    assert {Path(p) for p in HIDDEN_FROM_UNIT} == set(hidden)
