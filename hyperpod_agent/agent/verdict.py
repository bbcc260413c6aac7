"""From probe results to one node verdict: healthy, degraded or faulty.

Rules (docs/agent.md, "Verdict"):
- A FAIL finding makes the node faulty only after it was reported by
  ``fail_after_runs`` consecutive runs of its probe (flap damping), unless it is
  urgent: an urgent fault (GPU lost, XID 79, uncorrectable ECC) is hardware telling us
  plainly, and waiting would let a job hang on a dead GPU until NCCL times out.
- During ``grace_s`` after the agent starts, non-urgent FAILs make the node degraded,
  not faulty: services and links are still settling after a boot. Urgent faults are
  exempt unless ``urgent_in_grace = false``.
- UNKNOWN (a probe crashed, timed out or could not look) never makes a node faulty;
  it makes it degraded with the reason, so someone looks at the checker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from hyperpod_agent.health import (
    Action,
    FaultRef,
    Finding,
    ProbeResult,
    Status,
    Verdict,
    strongest,
)


class VerdictConfig(BaseModel):
    """``[verdict]`` section of agent.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_after_runs: int = Field(default=2, ge=1, le=100)
    grace_s: float = Field(default=60.0, ge=0, le=3600)
    urgent_in_grace: bool = True


@dataclass(frozen=True)
class NodeVerdict:
    """The node's state as the agent reports it."""

    verdict: Verdict
    action: Action = Action.NONE
    urgent: bool = False
    message: str = ""
    faults: list[Finding] = field(default_factory=list)
    # The confirmed faults with the probe that found each: what the controller acts on.
    confirmed: list[FaultRef] = field(default_factory=list)


Key = tuple[str, str, str]


def _fail_findings(res: ProbeResult) -> list[Finding]:
    fails = [f for f in res.findings if f.status == Status.FAIL]
    if res.status == Status.FAIL and not fails:
        # A FAIL without findings still names its probe.
        fails = [
            Finding(
                component=res.probe,
                code="fail",
                status=Status.FAIL,
                message=res.message[:512] or "failed",
            )
        ]
    return fails


def _clip(parts: list[str], limit: int = 1024) -> str:
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class VerdictEngine:
    """Keeps the strike counts between cycles; ``evaluate`` is otherwise pure."""

    def __init__(self, config: VerdictConfig, started: float) -> None:
        self.config = config
        self.started = started
        self._strikes: dict[Key, int] = {}
        self._seen_run: dict[str, object] = {}

    def _count(self, res: ProbeResult) -> None:
        """Count strikes once per probe run (a result is evaluated every cycle until
        the probe runs again)."""
        run = (res.at, res.status, res.message)
        if self._seen_run.get(res.probe) == run:
            return
        self._seen_run[res.probe] = run
        if res.status == Status.UNKNOWN:
            return  # the probe could not look: neither confirms nor clears a fault
        now_failing = {(res.probe, f.component, f.code) for f in _fail_findings(res)}
        for key in [k for k in self._strikes if k[0] == res.probe and k not in now_failing]:
            del self._strikes[key]
        for key in now_failing:
            self._strikes[key] = self._strikes.get(key, 0) + 1

    def evaluate(self, results: Iterable[ProbeResult], now: float) -> NodeVerdict:
        """The verdict for the latest result of each probe at monotonic time ``now``."""
        confirmed: list[tuple[str, Finding]] = []
        pending: list[str] = []
        notes: list[str] = []
        warn_actions: list[Action] = []
        for res in results:
            self._count(res)
            if res.status == Status.UNKNOWN and not res.findings:
                notes.append(f"{res.probe} unknown: {res.message}")
            for f in res.findings:
                if f.status == Status.WARN:
                    warn_actions.append(f.action)
                    notes.append(f"{f.component} {f.code}")
                elif f.status == Status.UNKNOWN:
                    notes.append(f"{f.component} {f.code} unknown: {f.message}")
            if res.status == Status.WARN and not res.findings:
                notes.append(f"{res.probe}: {res.message}")
            for f in _fail_findings(res):
                strikes = self._strikes.get((res.probe, f.component, f.code), 0)
                if f.urgent or strikes >= self.config.fail_after_runs:
                    confirmed.append((res.probe, f))
                else:
                    pending.append(
                        f"{f.component} {f.code} pending ({strikes}/{self.config.fail_after_runs})"
                    )
        in_grace = now - self.started < self.config.grace_s
        acted = [
            (probe, f)
            for probe, f in confirmed
            if not in_grace or (f.urgent and self.config.urgent_in_grace)
        ]
        faults = [f for _, f in acted]
        held = [
            f"{f.component} {f.code} held (start-up grace)" for _, f in confirmed if f not in faults
        ]
        if faults:
            parts = [
                f"{f.component} {f.code} {f.action.value}" + (" urgent" if f.urgent else "")
                for f in faults
            ]
            return NodeVerdict(
                Verdict.FAULTY,
                strongest([f.action for f in faults]),
                any(f.urgent for f in faults),
                _clip(parts),
                faults,
                [FaultRef(probe=p, component=f.component, code=f.code) for p, f in acted],
            )
        if pending or held or notes:
            return NodeVerdict(
                Verdict.DEGRADED, strongest(warn_actions), False, _clip(held + pending + notes)
            )
        return NodeVerdict(Verdict.HEALTHY, Action.NONE, False, "all probes ok")
