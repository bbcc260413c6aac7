"""What a deep-check run concluded for each node, and where the node goes next; the
run's directory under ``results_dir``, made and read without trusting a path. Pure
apart from that directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.store.checks import CheckRun, NodeOutcome
from hyperpod_agent.deepcheck.config import load_suite
from hyperpod_agent.deepcheck.model import SuiteResult
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.reasons import SPARE, Owner, Verb, format_reason, owner_of
from hyperpod_agent.slurm.models import Job, Node

DRAIN_FIRST_REASON = format_reason(Verb.DRAIN, "deep-check", "admin", "drained for a deep check")
_RESULT_LIMIT = 4 * 1024 * 1024
SCRIPT = "check.sh"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _safe_dir(fd: int, path: Path) -> None:
    """``fd`` is a directory only root (or we) can write; ConfigError otherwise."""
    st = os.fstat(fd)
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise ConfigError(
            f"deep checks: {path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) "
            "must be root's and writable by nobody else: the check job runs from it"
        )


def write_script(deep: DeepCheckConfig, name: str, text: str) -> Path:
    """``<results_dir>/<name>/check.sh`` with ``text``, mode 0755; its path. The check
    job runs it as root, so nothing here follows a symlink or reuses a file someone
    else made: ``results_dir`` is checked again (ConfigError), then each level is
    opened with O_NOFOLLOW and checked through its descriptor, and the script is made
    afresh with O_EXCL. OSError when the file system refuses."""
    problem = deep.results_dir_problem()
    if problem is None:
        deep.results_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        problem = deep.results_dir_problem()  # again: the parents it made follow the umask
    if problem is not None:
        raise ConfigError(f"deep checks: results_dir: {problem}")
    top = os.open(deep.results_dir, _DIR)
    try:
        _safe_dir(top, deep.results_dir)
        try:
            os.mkdir(name, 0o755, dir_fd=top)
        except FileExistsError:
            pass  # made before a restart: checked like any other below
        run_fd = os.open(name, _DIR, dir_fd=top)
    finally:
        os.close(top)
    try:
        _safe_dir(run_fd, deep.results_dir / name)
        try:
            os.unlink(SCRIPT, dir_fd=run_fd)
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(SCRIPT, flags, 0o755, dir_fd=run_fd), "wb") as fh:
            fh.write(text.encode("utf-8"))
            os.fchmod(fh.fileno(), 0o755)
    finally:
        os.close(run_fd)
    return deep.results_dir / name / SCRIPT


def hold_reason(outcome: NodeOutcome) -> str:
    cause = outcome.cause if outcome.outcome == "FAIL" else f"unknown: {outcome.cause}"
    return format_reason(Verb.HOLD, "deep-check", outcome.check or "-", cause)


def suite_limit_s(deep: DeepCheckConfig, level: str) -> float:
    """The longest a run of ``level`` may take on one node: every check's own limit,
    its kill grace, and the configured margin. ConfigError on a bad suite file."""
    if deep.suite is None:
        raise ConfigError("deep checks: no suite configured ([deep_checks] suite)")
    suite = load_suite(deep.suite)
    checks = suite.at_level(level)
    return sum(c.timeout_s + suite.kill_grace_s for c in checks) + deep.margin_s


def target_of(run: CheckRun, outcome: NodeOutcome, slurm_users: Sequence[str]) -> str | None:
    """The reason a node goes back to after ``run`` (None: back into service)."""
    prior = run.prior.get(outcome.node, "").strip()
    if not outcome.ran:
        return prior or None
    ok = outcome.outcome == "OK"
    if run.purpose == "spare":
        return SPARE if ok else hold_reason(outcome)
    if run.purpose == "reentry":
        return None if ok else hold_reason(outcome)
    # admin: a human's own reason is kept whatever the outcome; ours give way to a hold
    theirs = owner_of(Node(outcome.node, "IDLE", frozenset({"DRAIN"}), prior), slurm_users)
    if prior and theirs is Owner.OTHER:
        return prior
    if ok:
        return None if prior in ("", DRAIN_FIRST_REASON) else prior
    return hold_reason(outcome)


def judge_node(
    run: CheckRun, node: str, results_dir: Path, job: Job | None, now: float
) -> NodeOutcome:
    """One node's outcome from the file its task wrote (UNKNOWN when there is none)."""
    path = results_dir / run.reservation / f"{node}.json"
    state = job.state if job is not None else "gone"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ValueError("not a regular file")
            raw = fh.read(_RESULT_LIMIT + 1)
        if len(raw) > _RESULT_LIMIT:
            raise ValueError(f"larger than {_RESULT_LIMIT} bytes")
        result = SuiteResult.model_validate_json(raw)
    except FileNotFoundError:
        cause = f"no result from {node} (check job {run.job_id} ended {state})"
        return NodeOutcome(run.id, node, run.purpose, "UNKNOWN", "", cause, True, now)
    except (OSError, ValueError, ValidationError) as exc:
        cause = f"result of {node} unreadable: {str(exc).splitlines()[0][:200]}"
        return NodeOutcome(run.id, node, run.purpose, "UNKNOWN", "", cause, True, now)
    outcome = result.outcome.value
    deciding = next(
        (r for r in result.results if r.gating and r.outcome.value == outcome and outcome != "OK"),
        None,
    )
    passed = sum(1 for r in result.results if r.outcome.value == "OK")
    cause = (
        deciding.cause
        if deciding is not None
        else f"{passed}/{len(result.results)} checks OK at level {result.level}"
    )
    detail = [r.model_dump(mode="json") for r in result.results]
    check = deciding.check if deciding is not None else ""
    return NodeOutcome(run.id, node, run.purpose, outcome, check, cause, True, now, detail)


def timed_out(o: NodeOutcome, limit_s: float) -> NodeOutcome:
    cause = f"the check job overran its time limit ({limit_s:.0f} s) and was cancelled"
    return NodeOutcome(o.run_id, o.node, o.purpose, "UNKNOWN", "", cause, True, o.at)
