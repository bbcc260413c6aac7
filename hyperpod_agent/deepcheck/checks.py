"""Per kind of check: the command it runs and how its run is judged.

The judging order is the same for every kind: a tool that could not start or overran
its time limit is UNKNOWN; then the tool's own output decides; output we cannot read,
and any bug of ours while reading it, is UNKNOWN too. A tool that reports success but
exits non-zero is UNKNOWN: we do not resume a node on a contradiction.
"""

from __future__ import annotations

import logging
import os

from hyperpod_agent.deepcheck import (
    parse_dcgm,
    parse_nccl,
    parse_nvlink,
    parse_perftest,
    parse_stressng,
)
from hyperpod_agent.deepcheck.config import (
    Check,
    DcgmCheck,
    IbCheck,
    NcclCheck,
    NvlinkCheck,
    ScriptCheck,
    StressCheck,
)
from hyperpod_agent.deepcheck.execute import Execution
from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement, one_line
from hyperpod_agent.deepcheck.parsing import ParseError
from hyperpod_agent.probes.script import EXIT_FAIL, EXIT_OK

log = logging.getLogger(__name__)


def tool_name(check: Check) -> str:
    """How causes name the tool: its file name."""
    program = check.path if isinstance(check, ScriptCheck) else check.executable
    return os.path.basename(program)


def command(check: Check, port: int | None = None, server: bool = False) -> list[str]:
    """The argument list ``check`` runs. For ``ib``: ``port`` is passed with ``-p``, and
    ``server`` leaves out the host to connect to (perftest's server side)."""
    if isinstance(check, DcgmCheck):
        return [check.executable, "diag", "-r", str(check.diag_level), "-j", *check.extra_args]
    if isinstance(check, NcclCheck):
        return [*check.launcher, check.executable, *check.args]
    if isinstance(check, NvlinkCheck):
        return [check.executable, "nvlink", "--status"]
    if isinstance(check, IbCheck):
        argv = [check.executable]
        argv += ["-d", check.device] if check.device else []
        argv += ["-p", str(port)] if port else []
        argv += check.args
        return argv if server else [*argv, check.peer or "localhost"]
    if isinstance(check, StressCheck):
        # stress-ng reads a count of 0 as "one per CPU": leave a stressor out instead
        argv = [check.executable, "--cpu", str(check.cpu)]
        argv += ["--vm", str(check.vm), "--vm-bytes", check.vm_bytes] if check.vm else []
        argv += ["--timeout", f"{check.duration_s}s", "--metrics-brief"]
        argv += ["--verify"] if check.verify else []
        return [*argv, *check.extra_args]
    return [check.path, *check.args]


def _judge_script(run: Execution) -> Judgement:
    # the agent's script probe contract: 0 OK, 1 FAIL, anything else UNKNOWN
    text = one_line(run.stdout)
    if run.returncode == EXIT_OK:
        return Judgement(CheckOutcome.OK, text or "exit 0")
    if run.returncode == EXIT_FAIL:
        return Judgement(CheckOutcome.FAIL, text or "exit 1")
    return Judgement(CheckOutcome.UNKNOWN, f"exit {run.returncode}" + (f": {text}" if text else ""))


def _judge_output(check: Check, run: Execution) -> Judgement:
    if isinstance(check, DcgmCheck):
        return parse_dcgm.judge_diag(parse_dcgm.parse_diag_json(run.stdout))
    if isinstance(check, NcclCheck):
        return parse_nccl.judge_nccl(parse_nccl.parse_nccl(run.stdout), check.min_busbw_gbps)
    if isinstance(check, NvlinkCheck):
        gpus = parse_nvlink.parse_nvlink_status(run.stdout)
        return parse_nvlink.judge_nvlink(gpus, check.expected_links_per_gpu)
    if isinstance(check, IbCheck):
        return parse_perftest.judge_ib(parse_perftest.parse_ib_bw(run.stdout), check.min_ib_gbps)
    if isinstance(check, StressCheck):
        report = parse_stressng.parse_stress_ng(run.stdout)
        return parse_stressng.judge_stress_ng(report, run.returncode or 0)
    return _judge_script(run)


def _first_line(run: Execution) -> str:
    for text in (run.stderr, run.stdout):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return ""


def judge(check: Check, run: Execution) -> Judgement:
    """The outcome of one run of ``check`` (never raises)."""
    tool = tool_name(check)
    if run.error is not None:
        return Judgement(CheckOutcome.UNKNOWN, one_line(run.error))
    if run.timed_out:
        cause = f"timed out after {check.timeout_s:g} s"
        if run.survivors:
            # most likely stuck in the kernel (a hung driver call): worth saying
            pids = " ".join(map(str, run.survivors))
            cause += f"; {len(run.survivors)} of its processes survived SIGKILL: {pids}"
        return Judgement(CheckOutcome.UNKNOWN, one_line(cause))
    try:
        verdict = _judge_output(check, run)
    except ParseError as exc:
        said = _first_line(run)
        cut = " (output was cut at the limit)" if run.truncated else ""
        cause = f"{tool}: output not understood ({exc}){cut}"
        return Judgement(
            CheckOutcome.UNKNOWN, one_line(cause + (f"; it said: {said}" if said else ""))
        )
    except Exception as exc:  # a bug of ours must never take a healthy node out
        log.exception("deep check %s: judging %s output failed", check.name, tool)
        cause = f"{tool}: internal error judging the output: {type(exc).__name__}: {exc}"
        return Judgement(CheckOutcome.UNKNOWN, one_line(cause))
    if verdict.outcome is CheckOutcome.OK and run.returncode not in (0, None):
        if not isinstance(check, ScriptCheck):
            cause = f"{tool} exited {run.returncode} after reporting: {verdict.cause}"
            return Judgement(CheckOutcome.UNKNOWN, one_line(cause), verdict.figures)
    return Judgement(verdict.outcome, one_line(verdict.cause), verdict.figures)
