"""stress-ng's log and its exit status.

Every line is ``stress-ng: <type>: [<pid>] <message>`` with type ``info:``, ``fail:``,
``error:``, ``warn:``, ``metrc:`` (and a timestamp before the type with
``--timestamp``). ``--metrics-brief`` adds a ``metrc:`` table: stressor, bogo ops, real,
usr and sys seconds, bogo ops/s on real time and on usr+sys time. The run ends with
``passed: N: ...``, ``failed: N: ...`` and ``successful run completed in ...`` (or
"unsuccessful"). Exit status: 0 success, 1 core failure, 2 a stressor failed (with
``--verify``, a verification error), 3 no resources, 4 not implemented, 7 metrics
untrustworthy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement, one_line
from hyperpod_agent.deepcheck.parsing import and_more

_LINE = re.compile(r"^stress-ng: (?:\S+ )?(info|fail|error|warn|metrc|debug|skip):\s+\[\d+\] (.*)$")
_METRIC = re.compile(r"^(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
_COUNT = re.compile(r"^(passed|failed|skipped): (\d+)")
_COMPLETED = re.compile(r"^(successful|unsuccessful) run completed")

EXIT_SUCCESS, EXIT_NOT_SUCCESS = 0, 2
_EXIT_MEANING = {
    1: "core failure",
    2: "stressor failed",
    3: "no resources",
    4: "not implemented",
    5: "killed by signal",
    6: "stressor terminated using _exit()",
    7: "metrics untrustworthy",
}


@dataclass(frozen=True)
class StressMetric:
    bogo_ops: int
    bogo_ops_per_s_real: float


@dataclass
class StressReport:
    completed: bool | None = None
    passed: int | None = None
    failed: int | None = None
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, StressMetric] = field(default_factory=dict)


def parse_stress_ng(text: str) -> StressReport:
    """What the log says; lines it does not know are ignored (never raises)."""
    report = StressReport()
    for raw in text.splitlines():
        line = _LINE.match(raw.strip())
        if line is None:
            continue
        kind, message = line[1], line[2].strip()
        if kind == "fail":
            report.failures.append(message)
        elif kind == "error":
            report.errors.append(message)
        elif kind == "metrc":
            if metric := _METRIC.match(message):
                report.metrics[metric[1]] = StressMetric(int(metric[2]), float(metric[6]))
        elif count := _COUNT.match(message):
            if count[1] == "passed":
                report.passed = int(count[2])
            elif count[1] == "failed":
                report.failed = int(count[2])
        elif done := _COMPLETED.match(message):
            report.completed = done[1] == "successful"
    return report


def judge_stress_ng(report: StressReport, returncode: int) -> Judgement:
    """FAIL when stress-ng says a stressor failed (exit 2, a ``fail:`` line, a failed
    count or an unsuccessful run); OK on exit 0 with a successful completion; UNKNOWN for
    every other exit status (stress-ng itself, not the node, went wrong)."""
    figures: dict[str, float] = {}
    for name, metric in report.metrics.items():
        figures[f"{name}_bogo_ops"] = metric.bogo_ops
        figures[f"{name}_bogo_ops_per_s"] = metric.bogo_ops_per_s_real
    failed = (
        returncode == EXIT_NOT_SUCCESS
        or (returncode == EXIT_SUCCESS and (report.failures or report.completed is False))
        or bool(report.failed)
    )
    if failed and returncode in (EXIT_SUCCESS, EXIT_NOT_SUCCESS):
        said = report.failures or report.errors
        cause = and_more(said) if said else f"stress-ng: stressor failed (exit {returncode})"
        return Judgement(CheckOutcome.FAIL, one_line(cause), figures)
    if returncode != EXIT_SUCCESS:
        meaning = _EXIT_MEANING.get(returncode)
        cause = (
            f"stress-ng: {meaning} (exit {returncode})"
            if meaning
            else f"stress-ng: exit {returncode}"
        )
        return Judgement(CheckOutcome.UNKNOWN, cause, figures)
    if report.completed is not True:
        return Judgement(
            CheckOutcome.UNKNOWN, "stress-ng exited 0 without 'run completed'", figures
        )
    ops = ", ".join(f"{name} {m.bogo_ops}" for name, m in report.metrics.items())
    cause = "successful run completed" + (f": {ops} bogo ops" if ops else "")
    return Judgement(CheckOutcome.OK, one_line(cause), figures)
