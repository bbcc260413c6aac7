"""A hostile user against remediation, on the service cluster (real Slurm, the
controller, an agent per node; the attacker and the victim are real unprivileged users
of this machine, which every node of the local cluster shares).

The attacker does what any user can: submits held jobs named like the controller's own
(``hyperpod-expand-²``, ``hyperpod-expand-<a job id>``, and the name of every deep
check ``GET /v1/checks`` shows while it waits), and fills the scratch tmpfs of a node.
Meanwhile a real fault (XID 79) hits another node, an admin asks for a deep check of a
node a victim's job runs on, and the victim's job runs to its end. Which node is filled,
checked and faulted is drawn at random (seeded; the seed and the nodes are printed).

Nothing of anybody else is drained, resumed, rebooted, replaced, requeued or
cancelled; the full scratch is drained with our drain-only reason (resumed once it is
emptied), never rebooted or replaced, and holds back no real fault; the XID node
is taken out as fast as in the fault drills and comes back; the deep check runs its
own job and judges the node; no reservation is left; every reconcile pass ends well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import (
    DETECT_S,
    REBOOT_FLAGS,
    REBOOT_S,
    Dice,
    Drill,
    RealFault,
    back_in_service,
    fresh_drill,
    kept_passing,
    new_events,
    passes,
    wait_for,
)
from hostile import User, attacker, user_env, user_venv, victim

from hyperpod_agent.controller.deepcheck.outcomes import DRAIN_FIRST_REASON
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.models import Job

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
RUN_S = 90.0  # a deep check after the victim's job: the job, then a quick run
# what the controller does to nodes and jobs (events of these kinds name their node)
ACTING = {"drain", "resume", "reboot", "reset", "replace", "hold", "requeue", "cancel",
          "no_replacement", "step_retry_orphan", "deep_check_orphan"}  # fmt: skip


class Watch:
    """Every node state Slurm shows while the attack runs (0.3 s apart)."""

    def __init__(self, drill: Drill) -> None:
        self.drill = drill
        self.seen: dict[str, set[tuple[str, bool]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            try:
                states = self.drill.states()
            except Exception:  # noqa: BLE001 - a slow sinfo: the next look counts
                continue
            for name, node in states.items():
                rebooting = bool(node.flags & REBOOT_FLAGS)
                self.seen.setdefault(name, set()).add((node.reason, rebooting))

    def stop(self) -> dict[str, set[tuple[str, bool]]]:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def sbatch(user: User, env: dict[str, str], *args: str) -> int:
    res = user.run(["sbatch", "--parsable", *args], env, timeout=20)
    assert res.returncode == 0, (args, res.stderr)
    return int(res.stdout.strip().split(";")[0])


def job(drill: Drill, job_id: int) -> Job:
    found = drill.slurm.job(job_id)
    assert found is not None, f"job {job_id} gone"
    return found


@pytest.fixture(scope="module")
def drill(service_cluster: LocalCluster) -> Iterator[Drill]:
    yield from fresh_drill(service_cluster)


def test_a_hostile_user_stops_no_remediation_and_hijacks_no_check(drill: Drill) -> None:
    dice = Dice("hostile checks")
    # The attack's two nodes, any two in service.
    checked, filled = dice.nodes("checked node, full-scratch node", drill.nodes, 2)
    # The XID lands on any other node in service. Not the full-scratch node: its reboot
    # keeps the tmpfs and what fills it, so it would come back drained for the full disk
    # (never "back in service"), and "a full scratch is never rebooted" could not be told
    # from the XID's reboot. Not the checked node: "drained for its check only, never
    # rebooted" would say nothing. No spare: out of service, it is the pool's story. No
    # job runs while the XID is handled (the attacker's are held, the victim's starts
    # after), so there is no batch host to include. The node left over is the bystander.
    xid = RealFault(drill, dice.node("XID 79 node", set(drill.nodes) - {checked, filled}))
    (bystander,) = set(drill.nodes) - {checked, filled, xid.node}
    bad, good = attacker(), victim()
    env = user_env(drill.env, user_venv(REPO))
    out = drill.cluster.dir / "out"
    ballast = drill.services.scratch(filled) / "ballast"
    theirs: list[int] = []
    since = drill.last_event_id()
    url = drill.services.controller_url
    before, attack_from = passes(url), time.monotonic()
    watch = Watch(drill)
    try:
        # --- the attack: jobs named like ours, a full scratch --------------------------
        theirs.append(sbatch(bad, env, "-J", "hyperpod-expand-²", "--hold", "--wrap", "true"))
        theirs.append(sbatch(bad, env, "-J", f"hyperpod-expand-{theirs[0]}", "-H",
                             "--wrap", "true"))  # fmt: skip
        fill = bad.run(["sh", "-c", f"head -c 20000000 /dev/zero > {ballast}"], env)
        assert fill.returncode != 0 and "No space left" in fill.stderr, fill
        wait_for(
            f"the full scratch of {filled} reported",
            lambda: any(
                e["kind"] == "fault" and "fs_full" in e["cause"]
                for e in new_events(drill, since, filled)
            ),
            timeout=30,
        )

        # --- a real fault meanwhile: handled in its usual time ---------------------------
        xid.inject()
        took = xid.taken_out(DETECT_S)
        xid.events()
        back = xid.back(REBOOT_S)

        # --- a deep check under a name the attacker can read ----------------------------
        mine = sbatch(good, env, "-w", checked, "-N1", f"--output={out}/victim-%j.out",
                      "--wrap", "sleep 15; echo done")  # fmt: skip
        wait_for("the victim's job running", lambda: job(drill, mine).state == "RUNNING")
        asked = drill.hyperpod_json("node", "check", checked, "--drain-first")
        run_id, name = int(asked["id"]), str(asked["reservation"])
        seen = bad.run(["hyperpod", "checks", "--json"], env)
        assert seen.returncode == 0 and name in seen.stdout, seen.stderr  # public
        theirs.append(sbatch(bad, env, "-H", "-J", name, "--wrap", "true"))
        wait_for("the victim's job done", lambda: job(drill, mine).state == "COMPLETED", 30)
        wait_for(
            "the deep check done",
            lambda: drill.hyperpod_json("checks", str(run_id))["phase"] == "done",
            RUN_S,
            step=0.5,
        )
        run: dict[str, Any] = drill.hyperpod_json("checks", str(run_id))
        assert run["job_id"] not in theirs, run
        assert [(o["node"], o["outcome"]) for o in run["outcomes"]] == [(checked, "OK")], run
        wait_for(f"{checked} back in service", lambda: back_in_service(drill.node(checked)), 10)
        time.sleep(6)  # a few more passes (2 s) with the attack still in place
    finally:
        xid.stop()
        seen_states = watch.stop()
        left_alone = {job_id: job(drill, job_id).state for job_id in theirs}
        for job_id in theirs:
            drill.slurm.cancel(job_id)
        ballast.unlink(missing_ok=True)

    print(f"  XID node out {took:.1f} s after the XID, back {back:.1f} s later")
    # the real fault was handled as in the fault drills (taken_out/back bound the times)
    assert took < DETECT_S
    # the reconcile loop kept passing while the attack ran, every pass ending well
    kept_passing(url, before, attack_from)
    # the victim's job ran to its end, untouched
    victims = job(drill, mine)
    assert (victims.state, victims.exit_code, victims.restart_count) == ("COMPLETED", 0, 0)
    # the attacker's jobs were left as they were (then cancelled by the test)
    assert set(left_alone.values()) == {"PENDING"}, left_alone
    events = new_events(drill, since)
    acted = [e for e in events if e["kind"] in ACTING]
    assert {e["node"] for e in acted} <= {xid.node, filled}, acted
    assert {e["kind"] for e in acted if e["node"] == filled} <= {"drain", "resume"}, acted
    assert not [e for e in events if e["kind"] in ("item_error", "policy_error")], events
    # the full scratch: drained (drain-only), never for a reboot or a replacement
    full = seen_states[filled]
    assert not any(rebooting for _, rebooting in full), full
    assert all(r == "" or r.startswith("hyperpod:drain scratch fs_") for r, _ in full), full
    # the checked node: drained for its check only, never rebooted
    held = seen_states[checked]
    assert {r for r, _ in held} <= {"", DRAIN_FIRST_REASON}, held
    assert not any(rebooting for _, rebooting in held), held
    assert seen_states[bystander] == {("", False)}, seen_states[bystander]
    # no reservation left held
    left = [r.name for r in drill.slurm.reservations() if r.name.startswith("hyperpod-")]
    assert left == [], left
