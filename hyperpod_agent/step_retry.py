"""``hyperpod step-retry -- srun ARGS...``: run an ``--auto-resume`` step and, when it
fails, ask the controller whether to run it again inside the same job
(docs/auto-resume.md, "Step retry inside the allocation").

The SPANK plugin hands ``srun --auto-resume[=N]`` inside an allocation over to this
helper (plugstack ``step_helper=``); it can be called directly as well. It

- runs srun with ``HYPERPOD_STEP_WRAPPED=1`` (so the plugin does not hand over again),
  ``HYPERPOD_STEP_ATTEMPT`` (0 on the first run) and ``HYPERPOD_RDZV_HOST`` (the first
  node of the job's current node list);
- renews the step's watch with the controller every second; told to end
  the step (one of its nodes is faulty) it ends srun at once, rather than wait for a
  collective to time out on the dead node;
- reports a failed srun (exit code, nodes, attempt) and follows the answer: RETRYSTEP
  waits for the new allocation, sets ``SLURM_JOB_NODELIST``, ``SLURM_NODELIST``,
  ``SLURM_NNODES`` and ``SLURM_JOB_NUM_NODES`` and runs the same srun again (with
  ``--exclude`` of a bad batch host the job keeps);
  REQUEUE waits (at most ``requeue_wait_s``) for the controller's requeue to end the
  job, so it never shows FAILED in between; FAIL ends with srun's exit code.

No policy lives here: the controller decides, and it trusts nothing of what the helper
says but the exit code, the attempt and a cancellation: the step's nodes and start are
what Slurm says, the budget is the job's own opt-in (the helper still sends its node
list, start and ``--auto-resume`` value, which older controllers read). A controller
that has not seen the job yet (it reads Slurm every pass) answers 404: the watch and
the request are tried again meanwhile. Whatever goes wrong in the conversation (no
controller, a malformed answer, a surgery that outlives ``--wait-s``), the step fails
as plain srun would, with srun's exit code and a message saying why. Every request and
every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

import click

from hyperpod_agent.client import ControllerClient, ControllerError, ControllerUnreachable
from hyperpod_agent.errors import HyperpodError, SlurmParseError
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist

PREFIX = "hyperpod step-retry"
WRAPPED_ENV = "HYPERPOD_STEP_WRAPPED"
BUDGET_ENV = "HYPERPOD_STEP_AUTO_RESUME"  # N from the plugin that handed over
MAX_BUDGET = 1000
# srun prints slurmstepd's line when the step is cancelled (scancel J.S, or srun ended).
CANCELLED_MARK = b" CANCELLED AT "
TERM_GRACE_S = 30.0  # srun ended with SIGTERM gets this long before SIGKILL
PASSING = (502, 503, 504)  # a controller restarting, or a standby taking over


class UsageError(HyperpodError):
    """The helper was called wrongly: a one-line message, exit 2."""


def budget_from(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``--auto-resume=N`` of the srun command line (the plugin's value first)."""
    given = env.get(BUDGET_ENV)
    if given is None:
        for arg in argv[1:]:
            if arg == "--":
                break
            if arg == "--auto-resume":
                given = "1"
            elif arg.startswith("--auto-resume="):
                given = arg.split("=", 1)[1]
    if given is None:
        return 0
    if not given.isdigit() or int(given) > MAX_BUDGET:
        raise UsageError(f"--auto-resume={given}: want a whole number from 0 to {MAX_BUDGET}")
    return int(given)


@dataclass
class Launch:
    """One run of srun: how it ended and what was seen meanwhile."""

    code: int = 0
    cancelled_seen: bool = False  # slurmstepd's CANCELLED line went by
    ended_by_us: str = ""  # the controller's cause, when the helper ended the step
    interrupted: bool = False  # the helper itself was signalled (job cancelled, Ctrl-C)
    started_at: float = 0.0  # epoch seconds when srun was started


@dataclass
class StepRetry:
    """The conversation for one srun command line."""

    argv: list[str]
    env: dict[str, str]
    controller: ControllerClient
    wait_s: float = 600.0
    # After REQUEUE: how long the job waits for the controller's requeue, which ends
    # it (and this helper) without the job ever showing FAILED in between.
    requeue_wait_s: float = 30.0
    reach_s: float = 60.0  # how long an unreachable controller (a restart) is retried
    poll_s: float = 0.25
    say: Callable[[str], None] = field(default=lambda m: print(f"{PREFIX}: {m}", file=sys.stderr))
    _child: subprocess.Popen[bytes] | None = None
    _interrupted: bool = False
    exclude: str = ""  # nodes the job keeps that the relaunch must not use

    def __post_init__(self) -> None:
        job = self.env.get("SLURM_JOB_ID", "")
        if not job.isdigit():
            raise UsageError("not inside an allocation (SLURM_JOB_ID is not set)")
        self.job_id = int(job)
        self.budget = budget_from(self.argv, self.env)
        self.step_id = f"srun-{os.getpid()}"

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> int:
        attempt = 1
        while True:
            launch = self.launch(attempt)
            if launch.code == 0 or launch.interrupted:
                return launch.code
            answer = self.ask(attempt, launch)
            if answer is None:
                return launch.code
            nodelist, nnodes, rdzv, self.exclude = answer
            attempt += 1
            self.env.update(
                SLURM_JOB_NODELIST=nodelist,
                SLURM_NODELIST=nodelist,
                SLURM_NNODES=str(nnodes),
                SLURM_JOB_NUM_NODES=str(nnodes),
                HYPERPOD_RDZV_HOST=rdzv,
            )
            self.say(f"Retrying step. Attempt number: {attempt - 1} (on {nodelist})")

    def _nodelist(self) -> str:
        return self.env.get("SLURM_JOB_NODELIST") or self.env.get("SLURM_NODELIST") or ""

    def launch(self, attempt: int) -> Launch:
        """srun once, watched; returns how it ended."""
        env = dict(self.env)
        env[WRAPPED_ENV] = "1"
        env["HYPERPOD_STEP_ATTEMPT"] = str(attempt - 1)
        nodes = self._nodelist()
        if "HYPERPOD_RDZV_HOST" not in env and nodes:
            env["HYPERPOD_RDZV_HOST"] = _first(nodes)
        launch = Launch(started_at=time.time())
        argv = self.command()
        try:
            child = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        except OSError as exc:
            self.say(f"cannot run {self.argv[0]}: {exc.strerror or exc}")
            launch.code = 127
            return launch
        self._child = child
        assert child.stderr is not None
        copier = threading.Thread(target=_copy, args=(child.stderr, launch), daemon=True)
        copier.start()
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(child, attempt, nodes, launch, stop), daemon=True
        )
        watcher.start()
        code = child.wait()
        stop.set()
        copier.join(10)
        if not copier.is_alive():  # else a process srun left holds the pipe: leave it
            child.stderr.close()
        watcher.join(10)
        self._child = None
        launch.code = _exit_code(code)
        launch.interrupted = self._interrupted
        return launch

    def command(self) -> list[str]:
        """srun's command line for this launch: after a retry that kept a bad batch host
        in the job (Slurm never removes one), ``--exclude`` keeps the step off it. It
        goes first, so an ``--exclude`` of the user's own still wins."""
        if not self.exclude:
            return self.argv
        if os.path.basename(self.argv[0]) != "srun":
            self.say(f"{self.argv[0]} is not srun: cannot keep the step off {self.exclude}")
            return self.argv
        return [self.argv[0], f"--exclude={self.exclude}", *self.argv[1:]]

    def _watch(
        self,
        child: subprocess.Popen[bytes],
        attempt: int,
        nodes: str,
        launch: Launch,
        stop: threading.Event,
    ) -> None:
        """Renew the watch until srun ends; end srun when told to."""
        every, warned, ended_at = 0.0, False, 0.0  # the first watch at once
        began = time.monotonic()
        while not stop.wait(every):
            if launch.ended_by_us:
                if time.monotonic() - ended_at > TERM_GRACE_S:
                    child.kill()
                every = 1.0
                continue
            try:
                answer = self.controller.step_watch(
                    self.job_id, self.step_id, attempt, nodes, launch.started_at
                )
                end, cause = bool(answer["end"]), str(answer.get("cause", ""))
                every = min(max(float(answer.get("renew_every_s", 2.0)), 0.5), 30.0)
            except ControllerError as exc:
                if exc.status == 404 and time.monotonic() - began < self.reach_s:
                    every = 1.0  # a job that just started: the controller's next pass sees it
                    continue
                if not warned:
                    self.say(f"cannot watch the step with the controller ({exc}); it runs on")
                warned = True
                every = 5.0
                continue
            except (HyperpodError, KeyError, TypeError, ValueError) as exc:
                if not warned:
                    self.say(f"cannot reach the controller to watch the step ({exc}); it runs on")
                warned = True
                every = 5.0
                continue
            warned = False
            if end:
                self.say(f"the controller ends the step: {cause}")
                launch.ended_by_us = cause or "a node fault"
                ended_at = time.monotonic()
                child.send_signal(signal.SIGTERM)

    def ask(self, attempt: int, launch: Launch) -> tuple[str, int, str, str] | None:
        """The controller's answer to the failed attempt: (node list, node count,
        rendezvous host, nodes to exclude) to retry with, or None (the failure stands)."""
        cancelled = launch.cancelled_seen and not launch.ended_by_us
        try:
            out = self._reach(
                lambda: self.controller.step_retry(
                    self.job_id,
                    self.step_id,
                    min(launch.code, 255),
                    self._nodelist(),
                    attempt,
                    self.budget,
                    cancelled,
                    launch.started_at,
                ),
                also=(404,),  # a job the controller has not seen yet
            )
            deadline = time.monotonic() + self.wait_s
            while _valid(out) and out["decision"] == "RETRYSTEP" and not out["done"]:
                if time.monotonic() > deadline:
                    self.say(
                        f"the new allocation was not ready within {self.wait_s:g} s; "
                        f"the step fails (exit {launch.code})"
                    )
                    return None
                time.sleep(self.poll_s)
                out = self._reach(partial(self.controller.step_retry_state, int(out["id"])))
        except HyperpodError as exc:
            self.say(
                f"could not ask the controller whether to retry ({exc}); the step fails "
                f"as srun would (exit {launch.code})"
            )
            return None
        if not _valid(out):
            self.say(
                f"the controller's answer is malformed ({str(out)[:120]}); the step fails "
                f"as srun would (exit {launch.code})"
            )
            return None
        if out["decision"] == "REQUEUE":
            self.say(f"REQUEUE: {out['cause']}; waiting for the job's requeue")
            self._sleep_until_requeued()
            self.say(f"no requeue within {self.requeue_wait_s:g} s (exit {launch.code})")
            return None
        if out["decision"] != "RETRYSTEP":
            self.say(f"{out['decision']}: {out['cause']} (exit {launch.code})")
            return None
        try:
            nodes = compress_hostlist(expand_hostlist(str(out["nodelist"])))
            nnodes = int(out["nnodes"])
        except (SlurmParseError, TypeError, ValueError):
            self.say(f"the controller's node list {out.get('nodelist')!r} is malformed")
            return None
        pause = out.get("retry_after_s", 0.0)
        if isinstance(pause, (int, float)) and pause > 0:
            pause = min(float(pause), self.wait_s)
            self.say(f"backing off {pause:.0f} s before the relaunch (earlier retries)")
            time.sleep(pause)
        exclude = out.get("exclude") or ""
        try:
            exclude = compress_hostlist(expand_hostlist(str(exclude))) if exclude else ""
        except SlurmParseError:
            self.say(f"the controller's node to exclude {exclude!r} is malformed")
            return None
        return nodes, nnodes, str(out.get("rdzv_host") or _first(nodes)), exclude

    def _sleep_until_requeued(self) -> None:
        """The controller requeues the job next (a REQUEUE answer); ending now would end
        the batch script first and show the job FAILED, which ``afternotok``
        dependencies act on. Slurm's requeue ends this process; a signal to it (the
        user's) ends the wait."""
        deadline = time.monotonic() + self.requeue_wait_s
        while not self._interrupted and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))

    def _reach(self, request: Callable[[], Any], also: tuple[int, ...] = ()) -> Any:
        """``request()``, sent again while no controller can be reached (one restarting,
        a standby taking over) or it answers one of the statuses ``also``, for at most
        ``reach_s``. Both requests are safe to repeat: the same failed attempt always
        finds the same surgery."""
        deadline = time.monotonic() + self.reach_s
        said = False
        while True:
            try:
                return request()
            except (ControllerUnreachable, ControllerError) as exc:
                passing = isinstance(exc, ControllerUnreachable) or exc.status in PASSING + also
                if not passing or time.monotonic() >= deadline:
                    raise
                if not said:
                    what = "no controller answers"
                    if isinstance(exc, ControllerError) and exc.status in also:
                        what = "the controller does not know the job yet"
                    self.say(f"{what} ({exc}); trying for {self.reach_s:g} s")
                    said = True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    # -- signals ----------------------------------------------------------------------
    def forward(self, signum: int, _frame: object) -> None:
        """A signal to the helper is the job's or the user's: pass it to srun, and do
        not retry what it ends."""
        self._interrupted = True
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)


def _valid(out: Any) -> bool:
    return (
        isinstance(out, dict)
        and out.get("decision") in ("RETRYSTEP", "REQUEUE", "FAIL")
        and isinstance(out.get("done"), bool)
        and isinstance(out.get("cause", ""), str)
        and (out["decision"] != "RETRYSTEP" or out["done"] or isinstance(out.get("id"), int))
    )


def _exit_code(returncode: int) -> int:
    """A shell's exit code for a process's return code (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _first(nodelist: str) -> str:
    try:
        names = expand_hostlist(nodelist)
    except SlurmParseError:
        return ""
    return names[0] if names else ""


def _copy(stream: IO[bytes], launch: Launch) -> None:
    """srun's stderr to ours, line by line, noting a cancelled step on the way."""
    out = sys.stderr.buffer
    for line in iter(stream.readline, b""):
        if CANCELLED_MARK in line:
            launch.cancelled_seen = True
        out.write(line)
        out.flush()


def main(
    argv: Sequence[str],
    controller: ControllerClient,
    wait_s: float,
    reach_s: float,
    requeue_wait_s: float = 30.0,
) -> int:
    """Run the srun command line ``argv`` with step retry; srun's exit code."""
    if not argv:
        raise UsageError("give the srun command line after '--'")
    helper = StepRetry(
        list(argv),
        dict(os.environ),
        controller,
        wait_s=wait_s,
        reach_s=reach_s,
        requeue_wait_s=requeue_wait_s,
    )
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, helper.forward)
    return helper.run()


@click.command("step-retry", context_settings={"ignore_unknown_options": True})
@click.option(
    "--wait-s",
    type=click.FloatRange(1, 3600),
    default=600.0,
    show_default=True,
    help="Longest wait for the new allocation after a RETRYSTEP answer.",
)
@click.option(
    "--reach-s",
    type=click.FloatRange(0, 3600),
    default=60.0,
    show_default=True,
    help="How long to keep trying a controller that cannot be reached (a restart).",
)
@click.option(
    "--requeue-wait-s",
    type=click.FloatRange(0, 3600),
    default=30.0,
    show_default=True,
    help="After a REQUEUE answer, how long to wait for the controller's requeue to end "
    "the job before exiting with srun's code.",
)
@click.argument("srun", nargs=-1, type=click.UNPROCESSED, required=True)
def step_retry(wait_s: float, reach_s: float, requeue_wait_s: float, srun: tuple[str, ...]) -> None:
    """Run SRUN (an srun command line, after '--') and retry it inside the same job
    when the controller says a node fault ended it (RETRYSTEP). Exits with srun's code.
    The SPANK plugin calls this for srun --auto-resume inside an allocation."""
    from hyperpod_agent.admin.common import make_client

    try:
        controller = make_client(None, None, None, None)
        code = main(srun, controller, wait_s, reach_s, requeue_wait_s)
    except UsageError as exc:
        click.echo(f"{PREFIX}: {exc}", err=True)
        sys.exit(2)
    except HyperpodError as exc:  # no usable controller configuration: run srun plainly
        click.echo(f"{PREFIX}: {exc}; running srun without step retry", err=True)
        code = _plain(srun)
    sys.exit(code)


def _plain(argv: Sequence[str]) -> int:
    env = {**os.environ, WRAPPED_ENV: "1"}
    try:
        code = subprocess.call(list(argv), env=env)
    except OSError as exc:
        click.echo(f"{PREFIX}: cannot run {argv[0]}: {exc.strerror or exc}", err=True)
        return 127
    return _exit_code(code)
