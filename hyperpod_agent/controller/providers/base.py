"""Replacement providers: one interface (DESIGN §5).

``prepare`` picks what the replacement needs (e.g. which spare) *before* the intent is
committed, so a restart re-applies the same choice; ``replace`` must be idempotent
for the same params; ``poll`` says whether the replacement is in service.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import Job, Node


class ProviderError(HyperpodError):
    """A replacement could not be started or failed."""


class ReplaceStatus(enum.StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class SlurmApi(Protocol):
    """The part of ``hyperpod_agent.slurm.client.SlurmClient`` the controller uses."""

    def list_nodes(self) -> list[Node]: ...

    def list_jobs(self) -> list[Job]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> object: ...

    def reboot(
        self, node: str, reason: str, asap: bool = True, next_state: str = "resume"
    ) -> None: ...

    def requeue(self, job_id: int) -> None: ...

    def cancel(self, job_id: int, signal: str | int | None = None) -> None: ...

    def node(self, name: str) -> Node: ...

    # deep checks: maintenance reservations and the check job (slurm/maint.py)
    def reservations(self) -> list[Reservation]: ...

    def create_maint_reservation(
        self, name: str, nodes: Sequence[str], minutes: int, users: Sequence[str]
    ) -> None: ...

    def delete_reservation(self, name: str) -> bool: ...

    # step retries: shrink a running job and merge a spare into it (slurm/resize.py),
    # only on a slurmctld where that was shown safe (slurm/version.py)
    def slurmctld_version(self) -> str | None: ...

    def shrink_job(self, job_id: int, keep: Sequence[str]) -> None: ...

    def allocate_expansion(
        self, job_id: int, node: str, wait_s: int, reservation: str | None = None
    ) -> int: ...

    def absorb_expansion(self, job_id: int, helper_id: int) -> None: ...

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
    ) -> int: ...


Handle = dict[str, Any]


class Provider(Protocol):
    name: str
    # True when the failed node itself comes back (same name) and we resume it when done.
    resumes_node: bool
    # True when replace() must never run twice for one action (it runs an admin's
    # command): the executor records it as started before calling it.
    runs_once: bool

    def prepare(
        self, node: str, nodes: Mapping[str, Node], params: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    def replace(
        self,
        node: str,
        reason: str,
        params: Mapping[str, Any],
        now: float,
        keepalive: Callable[[], None] | None = None,
    ) -> Handle: ...

    def poll(self, handle: Handle, nodes: Mapping[str, Node], now: float) -> ReplaceStatus: ...
