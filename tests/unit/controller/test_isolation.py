"""One bad item never stops a pass: isolation, quarantine, degraded status, and a pass
fed Slurm state no one planned for."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    # starlette asks for its httpx fork; the httpx we have works the same (test_api.py)
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient
from ctl_helpers import FakeSlurm, cluster, config, job, node
from test_service import make, report

from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.store.lease import LeaseLost
from hyperpod_agent.slurm.models import Job


def _errors(kind: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value("hyperpod_pass_item_errors_total", {"kind": kind}) or 0.0
    )


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, kind: str, message: str, now: float, **_: object) -> int:
        self.seen.append((kind, message))
        return len(self.seen)


def boom() -> int:
    raise ValueError("invalid literal for int() with base 10: '²'")


def test_a_failing_item_gives_the_default_is_counted_and_said_once() -> None:
    events, t = Events(), [100.0]
    iso = Isolation(events, lambda: t[0])
    before = _errors("job")
    assert iso.run("job", 7, boom, -1) == -1
    assert iso.run("job", 7, boom, -1) == -1
    assert iso.run("job", 8, lambda: 5, -1) == 5
    assert _errors("job") == before + 2
    assert [k for k, _ in events.seen] == ["item_error"]
    assert "job 7" in events.seen[0][1] and "ValueError" in events.seen[0][1]
    assert iso.quarantined() == []


def test_an_item_failing_three_passes_in_a_row_is_quarantined_then_retried() -> None:
    events, t = Events(), [100.0]
    iso = Isolation(events, lambda: t[0], quarantine_after=3, retry_quarantined_s=600)
    calls = []

    def flaky() -> int:
        calls.append(t[0])
        raise RuntimeError("no")

    for _ in range(3):
        iso.run("surgery", "job 9", flaky, None)
    assert iso.quarantined() == ["surgery job 9"]
    assert [k for k, _ in events.seen] == ["item_error", "item_quarantined"]
    iso.run("surgery", "job 9", flaky, None)  # skipped while quarantined
    assert len(calls) == 3
    t[0] += 601
    assert iso.run("surgery", "job 9", lambda: 1, None) == 1  # tried again: handled
    assert iso.quarantined() == []
    assert events.seen[-1][0] == "item_recovered"


def test_a_lost_lease_is_not_an_items_failure() -> None:
    iso = Isolation(Events(), lambda: 0.0)

    def lost() -> None:
        raise LeaseLost("deposed")

    with pytest.raises(LeaseLost):
        iso.run("intent", 1, lost, None)


def test_an_exception_text_a_user_wrote_is_bounded_and_printable() -> None:
    events = Events()
    iso = Isolation(events, lambda: 0.0)

    def nasty() -> None:
        raise ValueError("x\x1b[2J\n" + "A" * 10_000)

    iso.run("job", "j\x00b" * 100, nasty, None)
    message = events.seen[0][1]
    assert len(message) < 500 and message.isprintable()


def test_items_no_longer_in_the_pass_are_forgotten() -> None:
    iso = Isolation(Events(), lambda: 0.0, quarantine_after=1)
    iso.run("job", 7, boom, None)
    assert iso.quarantined() == ["job 7"]
    iso.forget_missing("job", {"8"})
    assert iso.quarantined() == []


class PickySlurm(FakeSlurm):
    """Slurm's adapter meeting an answer it did not expect for one job: not a
    SlurmError, the kind of exception a parser bug raises."""

    def __init__(self, *args: object, bad_job: int, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.bad_job = bad_job

    def requeue(self, job_id: int) -> None:
        if job_id == self.bad_job:
            raise KeyError("JobState")
        super().requeue(job_id)


def test_a_job_that_breaks_its_requeue_costs_the_other_faults_nothing(tmp_path: Path) -> None:
    slurm = PickySlurm(
        cluster(20),  # two take-outs within the blast-radius limit
        [job(7, nodes=("node2",), auto_resume=3), job(8, nodes=("node5",), auto_resume=3)],
        bad_job=7,
    )
    ctl, clock = make(tmp_path, slurm)
    before = _errors("intent") + _errors("action")
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True, urgent=True))
    ctl.ingest_report(report("node5", 1, clock.t, faulty=True, urgent=True))
    assert ctl.reconcile_once() is not None
    assert ("requeue", 8) in slurm.calls
    assert set(slurm.names("reboot")) == {"node2", "node5"}
    assert _errors("intent") + _errors("action") > before
    kinds = [e.kind for e in ctl.store.events()]
    assert kinds.count("item_error") == 1


def test_an_item_that_keeps_failing_makes_the_controller_degraded(tmp_path: Path) -> None:
    slurm = PickySlurm(cluster(4), [job(7, nodes=("node2",), auto_resume=3)], bad_job=7)
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True, urgent=True))
    for _ in range(6):
        assert ctl.reconcile_once() is not None
        clock.t += 30
    assert ctl.isolation.quarantined()
    client = TestClient(create_app(ctl, ServerAuth(AuthConfig(mode="none"))))
    health = client.get("/v1/healthz").json()
    assert health["ok"] is True and health["status"] == "degraded"
    assert health["degraded"] == ctl.isolation.quarantined()
    assert "item_quarantined" in [e.kind for e in ctl.store.events()]


# -- Slurm state no one planned for -------------------------------------------------
NASTY = [
    "hyperpod-expand-²",
    "hyperpod-expand-١٢",
    "hyperpod-expand-" + "9" * 40,
    "hyperpod-check-1-2",
    "hyperpod-check-²-x",
    "hyperpod:replace",
    "hyperpod:reboot gpu0 xid79 \x00\x07",
    "hyperpod:spare ²",
    "\x1b[31mred\x1b[0m",
    "tab\tnew\nline\r",
    "ℌ𝔶𝔭𝔢𝔯𝔭𝔬𝔡",
    "",
    " ",
    "Action:Replace",
    "Action:Reboot ²",
    "x" * 10_000,
]


def _nasty(rng: random.Random) -> str:
    base = rng.choice(NASTY)
    if rng.random() < 0.3:
        base += "".join(chr(rng.choice([0x0, 0x7F, 0xB2, 0x661, 0x200B, 0xFFFF])) for _ in range(3))
    return base


def _jobs(rng: random.Random, n: int, nodes: list[str]) -> list[Job]:
    states = ["RUNNING", "PENDING", "FAILED", "NODE_FAIL", "COMPLETED", "REQUEUED", "SUSPENDED?"]
    out = []
    for i in range(n):
        out.append(
            Job(
                job_id=rng.choice([i + 1, 2**31 + i, 2**63 - i]),
                name=_nasty(rng),
                state=rng.choice(states),
                state_reason=_nasty(rng),
                nodes=tuple(rng.sample(nodes, rng.randint(0, 3))),
                restart_count=rng.randint(0, 2**31),
                auto_resume=rng.choice([None, 0, 1, 3, 1000]),
                admin_comment=_nasty(rng),
                exit_code=rng.choice([None, 0, 1, 93, 137, -1]),
                batch_host=rng.choice(nodes + [_nasty(rng)]),
                user=_nasty(rng),
                uid=rng.choice([None, 0, 1000, 2**32 - 1]),
                partition=_nasty(rng),
                extra={_nasty(rng)[:20]: _nasty(rng)},
            )
        )
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pass_over_ten_thousand_odd_jobs_still_handles_the_real_fault(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    nodes = cluster(12)
    for k in range(6):  # nodes with reasons and names no one planned for
        name = f"odd{k}"
        nodes[name] = node(
            name, state="IDLE", flags=("DRAIN",), reason=_nasty(rng), partitions=("odd",)
        )
    slurm = FakeSlurm(nodes, _jobs(rng, 10_000, sorted(nodes)))
    ctl, clock = make(tmp_path, slurm, config(policy={"shared_cause_window_s": 0}))
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True))
    assert ctl.reconcile_once() is not None
    assert "node2" in slurm.names("reboot")
    touched = {c[1] for c in slurm.calls if c[0] in ("drain", "resume", "reboot")}
    assert not touched & {f"odd{k}" for k in range(6)}  # never a node someone else drained
    assert slurm.names("cancel") == []  # no job is ours, whatever its name says
    events = ctl.store.events(limit=10_000)
    assert events and all(e.message.isprintable() and len(e.message) <= 2000 for e in events)
    clock.t += 20
    assert ctl.reconcile_once() is not None  # and the next pass too
