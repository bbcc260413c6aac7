"""Properties of the pure policy over random snapshots: what must hold for any cluster.

Random nodes, partitions and reasons (ours, humans', Slurm's, NHC's, admin requests,
spares), faults, health, open intents and jobs. Derandomized so the suite is
deterministic; ``HYPOTHESIS_PROFILE=explore`` searches further with fresh examples.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

from ctl_helpers import NOW, action_row, config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.safety import allowed_out, counted, unavailable
from hyperpod_agent.controller.snapshot import Kind, NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.health import Action, Verdict
from hyperpod_agent.reasons import SPARE, Owner, owner_of
from hyperpod_agent.slurm.models import Job, Node

settings.register_profile(
    "ci",
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SLURM_USER = "slurm"
REASONS = [
    "",
    "maintenance",
    "Not responding to IPMI - RMA 1234, keep out",
    "Node unexpectedly rebooted - investigating, keep out",
    "NHC: check_fs_mount: /scratch not mounted",
    "Not responding",
    "Node unexpectedly rebooted",
    "reboot timed out",
    "Action:Replace",
    " action : reboot ",
    SPARE,
    "hyperpod:drain agent heartbeat_lost x",
    "hyperpod:reset gpu0 xid46 x",
    "hyperpod:reboot gpu0 xid79 x",
    "hyperpod:replace gpu0 xid54 x",
    "hyperpod:hold gpu0 lemon x",
]
CODES = [
    "xid79", "xid46", "xid54", "xid48", "fs_hung", "link_down", "slurmd_down", "xid13", "fs_full"
]  # fmt: skip
APP_XIDS = ["xid13", "xid31", "xid43", "xid45", "xid68"]
ACTIONS = [Action.MONITOR, Action.DRAIN, Action.RESET, Action.REBOOT, Action.REPLACE]


@st.composite
def nodes_st(draw: st.DrawFn) -> dict[str, Node]:
    count = draw(st.integers(2, 24))
    out = {}
    for i in range(1, count + 1):
        name = f"n{i}"
        reason = draw(st.sampled_from(REASONS))
        flags = set(draw(st.sets(st.sampled_from(["NOT_RESPONDING", "REBOOT_REQUESTED"]))))
        state = draw(st.sampled_from(["IDLE", "MIXED", "ALLOCATED", "DOWN"]))
        if reason and draw(st.booleans()):
            flags.add("DRAIN")
        out[name] = Node(
            name=name,
            state=state,
            flags=frozenset(flags),
            reason=reason if (flags & {"DRAIN"} or state == "DOWN") else "",
            reason_user=draw(st.sampled_from([SLURM_USER, "root", "alice", ""])),
            partitions=tuple(sorted(draw(st.sets(st.sampled_from("abc"), min_size=1)))),
        )
    return out


@st.composite
def snapshot_st(
    draw: st.DrawFn,
    codes: list[str] = CODES,
    one_fault: bool = False,
    actions: list[Action] = ACTIONS,
) -> Snapshot:
    nodes = draw(nodes_st())
    names = sorted(nodes)
    faults = []
    for i, name in enumerate(draw(st.lists(st.sampled_from(names), unique=True))):
        code = draw(st.sampled_from(codes))
        action = Action.MONITOR if code in APP_XIDS else draw(st.sampled_from(actions))
        first = NOW - draw(st.floats(0, 7200))
        faults.append(
            FaultRow(
                i + 1,
                name,
                "gpu0",
                code,
                "FAIL",
                action.value,
                draw(st.booleans()),
                first,
                first,
                1,
                "m",
                None,
                "gpu",
            )  # fmt: skip
        )
    history = list(faults)
    if not one_fault:
        for j, f in enumerate(
            draw(st.lists(st.sampled_from(faults), max_size=6)) if faults else []
        ):
            history.append(
                FaultRow(
                    1000 + j,
                    f.node,
                    f.component,
                    f.code,
                    "FAIL",
                    f.action,
                    f.urgent,
                    f.first_seen - 60,
                    f.first_seen - 60,
                    1,
                    "m",
                    NOW - 100,
                    "gpu",
                )  # fmt: skip
            )
    health = {}
    for name in names:
        verdict = draw(st.sampled_from([None, Verdict.HEALTHY, Verdict.DEGRADED, Verdict.FAULTY]))
        if verdict is not None:
            seen = NOW - draw(st.floats(0, 300))
            health[name] = NodeHealth(verdict, seen, seen)
    in_flight: list[ActionRow] = []
    if not one_fault:
        for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=3)):
            kind = draw(st.sampled_from(["drain", "resume", "reboot", "replace"]))
            in_flight.append(action_row(kind, name, "intent"))
    jobs = [
        Job(
            job_id=100 + k,
            name="j",
            state=draw(st.sampled_from(["RUNNING", "FAILED", "NODE_FAIL", "PENDING"])),
            nodes=tuple(
                draw(st.lists(st.sampled_from(names), unique=True, min_size=1, max_size=4))
            ),
            auto_resume=draw(st.sampled_from([None, 1, 3])),
            exit_code=draw(st.sampled_from([None, 0, 1, 233])),
        )
        for k in range(draw(st.integers(0, 4)))
    ]
    replaced = frozenset(draw(st.sets(st.sampled_from(names))))
    return Snapshot(
        nodes=nodes,
        jobs=jobs,
        health=health,
        open_faults=faults,
        history=history,
        in_flight=in_flight,
        tracked={},
        started_at=NOW - 3600,
        replaced=replaced,
    )


def cfg_of(fraction: float, window: float) -> ControllerConfig:
    return config(
        slurm_user=SLURM_USER,  # type: ignore[arg-type]
        policy={"max_unhealthy_fraction": fraction, "shared_cause_window_s": window},
    )


CONFIGS = st.builds(cfg_of, st.sampled_from([0.1, 0.25, 0.5, 1.0]), st.sampled_from([0.0, 30.0]))


@given(snapshot_st(), CONFIGS)
def test_no_action_touches_a_node_we_do_not_own(snap: Snapshot, cfg: ControllerConfig) -> None:
    for a in decide(snap, cfg, NOW).actions:
        if a.node is None:
            continue
        owner = owner_of(snap.nodes[a.node], (SLURM_USER,))
        assert owner not in (Owner.OTHER, Owner.SPARE), (a, snap.nodes[a.node])
        spare = a.params.get("spare")
        if spare is not None:
            assert owner_of(snap.nodes[str(spare)], (SLURM_USER,)) is Owner.SPARE


@given(snapshot_st(), CONFIGS)
def test_each_partition_stays_within_its_limit(snap: Snapshot, cfg: ControllerConfig) -> None:
    decision = decide(snap, cfg, NOW)
    members: dict[str, list[Node]] = defaultdict(list)
    for n in snap.nodes.values():
        if n.reason.strip() != SPARE:
            for p in n.partitions:
                members[p].append(n)
    leaving = {str(a.node) for a in decision.actions if counted(a)}
    for part, nodes in members.items():
        before = {n.name for n in nodes if unavailable(n, snap.replaced)}
        after = before | {n.name for n in nodes if n.name in leaving}
        limit = allowed_out(cfg.policy, len(nodes))
        assert len(after) <= max(limit, len(before)), (part, before, after, limit)
        assert limit == max(
            cfg.policy.min_unhealthy_nodes,
            math.floor(cfg.policy.max_unhealthy_fraction * len(nodes)),
        )


@given(snapshot_st(one_fault=True), CONFIGS)
def test_a_single_report_of_a_fault_never_yields_replace(
    snap: Snapshot, cfg: ControllerConfig
) -> None:
    asked = {f.node: Action(f.action) for f in snap.open_faults}
    for a in decide(snap, cfg, NOW).actions:
        if a.kind is Kind.REPLACE and not a.admin and a.node in asked:
            # Only a fault that asks for REPLACE itself is replaced on first sight.
            assert asked[a.node] is Action.REPLACE, a


@given(snapshot_st(codes=APP_XIDS), CONFIGS)
def test_an_application_xid_never_takes_a_node_out(snap: Snapshot, cfg: ControllerConfig) -> None:
    faulty = {f.node for f in snap.open_faults}
    for a in decide(snap, cfg, NOW).actions:
        if a.node in faulty and not a.admin:
            # Only what the node's reason asks for independently of the fault (a resume of
            # our own drain, a heartbeat loss) may touch it.
            assert a.kind in (Kind.RESUME, Kind.DRAIN), a
            assert not a.params.get("fault_code"), a
        assert a.kind is not Kind.REQUEUE or "fault on" not in a.cause, a


@given(snapshot_st(actions=[Action.DRAIN]), CONFIGS)
def test_a_drain_fault_never_reboots_replaces_or_holds_a_node(
    snap: Snapshot, cfg: ControllerConfig
) -> None:
    """Whatever the node's reason, its repeats and the lemon score, a node whose faults
    all ask for DRAIN is only drained (or resumed): nothing stronger is ever planned
    for it but what an admin asked for."""
    for a in decide(snap, cfg, NOW).actions:
        if a.node is not None and not a.admin:
            assert a.kind not in (Kind.REBOOT, Kind.REPLACE, Kind.HOLD), a
