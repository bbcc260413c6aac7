"""The command provider runs an admin's executable at most once per replacement,
with a stable action id, and keeps the service watchdog fed while it runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config

from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.cli import check_watchdog
from hyperpod_agent.controller.providers.base import ProviderError
from hyperpod_agent.controller.providers.command import (
    OUTPUT_TAIL,
    CommandProvider,
    run_bounded,
)
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.errors import ConfigError

REASON = "hyperpod:replace gpu0 xid54 x"


class Stop(BaseException):
    """The controller killed while the command runs (SIGTERM's SystemExit: nothing of
    the pass, its per-item isolation included, catches it)."""


def script(tmp: Path, body: str) -> Path:
    exe = tmp / "replace-node"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return exe


def test_the_command_gets_a_stable_action_id(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    exe = script(tmp_path, f'echo "$1 $HYPERPOD_ACTION_ID $HYPERPOD_NODE" >> {log}\nexit 1\n')
    slurm = FakeSlurm(cluster(4))
    store = Store(tmp_path / "s.db")
    ex = Executor(store, slurm, CommandProvider(slurm, [str(exe)], 30), config())
    [aid] = ex.execute(Decision([PlannedAction(Kind.REPLACE, "node3", REASON, "c")]), {}, [], NOW)
    ex.process_open(slurm.nodes, [], NOW + 60)  # failed once: retried with the same id
    assert log.read_text().splitlines() == [f"node3 {aid} node3"] * 2


def test_a_command_interrupted_by_a_controller_stop_is_never_run_again(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    exe = script(tmp_path, f'echo "$HYPERPOD_ACTION_ID" >> {log}\nsleep 5\n')
    slurm = FakeSlurm(cluster(4))
    store = Store(tmp_path / "s.db")
    ex = Executor(store, slurm, CommandProvider(slurm, [str(exe)], 30), config())

    def stop() -> None:
        raise Stop

    ex.keepalive = stop  # the first watchdog ping finds the controller being killed
    with pytest.raises(Stop):
        ex.execute(Decision([PlannedAction(Kind.REPLACE, "node3", REASON, "c")]), {}, [], NOW)
    [row] = store.open_actions()
    assert row.state == "applied" and row.params["handle"]["interrupted"]
    restarted = Executor(store, slurm, CommandProvider(slurm, [str(exe)], 30), config())
    for t in (1, 10, 31):
        restarted.process_open(slurm.nodes, [], NOW + t)
    assert len(log.read_text().splitlines()) == 1
    assert store.open_actions() == []
    assert "not run again" in store.events()[-1].message


def test_the_watchdog_is_fed_while_the_command_runs(tmp_path: Path) -> None:
    pings: list[int] = []
    code, _ = run_bounded(["sleep", "2.5"], {}, 30, lambda: pings.append(1))
    assert code == 0 and len(pings) >= 1


def test_a_command_over_its_time_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    exe = script(tmp_path, f"echo $$ > {pid_file}\nexec sleep 30\n")
    with pytest.raises(ProviderError, match="timed out after 1 s"):
        run_bounded([str(exe), "node1"], {}, 1, None)
    pid = int(pid_file.read_text())
    assert (
        not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    )


@pytest.mark.parametrize(
    ("kind", "timeout", "watchdog", "refused"),
    [
        ("command", 300.0, "120000000", True),
        ("command", 120.0, "120000000", True),
        ("command", 60.0, "120000000", False),
        ("spare_pool", 300.0, "120000000", False),
        ("command", 300.0, "", False),  # not under a watchdog
        ("command", None, "120000000", False),  # the default fits the shipped unit
        ("command", 300.0, "x", False),
    ],
)
def test_a_command_timeout_at_or_above_the_watchdog_is_refused(
    kind: str, timeout: float | None, watchdog: str, refused: bool
) -> None:
    provider: dict[str, object] = {"kind": kind}
    if timeout is not None:
        provider["command_timeout_s"] = timeout
    if kind == "command":
        provider["command"] = ["/bin/true"]
    cfg = config(provider=provider)
    if refused:
        with pytest.raises(ConfigError, match="must be below the service's WatchdogSec"):
            check_watchdog(cfg, {"WATCHDOG_USEC": watchdog})
    else:
        check_watchdog(cfg, {"WATCHDOG_USEC": watchdog})


def test_a_command_that_writes_a_mib_of_stderr_is_not_blocked(tmp_path: Path) -> None:
    # a pipe holds 64 KiB: a stderr read only at exit blocked the command until the
    # time limit, and the replacement failed as "timed out"
    exe = script(tmp_path, "head -c 1048576 /dev/zero | tr '\\0' 'x' >&2\necho last words >&2\n")
    started = time.monotonic()
    code, err = run_bounded([str(exe), "node1"], {}, 20, None)
    assert code == 0 and time.monotonic() - started < 10
    assert err.endswith("last words\n") and len(err) <= OUTPUT_TAIL


def test_the_tail_of_stderr_names_the_failure(tmp_path: Path) -> None:
    exe = script(tmp_path, "seq 1 100000 >&2\necho 'cloud API: quota exceeded' >&2\nexit 3\n")
    slurm = FakeSlurm(cluster(4))
    provider = CommandProvider(slurm, [str(exe)], 20)
    with pytest.raises(ProviderError, match="exit 3: cloud API: quota exceeded"):
        provider.replace("node3", REASON, {"action_id": 1}, NOW)


def test_a_child_left_holding_stderr_does_not_hold_the_controller(tmp_path: Path) -> None:
    exe = script(tmp_path, "sleep 8 >&2 &\necho started >&2\n")
    started = time.monotonic()
    code, err = run_bounded([str(exe), "node1"], {}, 20, None)
    assert code == 0 and time.monotonic() - started < 5


def test_a_node_an_admin_drained_while_it_was_replaced_stays_drained(tmp_path: Path) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime

    exe = script(tmp_path, "exit 0\n")
    slurm = FakeSlurm(cluster(4))
    store = Store(tmp_path / "s.db")
    ex = Executor(store, slurm, CommandProvider(slurm, [str(exe)], 30), config())
    ex.execute(Decision([PlannedAction(Kind.REPLACE, "node3", REASON, "c")]), {}, [], NOW)
    # The machine came back (a new slurmd), but an admin drained it for their own
    # work before the controller saw it: completing the replacement must not resume it.
    later = datetime.fromtimestamp(NOW + 30, UTC)
    slurm.nodes["node3"] = replace(
        slurm.nodes["node3"],
        flags=frozenset({"DRAIN"}),
        reason="burn-in by the vendor",
        slurmd_start_time=later,
    )
    ex.process_open(slurm.nodes, [], NOW + 31)
    assert slurm.nodes["node3"].reason == "burn-in by the vendor"
    assert ("resume", "node3") not in slurm.calls
    assert store.open_actions() == []
    assert "not resumed" in store.events()[-1].message
