"""systemd/hyperpod-agent.service: settings the agent relies on, and systemd-analyze."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[3] / "systemd" / "hyperpod-agent.service"


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_agent_contract() -> None:
    s = settings()
    assert s["Type"] == ["notify"] and s["Restart"] == ["always"]
    assert s["RuntimeDirectory"] == ["hyperpod"]
    assert "/run/hyperpod" in s["ReadWritePaths"]
    assert int(s["WatchdogSec"][0]) >= 30  # several default cycles
    after = s["After"][0].split()
    assert {"network-online.target", "munge.service", "slurmd.service"} <= set(after)
    # These would hide /dev/nvidia* and /dev/kmsg from the probes.
    assert "PrivateDevices" not in s and "ProtectKernelLogs" not in s
