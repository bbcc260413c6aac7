"""SlurmClient: the only code in the project that runs Slurm commands.

Every call is an argument list (never a shell) with a timeout. Failures become typed errors:
SlurmTimeout, SlurmError (non-zero exit, carrying argv and stderr, or Slurm missing) and
SlurmParseError (output we do not understand). State-changing calls are logged once, with the
node or job and the reason. Parsing lives in ``parse.py``; this module only does I/O.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from hyperpod_agent.errors import SlurmError, SlurmTimeout
from hyperpod_agent.slurm import parse
from hyperpod_agent.slurm._common import check_job, usage_error
from hyperpod_agent.slurm.hostlist import compress_hostlist
from hyperpod_agent.slurm.maint import MaintenanceCalls
from hyperpod_agent.slurm.models import Job, Node
from hyperpod_agent.slurm.resize import ResizeCalls
from hyperpod_agent.slurm.version import version_from_config

log = logging.getLogger(__name__)

REASON_PREFIX = "hyperpod"
# Slurm stores any length, but reasons are read by people in `sinfo -R` and by our parsers:
# keep them to one short line.
REASON_MAX_LEN = 256
# Matched with fullmatch: "$" would accept a trailing newline. Brackets allow a hostlist.
_NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(\[[0-9,\-]+\][A-Za-z0-9_.\-]*)*")
_HOSTNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-:]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SIGNAL = re.compile(r"(SIG)?[A-Z][A-Z0-9]*|[0-9]+")
# Slurm joins the partition list into one request; far beyond any real command line.
_MAX_NAME_LEN = 1024


def format_reason(action: str, *details: str, prefix: str = REASON_PREFIX) -> str:
    """Build a reason we own, e.g. ``format_reason("replace", "gpu3", "xid79", msg)`` ->
    ``"hyperpod:replace gpu3 xid79 <msg>"``: control characters and runs of whitespace become
    one space and the result is cut to REASON_MAX_LEN, so it is always safe to pass to drain()."""
    words = " ".join(d for d in details if d)
    text = f"{prefix}:{action}" + (f" {words}" if words else "")
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text[:REASON_MAX_LEN].rstrip()


def _check_node(node: str, what: str = "node name") -> str:
    if not isinstance(node, str) or not node or len(node) > _MAX_NAME_LEN:
        raise usage_error(["scontrol"], f"invalid {what} {node!r}")
    if not _NODE_NAME.fullmatch(node):
        raise usage_error(["scontrol"], f"invalid {what} {node!r}: letters, digits, '._-' only")
    return node


def _check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise usage_error(["scontrol"], "a reason is required")
    if _CONTROL.search(reason):
        raise usage_error(
            ["scontrol"], f"reason has a control character (newline, tab): {reason!r}"
        )
    if len(reason) > REASON_MAX_LEN:
        raise usage_error(["scontrol"], f"reason longer than {REASON_MAX_LEN} characters")
    return reason.strip()


class SlurmClient(MaintenanceCalls, ResizeCalls):
    """Runs Slurm's command-line tools against one cluster (CLI backend).

    ``slurm_conf`` selects the cluster (sets SLURM_CONF); ``timeout`` bounds every command in
    seconds; ``env`` replaces the inherited environment.
    """

    def __init__(
        self,
        slurm_conf: str | Path | None = None,
        timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.timeout = timeout
        self.slurm_conf = Path(slurm_conf) if slurm_conf is not None else None
        merged = dict(os.environ if env is None else env)
        if self.slurm_conf is not None:
            merged["SLURM_CONF"] = str(self.slurm_conf)
        # The user's SLURM_TIME_FORMAT (e.g. "relative") would change what scontrol prints.
        merged["SLURM_TIME_FORMAT"] = "standard"
        self.env = merged
        # A per-thread upper bound on every command's time (``bounded``).
        self._bound = threading.local()

    # --- plumbing ----------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], timeout: float | None = None) -> str:
        """Run one Slurm command; return its stdout. Raise SlurmTimeout / SlurmError."""
        proc = self._exec(list(argv), timeout)
        if proc.returncode != 0:
            raise SlurmError(list(argv), proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout

    @contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        """Every command this thread runs inside finishes within ``seconds`` (or
        SlurmTimeout): the controller's gate keeps a change inside its lease."""
        outer = getattr(self._bound, "s", None)
        self._bound.s = seconds if outer is None else min(outer, seconds)
        try:
            yield
        finally:
            self._bound.s = outer

    def _exec(self, argv: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
        limit = self.timeout if timeout is None else timeout
        bound = getattr(self._bound, "s", None)
        if bound is not None:
            limit = min(limit, bound)
        conf = self.slurm_conf
        if conf is not None and not conf.is_file():
            # Without a readable slurm.conf every Slurm tool retries for 60 s before failing.
            raise SlurmError(argv, None, "", f"slurm.conf not found: {conf}")
        try:
            return subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                env=self.env,
                timeout=limit,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmTimeout(argv, limit) from None
        except FileNotFoundError:
            raise SlurmError(
                argv, None, "", f"{argv[0]} not found: is Slurm installed and on PATH?"
            ) from None
        except PermissionError as exc:
            raise SlurmError(argv, None, "", f"cannot execute {argv[0]}: {exc.strerror}") from None

    def _change(self, argv: list[str], what: str, target: str, reason: str = "") -> None:
        """Run a state-changing command and log it once."""
        self._run(argv)
        if reason:
            log.info("slurm %s %s: reason=%r", what, target, reason)
        else:
            log.info("slurm %s %s", what, target)

    # --- nodes -------------------------------------------------------------------------------

    def slurmctld_version(self) -> str | None:
        """The running slurmctld's version (``SLURM_VERSION`` of ``scontrol show config``,
        not the command's own); None when the output does not say."""
        return version_from_config(self._run(["scontrol", "show", "config"]))

    def list_nodes(self) -> list[Node]:
        """Every node slurmctld knows (``sinfo --json``), one entry per node."""
        argv = ["sinfo", "--json"]
        return parse.parse_sinfo_json(self._run(argv), argv)

    def node(self, name: str) -> Node:
        """One node (``scontrol show node -o NAME``); SlurmError naming it if unknown."""
        _check_node(name)
        argv = ["scontrol", "show", "node", "-o", name]
        try:
            out = self._run(argv)
        except SlurmTimeout:
            raise
        except SlurmError as exc:
            if "not found" in exc.stderr:
                raise SlurmError(argv, exc.returncode, exc.stderr, f"unknown node {name}") from None
            raise
        found = [n for n in parse.parse_scontrol_nodes(out, argv) if n.name == name]
        if not found:
            raise SlurmError(argv, 0, "", f"unknown node {name}")
        return found[0]

    def drain(self, node: str, reason: str) -> None:
        """Stop scheduling on ``node``; running jobs finish (IDLE+DRAIN / MIXED+DRAIN)."""
        self._update_state(node, "drain", reason)

    def resume(self, node: str) -> None:
        """Return a drained/down/failed node to service (clears the reason)."""
        _check_node(node)
        self._change(["scontrol", "update", f"nodename={node}", "state=resume"], "resume", node)

    def down(self, node: str, reason: str) -> None:
        """Mark ``node`` DOWN, killing its jobs (with ReturnToService=2 a live slurmd undoes it)."""
        self._update_state(node, "down", reason)

    def fail(self, node: str, reason: str) -> None:
        """Mark ``node`` FAIL: like drain, the way admins ask for a replacement."""
        self._update_state(node, "fail", reason)

    def _update_state(self, node: str, state: str, reason: str) -> None:
        _check_node(node)
        reason = _check_reason(reason)
        argv = ["scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}"]
        self._change(argv, state, node, reason)

    def reboot(self, node: str, reason: str, asap: bool = True, next_state: str = "resume") -> None:
        """Ask slurmctld to reboot ``node`` (via RebootProgram) once idle; with ``asap`` the node
        is drained meanwhile. ``next_state`` is ``resume``, ``down``, or ``""``: the node
        keeps the state it had (a node drained before stays drained after the reboot)."""
        _check_node(node)
        reason = _check_reason(reason)
        if next_state not in ("resume", "down", ""):
            raise usage_error(
                ["scontrol", "reboot"], f"next_state must be resume, down or '': {next_state!r}"
            )
        argv = ["scontrol", "reboot"] + (["ASAP"] if asap else [])
        argv += [f"nextstate={next_state}"] if next_state else []
        argv += [f"reason={reason}", node]
        self._change(argv, "reboot", node, reason)

    def set_address(self, node: str, addr: str, hostname: str | None = None) -> None:
        """Point ``node`` at a new address (and hostname), e.g. after a replacement."""
        _check_node(node)
        for value, what in ((addr, "address"), (hostname, "hostname")):
            if value is not None and (not _HOSTNAME.fullmatch(value) or len(value) > 255):
                raise usage_error(["scontrol", "update"], f"invalid {what} {value!r}")
        argv = ["scontrol", "update", f"nodename={node}", f"nodeaddr={addr}"]
        if hostname is not None:
            argv.append(f"nodehostname={hostname}")
        self._change(argv, "set-address", node, f"{addr} {hostname or ''}".strip())

    def update_partition_nodes(self, partition: str, nodes: Sequence[str]) -> None:
        """Set the full node list of ``partition`` (22.05 has no ``nodes+=``)."""
        _check_node(partition, "partition name")
        names = [_check_node(n) for n in nodes]
        if not names:
            raise usage_error(["scontrol", "update"], f"refusing to empty partition {partition}")
        hostlist = compress_hostlist(names)
        argv = ["scontrol", "update", f"partitionname={partition}", f"nodes={hostlist}"]
        self._change(argv, "set-partition-nodes", partition, hostlist)

    # --- jobs --------------------------------------------------------------------------------

    def list_jobs(self, all_states: bool = True) -> list[Job]:
        """Jobs slurmctld knows (``squeue --json``). 22.05 includes finished jobs for MinJobAge
        (300 s by default) whatever the filters; ``all_states=False`` keeps unfinished ones."""
        argv = ["squeue", "--json"]
        jobs = parse.parse_squeue_json(self._run(argv), argv)
        if all_states:
            return jobs
        return [j for j in jobs if j.state not in parse.FINISHED_STATES]

    def job(self, job_id: int) -> Job | None:
        """One job (``scontrol show job -o ID``); None once slurmctld has forgotten it."""
        argv = ["scontrol", "show", "job", "-o", check_job(job_id)]
        try:
            out = self._run(argv)
        except SlurmTimeout:
            raise
        except SlurmError as exc:
            if "Invalid job id" in exc.stderr:
                return None
            raise
        found = [j for j in parse.parse_scontrol_jobs(out, argv) if j.job_id == job_id]
        return found[0] if found else None

    def requeue(self, job_id: int) -> None:
        """Requeue a batch job under the same id (running, or failed within MinJobAge)."""
        jid = check_job(job_id)
        self._change(["scontrol", "requeue", jid], "requeue", f"job {jid}")

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        """Cancel a job, or send it ``signal``. Cancelling a finished job is not an error."""
        jid = check_job(job_id)
        argv = ["scancel", "--verbose"]
        if signal is not None:
            sig = str(signal).upper()
            if not _SIGNAL.fullmatch(sig):
                raise usage_error(["scancel"], f"invalid signal {signal!r}")
            argv.append(f"--signal={sig}")
        argv.append(jid)
        proc = self._exec(argv, None)
        if proc.returncode != 0:
            raise SlurmError(argv, proc.returncode, proc.stderr)
        # 22.05's scancel exits 0 even for an unknown job: read what --verbose says.
        for line in proc.stderr.splitlines():
            if "error:" not in line:
                continue
            if "already completing or completed" in line:
                log.debug("scancel %s: already finished", jid)
                return
            raise SlurmError(argv, 0, line, f"cannot cancel job {jid}")
        log.info("slurm cancel job %s%s", jid, f" signal={signal}" if signal is not None else "")

    # --- controller --------------------------------------------------------------------------

    def show_slurmd(self, scontrol: str = "scontrol") -> str:
        """The local slurmd's own report (``scontrol show slurmd``): a round trip to
        the slurmd of this host, or of the node named by SLURMD_NODENAME in ``env``
        where several run on one host. ``scontrol`` names the binary (tests)."""
        return self._run([scontrol, "show", "slurmd"])

    def ping(self) -> bool:
        """True when slurmctld answers (``scontrol ping``); False when down or too slow."""
        try:
            out = self._run(["scontrol", "ping"])
        except SlurmTimeout:
            return False
        except SlurmError as exc:
            if exc.returncode is None:
                raise  # Slurm missing or no slurm.conf: a setup problem, not "controller down"
            return False
        return " is UP" in out
