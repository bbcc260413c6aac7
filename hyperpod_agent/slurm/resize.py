"""Shrinking a running job and merging a replacement node into it: the Slurm calls an
in-allocation step retry needs (the job keeps its id and never leaves RUNNING).

The recipe, verified on Slurm 22.05 with ``SchedulerParameters=permit_job_expansion``:

1. ``scontrol update jobid=J NodeList=<the nodes it keeps>`` releases the others;
2. ``salloc --no-shell -N1 -w <spare> --dependency=expand:J`` makes a helper allocation
   on the replacement (an allocation without steps: a ``sbatch --wrap`` helper cannot
   be merged, "Job step already exists");
3. ``scontrol update jobid=<helper> NumNodes=0`` hands the helper's node over, and
   ``scontrol update jobid=J NumNodes=ALL`` takes it. The last prints "Unexpected
   message received for job J" and exits 1, yet the job holds the node: the caller
   reads the job back to know.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from hyperpod_agent.errors import SlurmError, SlurmTimeout
from hyperpod_agent.slurm._common import check_job
from hyperpod_agent.slurm.hostlist import compress_hostlist
from hyperpod_agent.slurm.maint import SlurmCalls, check_name

log = logging.getLogger(__name__)

_GRANTED = re.compile(r"Granted job allocation (\d+)")
_PENDING = re.compile(r"Pending job allocation (\d+)")
# what 22.05's scontrol prints when NumNodes=ALL took the helper's nodes
_ABSORBED_NOISE = "Unexpected message received"
EXPAND_PREFIX = "hyperpod-expand-"
# A helper's whole name, ASCII digits only: any user may name a job like ours, and
# str.isdigit() is true for '²' (which int() refuses). The owner is checked too.
EXPAND_NAME = re.compile(r"hyperpod-expand-([0-9]{1,10})", re.ASCII)
ABSORB_WAIT_S = 0.3


def expansion_parent(name: str) -> int | None:
    """The job id a helper allocation named ``name`` expands; None for any other name."""
    found = EXPAND_NAME.fullmatch(name)
    return int(found.group(1)) if found else None


class ResizeCalls(SlurmCalls):
    """Job shrink and expansion, mixed into SlurmClient."""

    def shrink_job(self, job_id: int, keep: Sequence[str]) -> None:
        """Release every node of running job ``job_id`` but ``keep``."""
        names = [check_name(n, "node name") for n in keep]
        if not names:
            raise SlurmError(["scontrol", "update"], None, "", "a job keeps at least one node")
        jid = check_job(job_id)
        hostlist = compress_hostlist(names)
        argv = ["scontrol", "update", f"jobid={jid}", f"NodeList={hostlist}"]
        self._change(argv, "shrink", f"job {jid}", hostlist)

    def allocate_expansion(
        self, job_id: int, node: str, wait_s: int, reservation: str | None = None
    ) -> int:
        """A helper allocation of ``node`` that may be merged into ``job_id`` (inside
        ``reservation`` when the node is held in one); its job id. Gives up after
        ``wait_s`` seconds when the node is not free (SlurmError)."""
        jid = check_job(job_id)
        argv = [
            "salloc", "--no-shell", "-N1", f"--nodelist={check_name(node, 'node name')}",
            f"--immediate={max(int(wait_s), 1)}", f"--dependency=expand:{jid}",
            f"--job-name={EXPAND_PREFIX}{jid}",
        ]  # fmt: skip
        if reservation:
            argv.append(f"--reservation={check_name(reservation)}")
        proc = self._exec(argv, float(wait_s) + 15.0)
        out = f"{proc.stdout}\n{proc.stderr}"
        rc = proc.returncode
        granted = _GRANTED.search(out)
        if rc != 0 or granted is None:
            pending = _PENDING.search(out)
            extra = f" (helper job {pending.group(1)} was pending)" if pending else ""
            raise SlurmError(argv, rc, out.strip(), f"no expansion on {node} for job {jid}{extra}")
        helper = int(granted.group(1))
        log.info("slurm expansion for job %s: helper job %d on %s", jid, helper, node)
        return helper

    def absorb_expansion(self, job_id: int, helper_id: int) -> None:
        """Merge helper allocation ``helper_id`` into ``job_id``. 'Unexpected message'
        exits are Slurm's noise (seen on the second update): the caller reads the job
        back to confirm it holds the node."""
        jid, hid = check_job(job_id), check_job(helper_id)
        for argv, what, target in (
            (["scontrol", "update", f"jobid={hid}", "NumNodes=0"], "release", f"job {hid}"),
            (["scontrol", "update", f"jobid={jid}", "NumNodes=ALL"], "expand", f"job {jid}"),
        ):
            # After merging, 22.05's scontrol looks the new size up and waits for an
            # answer that never comes, until MessageTimeout (10 s by default): the merge
            # is done by then, so that command is not waited for past ABSORB_WAIT_S.
            wait = ABSORB_WAIT_S if what == "expand" else None
            try:
                self._run(argv, wait)
            except SlurmTimeout:
                log.info("slurm %s %s: not waited for past %g s", what, target, ABSORB_WAIT_S)
            except SlurmError as exc:
                if _ABSORBED_NOISE not in exc.stderr:
                    raise
                log.info("slurm %s %s: %s (Slurm's noise)", what, target, _ABSORBED_NOISE)
            else:
                log.info("slurm %s %s", what, target)
