"""Test-only hooks: exit abruptly at a named point of an action or a surgery, to prove
that a restarted (or the next leading) controller completes it exactly once. Never
set in production.

``HYPERPOD_TEST_CRASH_AT`` names the point: ``intent`` (committed, not applied) or
``applied`` (Slurm changed, not yet recorded), optionally for one kind only
(``applied:requeue``), or ``step_retry:<phase>`` (a surgery's Slurm step done, its
phase not yet written). ``HYPERPOD_TEST_CRASH_AFTER_INTENT=1`` is ``intent``.

``HYPERPOD_TEST_PAUSE_AT`` names a point where the process instead stops itself
(SIGSTOP), once, as a long GC pause or a frozen VM would: the fencing drills continue
it (SIGCONT) after another controller took over, the human-drain drills after acting
as an admin would in that window. Several points, comma-separated, stop once each.
Besides the points above:

- ``lease_checked``: a pass just past its lease check;
- ``deep_check:reserve``: a check's reservation made, its phase not yet written;
- ``deep_check:escalate``: a re-entry check's failure recorded and its node held,
  the node's replacement not yet planned;
- ``came_back:<kind>`` (``came_back:replace``): a provider's replacement seen
  complete (the node registered again), the node not yet resumed;
- ``step_retry:salloc``: inside the wait for the spare, in the worker thread that
  runs ``salloc``: the helper allocation granted, its job id not yet handed back to
  the surgery (which has written nothing about it);
- ``step_retry:rollback``: a rollback's helper allocations cancelled and the spare
  read, the spare not yet drained back to the pool nor its reservation deleted.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

CRASH_ENV = "HYPERPOD_TEST_CRASH_AFTER_INTENT"
CRASH_AT_ENV = "HYPERPOD_TEST_CRASH_AT"
PAUSE_AT_ENV = "HYPERPOD_TEST_PAUSE_AT"
_paused: set[str] = set()


def crash_from_env(point: str) -> None:
    """Exit abruptly at ``point`` when the environment names it."""
    wanted = os.environ.get(CRASH_AT_ENV) or ("intent" if os.environ.get(CRASH_ENV) == "1" else "")
    if wanted and (point == wanted or point.startswith(wanted + ":")):
        log.critical("%s=%s: exiting abruptly", CRASH_AT_ENV, point)
        os._exit(137)
    for listed in os.environ.get(PAUSE_AT_ENV, "").split(","):
        pause = listed.strip()
        if pause and (point == pause or point.startswith(pause + ":")) and pause not in _paused:
            _paused.add(pause)
            _stop_here(point)
            return


def _stop_here(point: str) -> None:
    log.critical("%s=%s: stopping until continued (pid %d)", PAUSE_AT_ENV, point, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
    # Sent to this thread, not the process: the thread at the point is the one that
    # stops first, before it runs another line (the others stop with it).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    log.critical("%s=%s: continued", PAUSE_AT_ENV, point)
