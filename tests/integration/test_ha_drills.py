"""Controller failover drills on a local cluster started with ``--with-services --ha``:
real Slurm, a real PostgreSQL holding the shared store, two controller processes.

The leader is killed with SIGKILL (or exits abruptly at a chosen point of an action,
which is the same to everyone else: the lease is not given back), or cut off from the
database by stopping the database. The other controller must take over, finish what
the dead one started exactly once, and never act while it cannot reach the store.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import Drill, wait_for
from tcp_proxy import TcpProxy

from hyperpod_agent.controller.crash import CRASH_AT_ENV, PAUSE_AT_ENV
from hyperpod_agent.localcluster import drill, ha, procs, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist

pytestmark = pytest.mark.slurm

HA_DIR = Path("/var/tmp/hyperpod-ha")
HA_PORT_BASE = 18217
# Longer than any lease the local cluster hands out (ha.LEASE_TTL_S), plus a pass.
TAKEOVER_S = 20.0


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[LocalCluster]:
    # The shipped lease (ha.LEASE_TTL_S and its renewal) and the shipped deep-check
    # gates; the agents and the passes at the drills' cadences (1 s, 2 s), which these
    # drills say otherwise on purpose: what they prove, that a deposed or frozen leader
    # changes nothing and the standby finishes, is decided by the lease and the gate,
    # not by how often agents report. The shipped cadences have their own drill
    # (test_hang_shipped.py) and benchmark rows (bench/hang.py, bench/failover.py).
    cluster = LocalCluster(HA_DIR, nodes=2, spares=2, port_base=HA_PORT_BASE, ha=True)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def d(ha_cluster: LocalCluster) -> Iterator[Drill]:
    """The cluster as every drill starts: database up, both controllers running, no
    jobs, nodes in service, spares in the pool."""
    services = ha_cluster.services
    if ha.database_pid(ha_cluster.shape) is None:
        ha.start_database(ha_cluster.shape, fresh=False)
    for name in services.controllers:
        services.start_controller(name=name)
    reset.reset_cluster(ha_cluster)
    yield Drill(ha_cluster)
    if ha.database_pid(ha_cluster.shape) is None:
        ha.start_database(ha_cluster.shape, fresh=False)
    for name in services.controllers:
        services.start_controller(name=name)
    # A reboot a drill started must end before the cluster may stop: its slurmd would
    # otherwise start after `down` and live on.
    reset.reset_cluster(ha_cluster)


# ---------------------------------------------------------------------- reading
def gauge(d: Drill, name: str) -> float | None:
    return ha.leader_gauge(d.services.url_of(name))


def leaders(d: Drill) -> list[str]:
    return [c for c in d.services.controllers if gauge(d, c) == 1.0]


def the_leader(d: Drill) -> str:
    found: list[str] = []

    def one() -> bool:
        found[:] = leaders(d)  # the look that counted, not a second one that may differ
        return len(found) == 1

    wait_for("exactly one controller leading", one, TAKEOVER_S)
    return found[0]


def other(d: Drill, name: str) -> str:
    return next(c for c in d.services.controllers if c != name)


def seconds(value: str | None) -> float:
    return datetime.fromisoformat(value).timestamp() if value else 0.0


def takeovers(events: list[dict[str, Any]]) -> list[str]:
    """Who took the lead, in order, by the event log."""
    # Provisioning names a head's controller "<node>:<port>"; the node is its service.
    return [e["message"].split()[0].split(":")[0] for e in events if e["kind"] == "leader"]


def arm(d: Drill, point: str) -> str:
    """Make the leader one that exits abruptly at ``point`` (controller/crash.py);
    returns its name. The standby is restarted armed, then the leader stops cleanly
    (handing the lease over at once) and comes back as the unarmed standby."""
    services = d.services
    leader = the_leader(d)
    armed = other(d, leader)
    services.stop(armed)
    services.start_controller(name=armed, env={CRASH_AT_ENV: point})
    services.stop(leader)
    wait_for(f"{armed} to lead", lambda: leaders(d) == [armed], TAKEOVER_S)
    services.start_controller(name=leader)
    return armed


def running_with_steps(d: Drill, job_id: int, out: Path, steps: int) -> list[str]:
    drill.wait_for(
        f"job {job_id} to reach step {steps}",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= steps,
    )
    return list(drill.job_of(d.cluster, job_id).nodes)


# ---------------------------------------------------------------------- drills
def test_leader_killed_the_standby_leads_and_no_report_or_event_is_lost(d: Drill) -> None:
    first = the_leader(d)
    second = other(d, first)
    before = {e["id"]: e for e in d.events()}
    pid = d.services.pid(first)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    wait_for(f"{second} to lead", lambda: leaders(d) == [second], TAKEOVER_S)

    def reported_since_kill() -> bool:
        view = d.controller_nodes()
        return len(view) == len(d.all_nodes) and all(
            max(seconds(n["last_report_at"]), seconds(n["last_heartbeat_at"])) > killed_at
            for n in view.values()
        )

    # The agents' next reports land: the admin CLI reads them through the new leader.
    wait_for("every agent to report after the kill", reported_since_kill, 30, 0.5)
    after = {e["id"]: e for e in d.events()}
    assert before.items() <= after.items()
    assert takeovers(list(after.values()))[-1] == second
    d.services.start_controller(name=first)  # the killed one comes back as a standby
    assert the_leader(d) == second


@pytest.mark.parametrize(
    "point",
    [
        "intent:requeue",  # the node drained and swapped, the requeue not yet done
        "applied:replace",  # the spare resumed in Slurm, not yet recorded
    ],
)
def test_leader_dies_mid_recovery_the_standby_finishes_it_exactly_once(
    d: Drill, point: str
) -> None:
    armed = arm(d, point)
    survivor = other(d, armed)
    first_event = d.last_event_id()
    job_id, out = drill.submit_training(d.cluster, steps=24, step_time=0.4, ckpt_every=5)
    victim = sorted(running_with_steps(d, job_id, out, 6))[-1]
    pid = d.services.pid(armed)
    assert pid is not None
    d.inject_xid(victim, 79)
    wait_for(f"{armed} to exit at {point}", lambda: not procs.alive(pid), 30)
    wait_for(f"{survivor} to lead", lambda: leaders(d) == [survivor], TAKEOVER_S)

    done = drill.wait_job_end(d.cluster, job_id, timeout=180)
    assert done.state == "COMPLETED" and done.restart_count == 1
    story = [e for e in d.events() if e["id"] > first_event]
    kinds = [e["kind"] for e in story if e.get("job_id") == job_id]
    assert kinds.count("requeue") == 1, story
    # The spare was swapped in exactly once: one of the two left the pool.
    states = d.states()
    in_service = [s for s in d.spares if not states[s].drained]
    assert len(in_service) == 1, d.describe()
    assert states[victim].drained and states[victim].reason.startswith("hyperpod:replace")
    for kind in ("replace_started", "replace"):  # the swap begun, the swap done
        assert [e["node"] for e in story if e["kind"] == kind] == [victim], story
    # The log tells who did what: the swap was recorded by the dead leader when it
    # died before the requeue, by the survivor when it died before recording it.
    assert takeovers(story) == [survivor]
    taken = next(e["id"] for e in story if e["kind"] == "leader")
    started = next(e["id"] for e in story if e["kind"] == "replace_started")
    assert (started < taken) == (point == "intent:requeue"), story
    d.services.start_controller(name=armed)


def test_leader_cut_off_from_the_database_stops_acting_until_it_is_back(d: Drill) -> None:
    shape = d.cluster.shape
    the_leader(d)
    victim = d.nodes[0]
    log = d.cluster.dir / "log" / "slurmctld.log"
    log_start = log.stat().st_size
    ha.stop_database(shape, remove=False)
    wait_for("no controller leading", lambda: leaders(d) == [], ha.LEASE_TTL_S + 5)
    d.inject_xid(victim, 79)
    # Nothing touches Slurm while no controller reaches the store (bounded look).
    deadline = time.monotonic() + 2 * ha.LEASE_TTL_S
    while time.monotonic() < deadline:
        assert not drill.out_of_service(d.slurm, victim), d.describe()
        time.sleep(0.3)
    ha.start_database(shape, fresh=False)
    the_leader(d)
    wait_for(f"{victim} out of service", lambda: drill.out_of_service(d.slurm, victim), 60)
    # From Slurm's side: the victim was taken out once (a reboot, or a drain), by one
    # controller.
    taken_out_once(log.read_bytes()[log_start:].decode(errors="replace"), victim)


def taken_out_once(slurmctld_log: str, victim: str) -> None:
    """One take-out of ``victim`` in slurmctld's log: with the re-entry gate on (a suite
    named, the local cluster's default as shipped) a reboot is a drain, then the
    reboot, one line of each; without it, one of the two."""
    lines = slurmctld_log.splitlines()
    marks = (f"node {victim} reason set to", f"reboot request queued for nodes {victim}")
    found = [[ln for ln in lines if mark in ln] for mark in marks]
    assert all(len(f) <= 1 for f in found) and any(found), found


# ------------------------------------------------------------- a frozen leader
# Lines the gate writes for a call it made; refusals say "NOT made" or "refused".
MADE = re.compile(
    r"gate: (drain|resume|reboot|requeue|cancel|shrink|allocate|absorb|submit|"
    r"reserve|unreserve|replace)\b(?!.*(NOT made|refused|skipped))"
)


def frozen(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def arm_pause(d: Drill, point: str) -> str:
    """Make the leader one that stops itself (SIGSTOP) at ``point``; see ``arm``."""
    services = d.services
    leader = the_leader(d)
    armed = other(d, leader)
    services.stop(armed)
    pid = services.start_controller(name=armed, env={PAUSE_AT_ENV: point})
    services.stop(leader)
    # Frozen at once when the point is its first pass: it answers nothing then.
    wait_for(f"{armed} to lead", lambda: frozen(pid) or leaders(d) == [armed], TAKEOVER_S)
    services.start_controller(name=leader)
    return armed


@pytest.mark.parametrize(
    "point", ["lease_checked", "intent", "deep_check:reserve", "step_retry:salloc"]
)
def test_a_leader_frozen_for_two_leases_changes_nothing_once_it_wakes(d: Drill, point: str) -> None:
    """Frozen just past its lease check, inside an intent's apply, with a deep check's
    reservation made, or inside a step retry's ``salloc`` (the spare's helper
    allocation granted, not yet handed to the surgery): the standby takes over and
    finishes the work; woken, the old leader makes no Slurm change (its gate's log,
    slurmctld's log) and steps down."""
    seed = int(os.environ.get("HYPERPOD_DRILL_SEED") or random.randrange(2**32))
    victim = random.Random(seed).choice(sorted(d.nodes))
    print(f"seed {seed} (HYPERPOD_DRILL_SEED={seed} replays): {point} with {victim}")
    first_event = d.last_event_id()
    armed = arm_pause(d, point)
    pid = d.services.pid(armed)
    assert pid is not None
    try:
        frozen_and_woken(d, point, armed, pid, victim, first_event)
    finally:
        os.kill(pid, signal.SIGCONT)  # never leave a stopped process to the next drill
    d.services.stop(armed)
    d.services.start_controller(name=armed)


def frozen_and_woken(
    d: Drill, point: str, armed: str, pid: int, victim: str, first_event: int
) -> None:
    survivor = other(d, armed)
    ctld_log = d.cluster.dir / "log" / "slurmctld.log"
    ctld_start = ctld_log.stat().st_size
    armed_start = (d.cluster.dir / "log" / f"{armed}.log").stat().st_size
    if point == "deep_check:reserve":
        res = d.hyperpod("node", "check", victim, "--json")
        assert res.returncode == 0, res.stderr
    elif point == "intent":
        d.inject_xid(victim, 79)
    elif point == "step_retry:salloc":
        # srun --auto-resume=1 inside the job: the step is retried in place on a spare
        job_id, out = drill.submit_training(
            d.cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None,
            script="train_in_place.sbatch",
        )  # fmt: skip
        nodes = running_with_steps(d, job_id, out, 4)
        assert victim in nodes, nodes  # the job holds every node, its batch host too
        batch = drill.job_of(d.cluster, job_id).batch_host
        if victim == batch:
            # Slurm keeps a job's batch host: a fault there rolls the surgery back at
            # its shrink, before any salloc. The other node of the job then.
            victim = next(n for n in sorted(nodes) if n != batch)
            print(f"  {batch} is the batch host: the fault lands on {victim}")
        d.inject_xid(victim, 79)
    wait_for(f"{armed} to freeze at {point}", lambda: frozen(pid), 60)
    frozen_at = time.monotonic()
    if point == "lease_checked":
        d.inject_xid(victim, 79)  # the work the standby must do while the leader is out
    wait_for(f"{survivor} to lead", lambda: leaders(d) == [survivor], TAKEOVER_S)
    if point == "deep_check:reserve":

        def finished() -> bool:
            runs = d.hyperpod_json("checks")
            return bool(runs) and all(r["phase"] == "done" for r in runs)

        wait_for("the check run finished by the new leader", finished, 120, 0.5)
    elif point == "step_retry:salloc":
        granted = (d.cluster.dir / "log" / f"{armed}.log").read_bytes()[armed_start:]
        finished_surgery(d, granted.decode(errors="replace"), job_id, out, nodes, victim)
    else:
        wait_for(
            f"{victim} taken out by {survivor}",
            lambda: drill.out_of_service(d.slurm, victim),
            60,
            detail=d.describe,
        )
    # Frozen for at least two leases, whatever the standby took.
    time.sleep(max(0.0, 2 * ha.LEASE_TTL_S - (time.monotonic() - frozen_at)))
    log = d.cluster.dir / "log" / f"{armed}.log"
    woke_at = log.stat().st_size
    ctld_woke = ctld_log.stat().st_size
    os.kill(pid, signal.SIGCONT)

    def stepped_down() -> bool:
        text = log.read_bytes()[woke_at:].decode(errors="replace")
        return "no longer leads" in text or "lease lost" in text

    wait_for(f"{armed} to step down", stepped_down, 30, 0.3)
    time.sleep(3 * 2.0)  # a few of its passes (reconcile_interval_s) to act, were it to
    after = log.read_bytes()[woke_at:].decode(errors="replace")
    made = [ln for ln in after.splitlines() if MADE.search(ln)]
    assert made == [], made
    assert not [ln for ln in after.splitlines() if "hyperpod_agent.slurm.client" in ln], after
    assert leaders(d) == [survivor]
    # slurmctld's side: nothing for the victim since the old leader woke, beyond what
    # the survivor did (its reboot completing, its resume after the reboot or check).
    text = ctld_log.read_bytes()[ctld_start:].decode(errors="replace")
    # One take-out at most: with the re-entry gate on (a suite named, the local
    # cluster's default) a reboot is a drain, then the reboot: one line of each.
    for mark in (f"node {victim} reason set to", f"reboot request queued for nodes {victim}"):
        taken = [ln for ln in text.splitlines() if mark in ln]
        assert len(taken) <= 1, taken
    woke_text = ctld_log.read_bytes()[ctld_woke:].decode(errors="replace")
    made_one = point in ("deep_check:reserve", "step_retry:salloc")
    assert "Created reservation" not in woke_text or not made_one, woke_text
    if point == "step_retry:salloc":
        helpers = [j for j in d.slurm.list_jobs() if j.name == f"hyperpod-expand-{job_id}"]
        assert len(helpers) == 1 and helpers[0].state in drill.ENDED, helpers
        assert not [r for r in d.slurm.reservations() if r.name.startswith("hyperpod-expand-")]
    story = [e for e in d.events() if e["id"] > first_event]
    # armed took the lead to be frozen, the survivor took it from the frozen one
    assert takeovers(story) == [armed, survivor], story


def finished_surgery(
    d: Drill, armed_log: str, job_id: int, out: Path, nodes: list[str], victim: str
) -> None:
    """The surgery the frozen leader left in its ``salloc`` finished by the new leader:
    the helper the frozen one was granted adopted (no second allocation), the spare
    merged, the step run again in the same job, which never left RUNNING."""
    done = drill.wait_job_end(d.cluster, job_id, timeout=180)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 0, text[-1500:]
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2 and text.count("batch script started on ") == 1, text[-1500:]
    kept = [n for n in nodes if n != victim]
    spares = [n for n in expand_hostlist(log.attempts[1].nodes) if n in d.spares]
    assert len(spares) == 1, text[-1500:]
    spare = spares[0]
    assert log.attempts[1].nodes == compress_hostlist([*kept, spare]), text[-1500:]
    story = [e for e in d.events() if e.get("job_id") == job_id]
    kinds = [e["kind"] for e in story]
    assert kinds.count("step_retry_done") == 1 and "requeue" not in kinds, kinds
    granted = re.findall(rf"slurm expansion for job {job_id}: helper job (\d+)", armed_log)
    expanded = [e["message"] for e in story if e["kind"] == "step_retry_expand"]
    assert len(granted) == 1 and len(expanded) == 1, (granted, expanded)
    assert f"helper allocation {granted[0]} on {spare}" in expanded[0], expanded


# ------------------------------------------------------- a one-sided partition
def test_a_leader_cut_off_from_the_database_but_not_from_slurm_stops_within_its_lease(
    d: Drill,
) -> None:
    """The leader's connection to PostgreSQL goes through a proxy the drill blackholes;
    it still reaches Slurm. It stops acting within its lease, the standby leads and
    handles a fault on a node chosen at random, and the cut-off one makes no change."""
    seed = int(os.environ.get("HYPERPOD_DRILL_SEED") or random.randrange(2**32))
    victim = random.Random(seed).choice(sorted(d.nodes))
    print(f"seed {seed} (HYPERPOD_DRILL_SEED={seed} replays): fault on {victim}")
    services = d.services
    proxy = TcpProxy(ha.database_port(d.cluster.shape))
    first = the_leader(d)
    cut_off, survivor = other(d, first), first
    toml = d.cluster.dir / "etc" / f"{cut_off}.toml"
    original = toml.read_text()
    db = f"127.0.0.1:{ha.database_port(d.cluster.shape)}"
    assert db in original
    try:
        toml.write_text(original.replace(db, f"127.0.0.1:{proxy.port}"))
        services.stop(cut_off)
        services.start_controller(name=cut_off)  # on the proxy now
        services.stop(survivor)
        wait_for(f"{cut_off} to lead", lambda: leaders(d) == [cut_off], TAKEOVER_S)
        services.start_controller(name=survivor)
        log = d.cluster.dir / "log" / f"{cut_off}.log"
        ctld_log = d.cluster.dir / "log" / "slurmctld.log"
        ctld_start = ctld_log.stat().st_size
        proxy.cut()
        cut_at = time.monotonic()
        wait_for(f"{survivor} to lead", lambda: leaders(d) == [survivor], TAKEOVER_S)
        # Its own gauge says it stopped, within its lease of the cut.
        assert gauge(d, cut_off) != 1.0
        assert time.monotonic() - cut_at < ha.LEASE_TTL_S + TAKEOVER_S
        after_lease = log.stat().st_size
        d.inject_xid(victim, 79)
        wait_for(
            f"{victim} taken out by {survivor}",
            lambda: drill.out_of_service(d.slurm, victim),
            60,
            detail=d.describe,
        )
        text = log.read_bytes()[after_lease:].decode(errors="replace")
        made = [ln for ln in text.splitlines() if MADE.search(ln)]
        assert made == [], made
        taken_out_once(ctld_log.read_bytes()[ctld_start:].decode(errors="replace"), victim)
    finally:
        toml.write_text(original)
        services.stop(cut_off)
        proxy.close()
        services.start_controller(name=cut_off)
