"""Running one level of a suite on this node: the checks in order, each with its own
time limit, each judged into a CheckResult.

A gating FAIL stops the rest only when the suite says ``stop_on_fail`` (a longer run
then tells the operator more about the node; stopping saves maintenance time).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from hyperpod_agent.deepcheck.checks import command, judge, tool_name
from hyperpod_agent.deepcheck.config import LEVELS, Check, IbCheck, NcclCheck, Suite
from hyperpod_agent.deepcheck.execute import Execution, StartError, resolve, run, start
from hyperpod_agent.deepcheck.model import (
    CheckOutcome,
    CheckResult,
    Judgement,
    SuiteResult,
    gating_outcome,
    one_line,
)
from hyperpod_agent.errors import ConfigError

log = logging.getLogger(__name__)

# what perftest's server prints once it listens for its client
IB_SERVER_READY = "Waiting for client to connect"
# how long the server may take to finish after its client did
_IB_SERVER_AFTER_CLIENT_S = 10.0


def local_node(env: Mapping[str, str]) -> str:
    """This node's name: Slurm's, else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _execute(check: Check, argv: list[str], suite: Suite, env: Mapping[str, str]) -> Execution:
    if isinstance(check, NcclCheck) and check.launcher:
        # behind a launcher a missing binary would be the launcher's error message
        try:
            resolve(check.executable, env)
        except StartError as exc:
            return Execution(tuple(argv), error=str(exc))
    return run(
        argv,
        timeout_s=check.timeout_s,
        env=env,
        output_limit=suite.output_limit_bytes,
        kill_grace_s=suite.kill_grace_s,
    )


def _ib_loopback(
    check: IbCheck, suite: Suite, env: Mapping[str, str]
) -> tuple[Judgement, list[str]]:
    """perftest through this node's own HCA: its server, then its client to localhost,
    within the check's one time limit."""
    deadline = time.monotonic() + check.timeout_s
    port = check.port or _free_port()
    client_argv = command(check, port=port)
    try:
        server = start(command(check, port=port, server=True), env, suite.output_limit_bytes)
    except StartError as exc:
        return Judgement(CheckOutcome.UNKNOWN, str(exc)), client_argv
    if not server.wait_for(IB_SERVER_READY, deadline):
        served = server.finish(time.monotonic(), suite.kill_grace_s)
        if served.timed_out:
            return judge(check, served), client_argv
        said = served.stderr.strip() or served.stdout.strip() or f"exit {served.returncode}"
        cause = f"{tool_name(check)} server did not start listening: {said}"
        return Judgement(CheckOutcome.UNKNOWN, one_line(cause)), client_argv
    client = run(
        client_argv,
        timeout_s=max(deadline - time.monotonic(), 0.001),
        env=env,
        output_limit=suite.output_limit_bytes,
        kill_grace_s=suite.kill_grace_s,
    )
    after = time.monotonic() + (_IB_SERVER_AFTER_CLIENT_S if client.returncode == 0 else 0.0)
    server.finish(min(deadline, after), suite.kill_grace_s)
    return judge(check, client), client_argv


def run_check(
    check: Check, suite: Suite, nodes: Sequence[str], env: Mapping[str, str]
) -> CheckResult:
    """Run and judge one check."""
    began = time.monotonic()
    names = list(nodes)
    if isinstance(check, IbCheck) and check.peer is None:
        verdict, argv = _ib_loopback(check, suite, env)
    else:
        argv = command(check, port=check.port if isinstance(check, IbCheck) else None)
        verdict = judge(check, _execute(check, argv, suite, env))
        if isinstance(check, IbCheck) and check.peer is not None:
            names.append(check.peer)
    result = CheckResult(
        check=check.name,
        kind=check.kind,
        outcome=verdict.outcome,
        cause=verdict.cause,
        figures=verdict.figures,
        duration_s=time.monotonic() - began,
        nodes=names,
        gating=check.gating,
        command=argv,
    )
    level = logging.INFO if result.outcome is CheckOutcome.OK else logging.WARNING
    log.log(
        level,
        "deep check %s on %s: %s: %s",
        check.name,
        ",".join(names),
        result.outcome.value,
        result.cause,
    )
    return result


def run_suite(
    suite: Suite,
    level: str,
    nodes: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> SuiteResult:
    """Run the checks of ``level`` in order on this node. ``nodes`` are the node(s) the
    results speak for (default: this node); ``env`` is the tools' environment (default:
    ours), whose PATH decides which tools run. ConfigError when the level has no gating
    check: a gate with nothing to pass must not pass."""
    if level not in LEVELS:
        raise ConfigError(f"unknown level {level!r}, expected one of {', '.join(LEVELS)}")
    checks = suite.at_level(level)
    if not any(c.gating for c in checks):
        raise ConfigError(f"no gating check at level {level!r}")
    tool_env = dict(os.environ if env is None else env)
    names = list(nodes) if nodes else [local_node(tool_env)]
    started_at = datetime.now(UTC)
    began = time.monotonic()
    results: list[CheckResult] = []
    skipped: list[str] = []
    for index, check in enumerate(checks):
        result = run_check(check, suite, names, tool_env)
        results.append(result)
        if suite.stop_on_fail and check.gating and result.outcome is CheckOutcome.FAIL:
            skipped = [c.name for c in checks[index + 1 :]]
            break
    return SuiteResult(
        level=level,
        nodes=names,
        started_at=started_at,
        duration_s=time.monotonic() - began,
        outcome=gating_outcome(results),
        results=results,
        skipped=skipped,
    )
