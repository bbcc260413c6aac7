"""Namespace pins: a pin's name must stay unique when the kernel hands a node's new
slurmd a pid an earlier one had (pid_max is often 32768): a pin is a bind mount, and
opening an existing one to create it fails with EPERM."""

from __future__ import annotations

from pathlib import Path

from hyperpod_agent.localcluster.namespaces import pin_path


def test_a_reused_pid_gets_a_pin_of_its_own() -> None:
    run = Path("/x/run")
    first = pin_path(run, "node4", 13590, started=1000)
    again = pin_path(run, "node4", 13590, started=98765)
    assert first != again
    assert first.parent == again.parent == run / "ns"
    assert first.name.startswith("node4.13590")
