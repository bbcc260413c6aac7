"""A hostile user against the step routes, on the service cluster (real Slurm, the
controller, the agents, MUNGE).

The attacker (hostile.py: an unprivileged user of this machine, which every node of the
local cluster shares) runs a job of their own and, from inside it, the real
``hyperpod step-retry`` with a node list, a start and a budget of their choosing, and
the API directly with MUNGE credentials their uid makes. The victim runs a job beside
it, and a real XID 79 hits one of the victim's nodes during the attack (drawn at random,
its batch host included: seeded, the seed and the nodes printed). Nothing that is
not the attacker's may be drained, resumed, rebooted, replaced, requeued or cancelled,
no spare may move and no reservation be made; the victim's job completes; the reconcile
loop keeps passing; the fault is handled in its usual time; and a request about a job
the caller may not ask about costs the controller no Slurm read (slurmctld's own RPC
counters, ``sdiag``, say so).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import (
    DETECT_S,
    REBOOT_S,
    XID79_REASON,
    Dice,
    Drill,
    RealFault,
    fresh_drill,
    kept_passing,
    passes,
    wait_for,
)
from hostile import User, attacker, user_env, user_venv, victim

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.models import ENDED_STATES, Job

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 60.0  # snapshot.WATCH_GRACE_S: how long a told-to-end step holds its job
UNKNOWN_JOB = 987654321
ROUNDS = 15  # runs of the real helper inside the attacker's job
ENDED = ENDED_STATES
ACTED = ("drain", "resume", "reboot", "replace", "replace_started", "requeue", "hold",
         "step_retry_planned", "step_retry_done", "admin_request")  # fmt: skip

# Runs as the attacker, with the user venv's python: the API with their MUNGE credential.
ATTACK_API = r'''
import http.client, json, statistics, sys, time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig

args = json.loads(sys.argv[1])
auth = ClientAuth(AuthConfig(munge_socket=args["socket"]))
AHEAD = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()


def call(method, path, body=None):
    data = b"" if body is None else json.dumps(body).encode()
    headers = dict(auth.headers(method, path, data))
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=15)
    started = time.monotonic()
    try:
        conn.request(method, path, body=data or None, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    try:
        answer = json.loads(payload or b"null")
    except ValueError:
        answer = None
    return resp.status, answer, time.monotonic() - started


def retry(job, i, **over):
    body = {"job_id": job, "step_id": f"x{i}", "exit_code": 1, "attempt": 1 + i % 999,
            "nodelist": args["target"], "auto_resume": 1000, "started_at": AHEAD}
    return call("POST", "/v1/steps/retry", {**body, **over})


def watch(job, step, attempt=1):
    body = {"job_id": job, "step_id": step, "attempt": attempt, "nodelist": args["target"],
            "started_at": AHEAD}
    return call("POST", "/v1/steps/watch", body)


def refused(rounds):
    """Questions about jobs the attacker may not ask about: the victim's, an unknown
    one, a surgery that is not theirs, a malformed body about the victim's job."""
    out, took = [], []
    for i in range(rounds):
        for status, _, s in (
            retry(args["victim_job"], i),
            watch(args["victim_job"], f"x{i}"),
            retry(args["unknown_job"], i),
            watch(args["unknown_job"], f"x{i}"),
            call("GET", f"/v1/steps/retry/{args['unknown_job']}"),
            call("POST", "/v1/steps/retry", {"job_id": args["victim_job"], "exit_code": "x"}),
        ):
            out.append(status)
            took.append(s)
    return {"statuses": out, "p50_ms": 1000 * statistics.median(took), "n": len(out)}


def own(rounds):
    """The attacker's own job, every field they control set against them: a node list
    of the victim's faulty node, a budget of 1000, a start a day ahead, many names."""
    answers = []
    for i in range(rounds):
        status, answer, _ = retry(args["own_job"], i)
        answers.append([status, answer])
    for i in range(20):
        status, answer, _ = watch(args["own_job"], f"hold-{i}")
        answers.append([status, answer])
    return {"answers": answers}


def shield(seconds):
    """Keep watching the own job with a start a day ahead, a new step name every 10 s
    (each a fresh launch), until ``seconds`` pass or the stop file appears."""
    seen, began = [], time.monotonic()
    while time.monotonic() - began < seconds and not Path(args["stop"]).exists():
        k = int((time.monotonic() - began) // 10)
        status, answer, _ = watch(args["own_job"], f"shield-{k}")
        end = answer.get("end") if isinstance(answer, dict) else None
        seen.append([round(time.monotonic() - began, 1), status, end])
        time.sleep(1.0)
    return {"seen": seen}


mode = args["mode"]
result = {"refused": refused, "own": own, "shield": shield}[mode](args["n"])
print(json.dumps(result))
'''

# The attacker's batch script: the real helper, inside their own job, with a node list
# naming the victim's node and the largest budget, over and over.
ATTACK_JOB = """#!/bin/sh
while [ ! -e "$GO" ]; do sleep 0.2; done
i=0
while [ $i -lt "$ROUNDS" ]; do
  i=$((i + 1))
  SLURM_JOB_NODELIST="$TARGET" SLURM_NODELIST="$TARGET" HYPERPOD_STEP_AUTO_RESUME=1000 \\
    hyperpod step-retry --reach-s 0 -- false
  echo "round $i rc=$?"
  sleep 0.3
done
echo "attack done"
sleep 300
"""


class Cluster:
    """The service cluster as the test sees it: Slurm, the controller, the users."""

    def __init__(self, drill: Drill, shared: Path) -> None:
        self.drill = drill
        self.cluster: LocalCluster = drill.cluster
        self.slurm = drill.slurm
        admin = tomllib.loads((self.cluster.dir / "etc" / "admin.toml").read_text())
        self.url = str(admin["controller"]["url"])
        self.port = int(self.url.rsplit(":", 1)[1])
        self.socket = str(admin["auth"]["munge_socket"])
        self.bin = user_venv(REPO)
        local = {**self.cluster.env, "HYPERPOD_LOCAL_CLUSTER_DIR": str(self.cluster.dir)}
        self.env = user_env(local, self.bin)
        self.shared = shared
        self.api_script = self.shared_file("attack_api.py", ATTACK_API, 0o644)

    def shared_file(self, name: str, text: str, mode: int) -> Path:
        """A file every user can read (``shared_tmp`` is root's, 0755)."""
        path = self.shared / name
        path.write_text(text)
        path.chmod(mode)
        return path

    def out(self, name: str) -> Path:
        """A path in the cluster's 1777 output directory (the attacker may write it)."""
        return self.cluster.dir / "out" / f"{name}-{time.time_ns()}"

    def sbatch(self, user: User, *argv: str, env: dict[str, str] | None = None) -> int:
        # --exclusive: nodes are the unit here (the local cluster's share CPUs otherwise)
        argv = ("--parsable", "--exclusive", *argv)
        res = user.run(["sbatch", *argv], {**self.env, **(env or {})})
        assert res.returncode == 0, res.stderr
        return int(res.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> Job:
        job = self.slurm.job(job_id)
        assert job is not None, f"job {job_id} is no longer known to Slurm"
        return job

    def running(self, job_id: int) -> tuple[str, ...]:
        """The job's nodes once it runs, and the controller's next passes have seen it."""
        wait_for(f"job {job_id} running", lambda: self.job(job_id).state == "RUNNING", 60, 0.3)
        passed = self.passes()
        wait_for("two passes", lambda: self.passes() >= passed + 2, 30, 0.3)
        return self.job(job_id).nodes

    def ended(self, job_id: int, timeout: float) -> Job:
        wait_for(f"job {job_id} to end", lambda: self.job(job_id).state in ENDED, timeout, 0.5)
        return self.job(job_id)

    def api(self, user: User, mode: str, n: int, **extra: Any) -> dict[str, Any]:
        """ATTACK_API as ``user`` (their MUNGE credential); its JSON result."""
        args = {"socket": self.socket, "port": self.port, "mode": mode, "n": n, **extra}
        res = user.run(
            [str(self.bin / "python"), str(self.api_script), json.dumps(args)],
            self.env,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        result: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
        return result

    def passes(self) -> float:
        """``hyperpod_controller_passes_total{outcome="ok"}``."""
        return passes(self.url).get("ok", 0.0)

    def rpcs(self) -> dict[str, int]:
        """slurmctld's count of the RPCs it served, by message type (``sdiag``)."""
        res = subprocess.run(
            ["sdiag"], capture_output=True, text=True, timeout=30, env=self.cluster.env
        )
        assert res.returncode == 0, res.stderr
        found = re.findall(r"^\s*(REQUEST_\w+)\s+\(\s*\d+\)\s+count:(\d+)", res.stdout, re.M)
        return {name: int(count) for name, count in found}


@pytest.fixture
def drill(service_cluster: LocalCluster) -> Iterator[Drill]:
    yield from fresh_drill(service_cluster)


@pytest.fixture
def site(drill: Drill, shared_tmp: Path) -> Cluster:
    return Cluster(drill, shared_tmp)


def refusals_read_no_slurm(site: Cluster, bad: User, victims_job: int, target: str) -> str:
    """Questions about jobs the attacker may not ask about cost no Slurm read: while
    nothing but the passes reads slurmctld's job and node lists, the refusals add none.
    Returns what was measured."""
    passed, rpcs = site.passes(), site.rpcs()
    started = time.monotonic()
    refused = site.api(
        bad, "refused", 60, victim_job=victims_job, unknown_job=UNKNOWN_JOB, target=target
    )
    took = time.monotonic() - started
    rpcs_after, ran = site.rpcs(), site.passes() - passed
    reads = {
        k: rpcs_after.get(k, 0) - rpcs.get(k, 0) for k in ("REQUEST_JOB_INFO", "REQUEST_NODE_INFO")
    }
    said = (
        f"{refused['n']} refused requests in {took:.1f} s (p50 {refused['p50_ms']:.1f} ms), "
        f"{ran:g} passes, slurmctld served {reads}"
    )
    # a pass reads each list once, twice when it acted, once more after; refusals none
    assert max(reads.values()) <= 3 * ran + 6, said
    # every one refused, before its body was looked at (one of them is malformed)
    assert set(refused["statuses"]) <= {403, 404}, refused["statuses"]
    return said


def test_the_step_routes_take_nothing_an_attacker_says_on_trust(site: Cluster) -> None:
    dice = Dice("hostile steps")
    bad, good = attacker(), victim()
    slurm = site.slurm
    # The victim's two nodes are drawn too: across runs the fault meets every node.
    placed = dice.nodes("victim's nodes", site.drill.nodes, 2)
    theirs = site.sbatch(
        good, "-N2", "-w", ",".join(placed), "-o", "/dev/null", "--wrap", "srun sleep 120"
    )
    victims_nodes = site.running(theirs)
    # The attack names a node of somebody else's running job, to have its fault count
    # for the attacker's job: the XID lands on either of the victim's nodes, its batch
    # host included (a batch host cannot be shrunk away). Not the attacker's own node:
    # a retry there would be their due, and "every round FAIL" would say nothing.
    target = dice.node("XID 79 node", victims_nodes)
    print(f"  the victim's batch host: {site.job(theirs).batch_host}")
    xid = RealFault(site.drill, target)
    go, out = site.out("go"), site.out("attack")
    script = site.shared_file("attack.sh", ATTACK_JOB, 0o755)
    env = {"GO": str(go), "TARGET": target, "ROUNDS": str(ROUNDS)}
    # the attacker's job opted in (sbatch --auto-resume=1: a budget of 3, not 1000)
    mine = site.sbatch(bad, "-N1", "--auto-resume=1", "-o", str(out), str(script), env=env)
    attackers_nodes = site.running(mine)
    assert not set(attackers_nodes) & set(victims_nodes)
    before = site.drill.states()
    since = site.drill.last_event_id()

    measured = refusals_read_no_slurm(site, bad, theirs, target)

    # The attack on the attacker's own job, every field they control hostile, with a
    # real fault on the victim's node while it goes on.
    passed = site.passes()
    reservations: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            try:
                reservations.extend(r.name for r in slurm.reservations())
            except SlurmError:
                reservations.append("(unreadable)")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        go.write_text("go\n")
        go.chmod(0o644)
        time.sleep(2)
        xid.inject()
        own = site.api(bad, "own", 30, own_job=mine, target=target)
        handled = xid.taken_out(DETECT_S)  # measured from the injection
        wait_for("the helper's rounds", lambda: "attack done" in out.read_text(), 120, 0.5)
    finally:
        xid.stop()
        stop.set()
        sampler.join(5)

    # the real helper, inside the job: each round answered FAIL, nothing retried
    rounds = out.read_text()
    assert rounds.count("rc=1") == ROUNDS, rounds[-3000:]
    assert rounds.count("FAIL: ") == ROUNDS and "Retrying step" not in rounds, rounds[-3000:]
    assert target not in "".join(line for line in rounds.splitlines() if "FAIL: " in line)
    # the API: retries FAIL on the job's own healthy node, watches never end it
    answers = [(s, a) for s, a in own["answers"] if isinstance(a, dict)]
    decided = [a for s, a in answers if "decision" in a]
    assert len(decided) == 30 and {a["decision"] for a in decided} == {"FAIL"}, decided[:3]
    assert all(target not in a["cause"] for a in decided), decided[:3]
    watched = [(s, a) for s, a in answers if "decision" not in a]
    assert {s for s, _ in watched} <= {200, 409}, watched
    assert all(a["end"] is False for s, a in watched if s == 200), watched
    assert not [r for r in reservations if r.startswith("hyperpod-expand-")], reservations

    # the fault was handled as on any day: the victim's node out for a reboot, in time
    assert slurm.node(target).reason.startswith(XID79_REASON)
    assert handled <= DETECT_S
    xid.events()
    # nothing else moved: no other node, no spare, no job of anyone's
    after = site.drill.states()
    moved = {
        n: (before[n].reason, after[n].reason)
        for n in before
        if n != target
        and (before[n].reason, before[n].drained) != (after[n].reason, after[n].drained)
    }
    assert moved == {}, moved
    spare = after[site.cluster.spares[0]]
    assert spare.reason.strip() == "hyperpod:spare" and spare.drained, spare
    events = [e for e in site.drill.events() if int(e["id"]) > since]
    assert [e for e in events if e["kind"] in ACTED and e.get("node") != target] == [], events
    assert [e["kind"] for e in events if e.get("node") == target and e["kind"] in ACTED] == [
        "reboot"
    ], events
    attackers_job = site.job(mine)
    assert (attackers_job.state, attackers_job.restart_count) == ("RUNNING", 0)
    assert site.passes() - passed >= 5, measured  # the loop kept passing through it all
    victims_job = site.ended(theirs, 180)
    assert (victims_job.state, victims_job.restart_count) == ("COMPLETED", 0), victims_job
    # its job over, the node is rebooted (ASAP waits for it) and back as on any day
    back = xid.back(REBOOT_S)
    print(
        f"{measured}; the victim's node out {handled:.1f} s after the XID, "
        f"back {back:.1f} s after the victim's job ended"
    )


def test_a_watch_shields_no_faulty_node_and_ends_with_its_job(site: Cluster) -> None:
    dice = Dice("hostile watch")
    bad = attacker()
    slurm = site.slurm
    # The claim is about the attacker's own job: the fault must land on its node (its
    # batch host, a one-node job), which may be any node in service.
    node = dice.node("attacker's job node, XID 79 node", site.drill.nodes)
    mine = site.sbatch(bad, "-N1", "-w", node, "-o", "/dev/null", "--wrap", "sleep 400")
    assert site.running(mine) == (node,)
    xid = RealFault(site.drill, node)
    stop = site.out("stop")
    result: dict[str, Any] = {}

    def hold() -> None:
        try:
            result.update(site.api(bad, "shield", 200, own_job=mine, target=node, stop=str(stop)))
        except AssertionError as exc:  # said by the test below, not lost in a thread
            result["error"] = str(exc)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    passed, watched_from = passes(site.url), time.monotonic()
    try:
        time.sleep(4)  # watched, on a healthy node
        xid.inject()
        # Told to end, the step does not: its job is left to the retry it would ask for
        # until GRACE_S after the fault, however often it is watched anew; then the
        # node goes out as on any day.
        handled = xid.taken_out(GRACE_S + DETECT_S)
        assert slurm.node(node).reason.startswith(XID79_REASON)
        xid.events()
        # the job ends: its watch is refused from then on, and shields nothing after it
        cancel = bad.run(["scancel", str(mine)], site.env)
        assert cancel.returncode == 0, cancel.stderr
        site.ended(mine, 60)
        ran = site.passes()
        wait_for("two passes", lambda: site.passes() >= ran + 2, 30, 0.3)
        time.sleep(2)
        back = xid.back(REBOOT_S)  # idle now: rebooted and back as on any day
    finally:
        xid.stop()
        stop.write_text("stop\n")
        holder.join(60)
    print(f"  {node} out {handled:.1f} s after the XID, back {back:.1f} s after its job")
    # the reconcile loop kept passing through the watching, every pass ending well
    kept_passing(site.url, passed, watched_from)
    assert "error" not in result, result["error"]
    seen = result["seen"]
    assert any(end is True for _, status, end in seen if status == 200), seen
    assert seen[-1][1] == 404, seen[-5:]
