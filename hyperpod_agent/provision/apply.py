"""Run a plan: change only what differs, retry network steps, verify, log everything."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hyperpod_agent.provision.models import StepFailed
from hyperpod_agent.provision.plan import Plan
from hyperpod_agent.provision.steps import Change, Context, Directory, Step, StepError

log = logging.getLogger("hyperpod_agent.provision")

Status = Literal["unchanged", "changed", "would change", "failed (optional)"]


@dataclass(frozen=True)
class Retry:
    """Bounded exponential back-off for network steps."""

    attempts: int = 5
    base_s: float = 2.0
    max_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        return float(min(self.max_s, self.base_s * 2**attempt))


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    change: Change | None = None
    error: str = ""


@dataclass
class Result:
    """What a run did, step by step, and what the checks saw."""

    plan: Plan
    dry_run: bool
    outcomes: list[Outcome] = field(default_factory=list)
    checks: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in ("changed", "would change")]

    def summary(self) -> str:
        """One line: how many steps changed (or would), or "no changes"."""
        n = len(self.changed)
        head = f"{self.plan.node}: {self.plan.role}"
        if n == 0:
            return f"{head}: no changes ({len(self.outcomes)} steps already as desired)"
        verb = "would change" if self.dry_run else "changed"
        return f"{head}: {n} of {len(self.outcomes)} steps {verb}"


def with_retry(
    fn: Callable[[], None], name: str, retry: Retry, sleep: Callable[[float], None]
) -> None:
    """Call ``fn``; on StepError wait and try again, at most ``retry.attempts`` times."""
    for attempt in range(retry.attempts):
        try:
            fn()
            return
        except StepError as exc:
            if attempt + 1 >= retry.attempts:
                raise StepError(f"{exc} (gave up after {retry.attempts} attempts)") from None
            delay = retry.delay(attempt)
            log.warning("%s: attempt %d failed: %s; retrying in %gs", name, attempt + 1, exc, delay)
            sleep(delay)


@contextmanager
def _run_log(log_dir: Path) -> Iterator[None]:
    """Log to provision.log and hold a lock so two runs never interleave."""
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_dir / "provision.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(min(old_level or logging.INFO, logging.INFO))
    fd = os.open(log_dir / ".provision.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StepFailed(
                [f"another provisioning run holds {log_dir}/.provision.lock"]
            ) from None
        yield
    finally:
        os.close(fd)
        log.removeHandler(handler)
        log.setLevel(old_level)
        handler.close()


def _run_step(step: Step, ctx: Context, retry: Retry, sleep: Callable[[float], None]) -> Outcome:
    change = step.inspect(ctx)
    if change is None:
        log.debug("%s: as desired", step.name)
        return Outcome(step.name, "unchanged")
    if ctx.dry_run:
        return Outcome(step.name, "would change", change)
    log.info("%s: %s", step.name, change.summary)
    if step.network:
        with_retry(lambda: step.apply(ctx), step.name, retry, sleep)
    else:
        step.apply(ctx)
    # Idempotency is checked, not assumed: after apply the step must find nothing to do.
    left = step.inspect(ctx)
    if left is not None:
        raise StepError(f"still differs after the change: {left.summary}")
    ctx.changed.add(step.name)
    return Outcome(step.name, "changed", change)


def apply_plan(
    plan: Plan,
    *,
    dry_run: bool = False,
    verify: bool = True,
    retry: Retry | None = None,
    sleep: Callable[[float], None] = time.sleep,
    env: dict[str, str] | None = None,
) -> Result:
    """Bring the node to the plan; StepFailed naming the step or check that failed."""
    retry = retry or Retry()
    result = Result(plan, dry_run)
    ctx = Context(dry_run=dry_run, env=env)
    if dry_run:
        _run_steps(plan.steps, plan.node, ctx, result, retry, sleep)
        return result
    # The log directory is made first, as a step like any other, so the log can hold the rest.
    first: list[Step] = [
        s for s in plan.steps if isinstance(s, Directory) and s.path == plan.layout.log_dir
    ]
    _run_steps(first, plan.node, ctx, result, retry, sleep)
    with _run_log(plan.layout.log_dir):
        log.info(
            "provisioning %s as %s (prefix %s)", plan.node, plan.role, plan.layout.prefix or "none"
        )
        rest = [s for s in plan.steps if s not in first]
        _run_steps(rest, plan.node, ctx, result, retry, sleep)
        log.info("%s", result.summary())
        if verify:
            for check in plan.checks:
                try:
                    line = check.run(sleep)
                except StepError as exc:
                    log.error("%s: failed: %s", check.name, exc)
                    raise StepFailed([f"{plan.node}: {check.name}: failed: {exc}"]) from None
                log.info("%s: %s", check.name, line)
                result.checks.append((check.name, line))
    return result


def _run_steps(
    steps: list[Step],
    node: str,
    ctx: Context,
    result: Result,
    retry: Retry,
    sleep: Callable[[float], None],
) -> None:
    for step in steps:
        try:
            result.outcomes.append(_run_step(step, ctx, retry, sleep))
        except (StepError, OSError) as exc:
            why = str(exc) if isinstance(exc, StepError) else f"{exc.strerror}: {exc.filename}"
            if step.optional:
                log.warning("%s: failed (optional, going on): %s", step.name, why)
                result.outcomes.append(Outcome(step.name, "failed (optional)", error=why))
                continue
            if not ctx.dry_run:
                log.error("%s: failed: %s", step.name, why)
            raise StepFailed([f"{node}: step '{step.name}' failed: {why}"]) from None
