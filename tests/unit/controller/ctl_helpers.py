"""Builders and an in-memory Slurm for the controller's unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from itertools import count
from pathlib import Path

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.snapshot import NodeHealth
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.health import Verdict
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import Job, Node

NOW = 1_800_000_000.0
_ids = count(1000)


def ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def node(
    name: str,
    state: str = "IDLE",
    flags: tuple[str, ...] = (),
    reason: str = "",
    partitions: tuple[str, ...] = ("main",),
    boot_time: float | None = None,
    reason_time: float | None = None,
) -> Node:
    return Node(
        name=name,
        state=state,
        flags=frozenset(flags),
        reason=reason,
        partitions=partitions,
        boot_time=ts(boot_time) if boot_time is not None else None,
        reason_time=ts(reason_time) if reason_time is not None else None,
    )


def cluster(n: int = 10, **kw: object) -> dict[str, Node]:
    return {f"node{i}": node(f"node{i}", **kw) for i in range(1, n + 1)}  # type: ignore[arg-type]


def fault(
    name: str,
    component: str = "gpu0",
    code: str = "xid79",
    action: str = "REBOOT",
    urgent: bool = False,
    first_seen: float = NOW - 60,  # past the shared-cause window
    closed_at: float | None = None,
    fid: int | None = None,
    last_seen: float | None = None,
) -> FaultRow:
    return FaultRow(
        fid if fid is not None else next(_ids),
        name,
        component,
        code,
        "FAIL",
        action,
        urgent,
        first_seen,
        last_seen if last_seen is not None else first_seen,
        1,
        "boom",
        closed_at,
    )


def healthy(last_seen: float = NOW - 1, generated_at: float = NOW - 1) -> NodeHealth:
    return NodeHealth(Verdict.HEALTHY, generated_at, last_seen)


def faulty(last_seen: float = NOW - 1, generated_at: float = NOW - 1) -> NodeHealth:
    return NodeHealth(Verdict.FAULTY, generated_at, last_seen)


def action_row(
    kind: str,
    name: str | None,
    state: str = "done",
    updated_at: float = NOW - 10,
    job_id: int | None = None,
    created_at: float | None = None,
    reason: str = "",
    params: dict[str, object] | None = None,
    attempts: int = 0,
) -> ActionRow:
    return ActionRow(
        next(_ids),
        kind,
        name,
        job_id,
        reason,
        "test",
        dict(params or {}),
        state,
        attempts,
        created_at if created_at is not None else updated_at,
        updated_at,
        updated_at,
        "",
    )


def job(
    job_id: int,
    state: str = "RUNNING",
    nodes: tuple[str, ...] = ("node1",),
    auto_resume: int | None = 3,
    restart_count: int = 0,
    exit_code: int | None = None,
) -> Job:
    return Job(
        job_id=job_id,
        name=f"j{job_id}",
        state=state,
        nodes=nodes,
        auto_resume=auto_resume,
        restart_count=restart_count,
        exit_code=exit_code,
    )


def config(**sections: dict[str, object]) -> ControllerConfig:
    return ControllerConfig.model_validate(sections)


class FakeSlurm:
    """An in-memory Slurm with the SlurmClient methods the controller uses."""

    def __init__(self, nodes: dict[str, Node], jobs: list[Job] | None = None) -> None:
        self.nodes = dict(nodes)
        self.jobs = {j.job_id: j for j in jobs or []}
        self.calls: list[tuple[object, ...]] = []
        self.fail_next: dict[str, int] = {}
        self.read_fails = 0
        self.resv: dict[str, Reservation] = {}
        self.version: str | None = "22.05.8"  # slurmctld's (a release job expansion is safe on)

    def slurmctld_version(self) -> str | None:
        self._maybe_fail("version")  # a read: not in ``calls``
        return self.version

    def _maybe_fail(self, what: str) -> None:
        if self.fail_next.get(what, 0) > 0:
            self.fail_next[what] -= 1
            raise SlurmError(["scontrol", what], 1, f"slurm_{what} error: Unexpected error")

    def list_nodes(self) -> list[Node]:
        if self.read_fails:
            self.read_fails -= 1
            raise SlurmError(["sinfo", "--json"], 1, "Unable to contact slurm controller")
        return list(self.nodes.values())

    def list_jobs(self) -> list[Job]:
        return list(self.jobs.values())

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))
        self._maybe_fail("drain")
        n = self.nodes[node]
        self.nodes[node] = replace(n, flags=n.flags | {"DRAIN"}, reason=reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self._maybe_fail("resume")
        n = self.nodes[node]
        self.nodes[node] = replace(
            n,
            flags=n.flags - {"DRAIN", "FAIL"},
            reason="",
            state="IDLE" if n.state in ("DOWN", "FAIL") else n.state,
        )

    def reboot(self, node: str, reason: str, asap: bool = True, next_state: str = "resume") -> None:
        self.calls.append(("reboot", node, reason))
        self._maybe_fail("reboot")
        n = self.nodes[node]
        self.nodes[node] = replace(n, flags=n.flags | {"DRAIN", "REBOOT_REQUESTED"}, reason=reason)

    def requeue(self, job_id: int) -> None:
        self.calls.append(("requeue", job_id))
        self._maybe_fail("requeue")
        j = self.jobs[job_id]
        self.jobs[job_id] = replace(j, state="PENDING", restart_count=j.restart_count + 1)

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        self.calls.append(("cancel", job_id))
        self._maybe_fail("cancel")
        j = self.jobs[job_id]
        for name in j.nodes:
            if not any(o.job_id != job_id and name in o.nodes for o in self.jobs.values()):
                self._free(name)
        self.jobs[job_id] = replace(j, state="CANCELLED")

    def node(self, name: str) -> Node:
        self._maybe_fail("show")
        if name not in self.nodes:
            raise SlurmError(["scontrol", "show", "node", name], 1, "", f"unknown node {name}")
        return self.nodes[name]

    # -- maintenance reservations and batch jobs (deep checks) ----------------------
    def reservations(self) -> list[Reservation]:
        return list(self.resv.values())

    def create_maint_reservation(
        self, name: str, nodes: Sequence[str], minutes: int, users: Sequence[str]
    ) -> None:
        self.calls.append(("create_reservation", name, tuple(nodes)))
        self._maybe_fail("create_reservation")
        if name in self.resv:
            raise SlurmError(["scontrol"], 1, "Error creating the reservation: Duplicate name")
        busy = [n for n in nodes if self.nodes[n].state in ("ALLOCATED", "MIXED")]
        if busy:
            raise SlurmError(
                ["scontrol"], 1, "Error creating the reservation: Requested nodes are busy"
            )
        self.resv[name] = Reservation(
            name, tuple(nodes), frozenset({"MAINT"}), tuple(users), "ACTIVE"
        )

    def delete_reservation(self, name: str) -> bool:
        self.calls.append(("delete_reservation", name))
        if any(j.name == name and j.state == "RUNNING" for j in self.jobs.values()):
            raise SlurmError(["scontrol"], 1, "Requested reservation is in use")
        return self.resv.pop(name, None) is not None

    def submit_batch(
        self,
        script: Path,
        *,
        job_name: str,
        nodes: Sequence[str],
        reservation: str,
        minutes: int,
        output: Path,
        partition: str | None = None,
    ) -> int:
        self.calls.append(("submit", job_name, tuple(nodes), reservation))
        self._maybe_fail("submit")
        job_id = max(self.jobs, default=0) + 1
        self.jobs[job_id] = Job(job_id=job_id, name=job_name, state="RUNNING", nodes=tuple(nodes))
        return job_id

    # -- shrinking and expanding a running job (step retries), as Slurm 22.05 does --
    def shrink_job(self, job_id: int, keep: Sequence[str]) -> None:
        """Releases the job's other nodes (they go idle)."""
        self.calls.append(("shrink", job_id, tuple(keep)))
        self._maybe_fail("shrink")
        j = self.jobs[job_id]
        if j.state != "RUNNING" or not keep or not set(keep) <= set(j.nodes):
            raise SlurmError(
                ["scontrol", "update"], 1, "Requested node configuration is not available"
            )
        for name in set(j.nodes) - set(keep):
            self._free(name)
        self.jobs[job_id] = replace(j, nodes=tuple(n for n in j.nodes if n in keep))

    def _free(self, name: str) -> None:
        n = self.nodes[name]
        if n.state in ("ALLOCATED", "MIXED"):
            self.nodes[name] = replace(n, state="IDLE")

    def allocate_expansion(
        self, job_id: int, node: str, wait_s: int, reservation: str | None = None
    ) -> int:
        """A helper allocation named ``hyperpod-expand-J``: PENDING, then RUNNING on
        ``node`` when it is free; revoked (gone from the queue) when it is not."""
        self.calls.append(("expand", job_id, node, reservation))
        helper = max(self.jobs, default=0) + 1
        name = f"hyperpod-expand-{job_id}"
        self.jobs[helper] = Job(job_id=helper, name=name, state="PENDING")
        if self.fail_next.get("expand", 0) > 0:
            self.fail_next["expand"] -= 1
            self.jobs[helper] = replace(self.jobs[helper], state="CANCELLED")
            raise SlurmError(["salloc"], 1, "salloc: error: Unable to allocate resources")
        n = self.nodes[node]
        if n.drained or n.state != "IDLE":
            self.jobs[helper] = replace(self.jobs[helper], state="CANCELLED")
            raise SlurmError(["salloc"], 1, f"no expansion on {node} for job {job_id}")
        self.nodes[node] = replace(n, state="ALLOCATED")
        self.jobs[helper] = replace(self.jobs[helper], state="RUNNING", nodes=(node,))
        return helper

    def absorb_expansion(self, job_id: int, helper_id: int) -> None:
        """The helper's nodes move into the job; the helper keeps running without nodes."""
        self.calls.append(("absorb", job_id, helper_id))
        self._maybe_fail("absorb")
        j, h = self.jobs[job_id], self.jobs[helper_id]
        if h.state != "RUNNING" or j.state != "RUNNING":
            raise SlurmError(["scontrol", "update"], 1, "Job/step already completing or completed")
        self.jobs[job_id] = replace(j, nodes=j.nodes + h.nodes)
        self.jobs[helper_id] = replace(h, nodes=())

    def names(self, kind: str) -> list[object]:
        return [c[1] for c in self.calls if c[0] == kind]
