"""Test-only hooks: exit abruptly at a named point of an action or a surgery, to prove
that a restarted (or the next leading) controller completes it exactly once. Never
set in production.

``HYPERPOD_TEST_CRASH_AT`` names the point: ``intent`` (committed, not applied) or
``applied`` (Slurm changed, not yet recorded), optionally for one kind only
(``applied:requeue``), or ``step_retry:<phase>`` (a surgery's Slurm step done, its
phase not yet written). ``HYPERPOD_TEST_CRASH_AFTER_INTENT=1`` is ``intent``.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

CRASH_ENV = "HYPERPOD_TEST_CRASH_AFTER_INTENT"
CRASH_AT_ENV = "HYPERPOD_TEST_CRASH_AT"


def crash_from_env(point: str) -> None:
    """Exit abruptly at ``point`` when the environment names it."""
    wanted = os.environ.get(CRASH_AT_ENV) or ("intent" if os.environ.get(CRASH_ENV) == "1" else "")
    if wanted and (point == wanted or point.startswith(wanted + ":")):
        log.critical("%s=%s: exiting abruptly", CRASH_AT_ENV, point)
        os._exit(137)
