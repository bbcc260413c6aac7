"""The probes' default writes agree with the shipped unit's sandbox
(systemd/hyperpod-agent.service: ProtectSystem=strict, RuntimeDirectory,
StateDirectory, ReadWritePaths)."""

from __future__ import annotations

from pathlib import Path

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.probes._links import SEEN_UP_FILE
from hyperpod_agent.probes.disk import DiskConfig, MountCheck

UNIT = Path(__file__).resolve().parents[3] / "systemd" / "hyperpod-agent.service"


def service() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).extend(value.split())
    return out


def writable(path: Path) -> bool:
    svc = service()
    assert svc["ProtectSystem"] == ["strict"]
    roots = [Path("/run") / d for d in svc.get("RuntimeDirectory", [])]
    roots += [Path("/var/lib") / d for d in svc.get("StateDirectory", [])]
    roots += [Path(p.lstrip("-+")) for p in svc.get("ReadWritePaths", [])]
    return any(path.is_relative_to(r) for r in roots)


def test_nic_memory_of_links_seen_up_is_writable_by_the_unit() -> None:
    assert writable(AgentConfig().state_dir / SEEN_UP_FILE)


def test_default_disk_probe_never_forces_a_write() -> None:
    # "/" is read-only for the unit: space only. A listed mount is written only where
    # the unit may (write_probe unset); forcing it is the site's explicit choice.
    assert all(m.write_probe is not True for m in DiskConfig().mounts)
    assert MountCheck(path="/scratch").write_probe is None
    assert not writable(Path("/"))


def test_unit_write_paths_are_few() -> None:
    # Another writable path needs a reason here and in docs/agent.md ("systemd").
    assert service()["ReadWritePaths"] == ["/run/hyperpod"]
