"""Deep-check drills: the suite as a Slurm job in a maintenance reservation the
controller owns, on the local cluster (real Slurm, fake diagnostic tools that print
the real tools' formats, outcomes set per node by the scenario file).

The local cluster configures a suite, so its controller runs with both gates on (the
default): it qualifies the spares as it starts and checks every node back from a
reboot. Every drill restores the cluster (all-pass scenario, fakes in place, the
default gates, every node back where the other tests expect it), even when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from drill_helpers import REBOOT_FLAGS, Drill, wait_for

from hyperpod_agent.localcluster import deepchecks
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.drill import inject_xid, submit_training, wait_job_end
from hyperpod_agent.slurm.models import Node

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

RUN_S = 60.0  # a quick run on the fakes takes a few seconds; reboots up to ~40 s
GATES = {"gate_reentry": True, "gate_spares": True}
_GATED: list[bool] = []  # set while a drill's controller runs with gates of its own


def gates_on(drill: Drill, gates: dict[str, Any]) -> None:
    _GATED.append(True)
    drill.fresh_controller(deep_checks=gates)


def reservations(drill: Drill) -> list[Any]:
    return drill.slurm.reservations()


def our_reservations(drill: Drill) -> list[str]:
    return [r.name for r in reservations(drill) if r.name.startswith("hyperpod-check-")]


def runs(drill: Drill) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = drill.hyperpod_json("checks")
    return found


def run_of(drill: Drill, run_id: int) -> dict[str, Any]:
    found: dict[str, Any] = drill.hyperpod_json("checks", str(run_id))
    return found


def held_for(node: Node, check: str) -> bool:
    return node.drained and f"deep-check {check}" in node.reason


def scenario(drill: Drill, nodes: dict[str, dict[str, Any]]) -> None:
    deepchecks.write_scenario(drill.cluster.dir, nodes)


def settled_checks(drill: Drill) -> None:
    """Wait until no run is under way: with the default gates the controller qualifies
    the spares as it starts and whenever one enters the pool again (a restore), and a
    drill counts and watches its own runs."""
    wait_for(
        "no deep-check run under way",
        lambda: all(r["phase"] == "done" for r in runs(drill)) and not our_reservations(drill),
        timeout=RUN_S,
        step=1.0,
        detail=lambda: {"runs": runs(drill), "states": drill.describe()},
    )


@pytest.fixture(scope="module")
def drill(service_cluster: LocalCluster) -> Iterator[Drill]:
    d = Drill(service_cluster)
    d.fresh_controller()
    d.restore()
    settled_checks(d)
    yield d
    scenario(d, {})
    d.fresh_controller()
    d.restore()


@pytest.fixture
def clean(drill: Drill) -> Iterator[Drill]:
    """Start from an all-pass scenario; afterwards the default gates, no reservation of
    ours."""
    scenario(drill, {})
    settled_checks(drill)
    yield drill
    scenario(drill, {})
    deepchecks.install(drill.cluster.dir)  # a drill may have taken a tool away
    leftovers = our_reservations(drill)
    if _GATED or leftovers:
        _GATED.clear()
        drill.fresh_controller()  # the default gates again (a restart costs ~10 s: only then)
    for name in leftovers:
        for job in drill.slurm.list_jobs(all_states=False):
            if job.name == name:  # never a run the controller started since
                drill.slurm.cancel(job.job_id)
        wait_for("our reservation to go", lambda n=name: _gone(drill, n), timeout=30)
    spares = set(drill.spares)
    for name in drill.nodes:
        if name not in spares and drill.node(name).reason.startswith("hyperpod:spare"):
            drill.slurm.resume(name)  # a node a drill made a spare goes back to service
    drill.restore(timeout=120)


def _gone(drill: Drill, name: str) -> bool:
    try:
        drill.slurm.delete_reservation(name)
    except Exception:  # noqa: BLE001 - still in use: the cancelled job is leaving
        return False
    return True


# --- on demand: the reservation shows while it runs, then goes ------------------------


def test_node_check_runs_in_a_maintenance_reservation_and_removes_it(clean: Drill) -> None:
    drill = clean
    # the quick dcgm diagnostic takes 4 s on both nodes: long enough to see the run
    scenario(drill, {n: {"dcgmi": {"delay_s": 4}} for n in ("node1", "node2")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "hyperpod_agent", "node", "check", "node1", "node2", "--wait"],
        env=drill.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + RUN_S
        while proc.poll() is None and time.monotonic() < deadline:
            seen += [r for r in reservations(drill) if r.name.startswith("hyperpod-check-")]
            time.sleep(0.3)
        out, err = proc.communicate(timeout=RUN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, (out, err)
    assert seen, "no hyperpod-check reservation seen while the check ran"
    assert set(seen[0].nodes) == {"node1", "node2"} and "MAINT" in seen[0].flags
    for node in ("node1", "node2"):
        for check in ("dcgm-quick", "nvlink", "nccl-allreduce"):
            assert any(line.split()[:3] == [node, check, "OK"] for line in out.splitlines()), out
    assert "running" in err  # progress while it ran
    assert our_reservations(drill) == []
    states = drill.states()
    assert all(not states[n].drained and not states[n].reason for n in ("node1", "node2"))
    # the run's own events: the controller also qualifies the spares (the default gates)
    kinds = [
        e["kind"]
        for e in drill.events()
        if "deep check run" in e["message"] and e.get("node") in ("node1", "node2", None)
    ]
    assert kinds.count("deep_check_ok") == 2 and "deep_check_done" in kinds


# --- refusals start nothing -------------------------------------------------------------


def test_bad_requests_are_one_line_errors_and_start_nothing(clean: Drill) -> None:
    drill = clean
    before = len(runs(drill))
    res = drill.hyperpod("node", "check", "node1", "nosuchnode")
    assert res.returncode != 0 and res.stderr.count("\n") == 1, res.stderr
    assert "unknown node(s): nosuchnode" in res.stderr
    res = drill.hyperpod("node", "check", "node1", "--level", "deep")
    assert res.returncode == 2 and "--level" in res.stderr
    sub = subprocess.run(
        ["sbatch", "--parsable", "-w", "node1", "-N1", "--wrap", "sleep 60"],
        env=drill.env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    job_id = int(sub.stdout.strip().split(";")[0])
    wait_for("the user's job running", lambda: drill.node("node1").state in ("ALLOCATED", "MIXED"))
    res = drill.hyperpod("node", "check", "node1")
    assert res.returncode != 0 and "running jobs: node1" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    drill.slurm.cancel(job_id)
    suite = deepchecks.deep_check_dir(drill.cluster.dir) / "suite.toml"
    good = suite.read_text()
    try:
        suite.write_text(good + "\n[[checks]]\nname = 'x'\nkind = 'warp-drive'\n")
        res = drill.hyperpod("node", "check", "node2")
        assert res.returncode != 0 and "suite does not load" in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1
    finally:
        suite.write_text(good)
    assert len(runs(drill)) == before
    assert our_reservations(drill) == []


# --- a hung tool is killed at its limit; a missing one is UNKNOWN --------------------------


def test_a_hung_check_and_a_missing_tool_are_unknown_and_named(clean: Drill) -> None:
    drill = clean
    scenario(drill, {"node1": {"nvidia-smi": {"hang": True}}})
    tool = deepchecks.deep_check_dir(drill.cluster.dir) / "bin" / "all_reduce_perf"
    tool.unlink()
    res = drill.hyperpod("node", "check", "node1", "node2", "--wait", "--json", timeout=RUN_S)
    assert res.returncode == 3, res.stderr
    run = json.loads(res.stdout)
    by_node = {o["node"]: o for o in run["outcomes"]}
    checks1 = {r["check"]: r for r in by_node["node1"]["results"]}
    assert checks1["nvlink"]["outcome"] == "UNKNOWN"
    assert "timed out after 10 s" in checks1["nvlink"]["cause"]
    checks2 = {r["check"]: r for r in by_node["node2"]["results"]}
    assert checks2["nccl-allreduce"]["outcome"] == "UNKNOWN"
    assert "all_reduce_perf: not found" in checks2["nccl-allreduce"]["cause"]
    # the machinery could not tell: the nodes are held for a look, with the check named
    states = drill.states()
    assert held_for(states["node1"], "nvlink") and "unknown" in states["node1"].reason
    assert held_for(states["node2"], "nccl-allreduce")
    assert our_reservations(drill) == []


# --- gates: spares qualified ahead of need ----------------------------------------------


def test_a_spare_failing_dcgm_is_held_and_the_next_spare_is_swapped_in(clean: Drill) -> None:
    drill = clean
    bad, good = "node4", drill.spares[0]  # node4 joins the pool; it sorts first
    scenario(drill, {bad: {"dcgmi": {"fail": [{"test": "memory", "gpu": 3}]}}})
    gates_on(drill, GATES)
    # into the pool only now: the controller before (the default gates are on too) would
    # start qualifying it, and a restart on empty state forgets that run
    drill.slurm.drain(bad, "hyperpod:spare")
    wait_for(
        f"{bad} held by its failed dcgm check and {good} qualified",
        lambda: (
            held_for(drill.node(bad), "dcgm-quick")
            and any(e["kind"] == "deep_check_ok" and e["node"] == good for e in drill.events(good))
            and drill.node(good).reason == "hyperpod:spare"
        ),
        timeout=RUN_S,
        detail=drill.describe,
    )
    assert "memory failed on GPU 3" in drill.node(bad).reason
    job_id, _ = submit_training(drill.cluster, steps=400, step_time=0.2, ckpt_every=5)
    wait_for("the job running", lambda: drill.slurm.job(job_id).state == "RUNNING", 30)
    victim = drill.slurm.job(job_id).nodes[0]
    inject_xid(drill.cluster, victim)
    wait_for(
        f"{good} swapped in for {victim}",
        lambda: not drill.node(good).drained,
        timeout=RUN_S,
        detail=drill.describe,
    )
    assert drill.node(victim).reason.startswith("hyperpod:replace")
    assert held_for(drill.node(bad), "dcgm-quick")  # never swapped in
    replaced = [e for e in drill.events() if e["kind"] in ("replace", "replace_started")]
    assert all(bad not in e["message"] for e in replaced)
    drill.slurm.cancel(job_id)
    wait_job_end(drill.cluster, job_id, timeout=60)


# --- gates: after a reboot ---------------------------------------------------------------


def test_a_rebooted_node_below_the_nccl_floor_is_held_one_that_passes_resumes(
    clean: Drill,
) -> None:
    drill = clean
    slow, fine = "node2", "node3"
    scenario(drill, {slow: {"all_reduce_perf": {"busbw_gbps": 40}}})
    gates_on(drill, GATES | {"gate_spares": False})
    since = drill.last_event_id()
    boot = drill.node(fine).boot_time
    for node in (slow, fine):
        inject_xid(drill.cluster, node)

    def settled() -> bool:
        states = drill.states()
        if any(states[n].flags & REBOOT_FLAGS for n in (slow, fine)):
            return False
        fine_ok = not states[fine].drained and not any(fine in r.nodes for r in reservations(drill))
        return (
            held_for(states[slow], "nccl-allreduce") and fine_ok and states[fine].boot_time != boot
        )

    resumed_early: list[str] = []
    taken_out: list[str] = []

    def reserved() -> bool:
        return any(slow in r.nodes for r in reservations(drill))

    def watch() -> bool:
        # Resumed inside its check's reservation is allowed, in service never. The
        # reservation is read before and after the node: it is created before the
        # node is resumed and deleted after the node is drained again.
        before = reserved()
        node = drill.node(slow)
        out = node.drained or bool(node.flags & REBOOT_FLAGS)
        if out:
            taken_out.append(node.reason)
        elif taken_out and not (before or reserved()):
            resumed_early.append(str(node))
        return settled()

    wait_for("both nodes rebooted and checked", watch, timeout=RUN_S * 2, step=0.5,
             detail=drill.describe)  # fmt: skip
    assert not resumed_early, resumed_early
    events = [e for e in drill.events() if int(e["id"]) > since]
    ok = [e for e in events if e["kind"] == "deep_check_ok" and e["node"] == fine]
    failed = [e for e in events if e["kind"] == "deep_check_fail" and e["node"] == slow]
    assert ok and "reentry" in ok[0]["message"]
    assert failed and "busbw 40.0 GB/s < floor 150 GB/s" in failed[0]["message"]
    reboots = [e for e in events if e["kind"] == "reboot"]
    assert {e["node"] for e in reboots} >= {slow, fine}
    # a node that fails after its reboot escalates to replace: the spare comes in
    spare = drill.spares[0]
    wait_for(f"{spare} swapped in for {slow}", lambda: not drill.node(spare).drained, RUN_S)
    assert drill.node(slow).reason.startswith("hyperpod:replace deep-check nccl-allreduce")


# --- crash safety -------------------------------------------------------------------------


def test_a_controller_killed_during_a_check_finishes_it_after_restart(clean: Drill) -> None:
    drill = clean
    scenario(drill, {"node1": {"dcgmi": {"delay_s": 6}}})
    res = drill.hyperpod("node", "check", "node1", "--json")
    assert res.returncode == 0, res.stderr
    run_id = int(json.loads(res.stdout)["id"])
    wait_for(
        "the check job running",
        lambda: run_of(drill, run_id)["phase"] == "running",
        timeout=30,
    )
    name = run_of(drill, run_id)["reservation"]
    pid = drill.services.pid("controller")
    assert pid is not None
    os.kill(pid, 9)
    wait_for("the controller gone", lambda: drill.services.pid("controller") is None, 10)
    assert our_reservations(drill) == [name]  # a crash undoes nothing by itself
    drill.services.start_controller()
    wait_for("the run done after restart", lambda: run_of(drill, run_id)["phase"] == "done", RUN_S)
    run = run_of(drill, run_id)
    assert [o["outcome"] for o in run["outcomes"]] == ["OK"]
    assert our_reservations(drill) == []
    node = drill.node("node1")
    assert not node.drained and not node.reason
    done = [e for e in drill.events() if e["kind"] == "deep_check_done"]
    assert sum(f"run {run_id} " in e["message"] for e in done) == 1
