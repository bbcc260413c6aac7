"""The state database's schema, as an ordered list of migrations."""

from __future__ import annotations

# Ordered; index + 1 is the schema version after applying the entry. Never edit a
# released entry: append a new one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY, agent_id TEXT, seq INTEGER, generated_at REAL,
        received_at REAL, verdict TEXT, report TEXT,
        hb_agent_id TEXT, hb_seq INTEGER, heartbeat_at REAL);
    CREATE TABLE faults (
        id INTEGER PRIMARY KEY, node TEXT NOT NULL, component TEXT NOT NULL,
        code TEXT NOT NULL, severity TEXT NOT NULL, action TEXT NOT NULL,
        urgent INTEGER NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL,
        count INTEGER NOT NULL, message TEXT NOT NULL, closed_at REAL);
    CREATE INDEX faults_open ON faults(node) WHERE closed_at IS NULL;
    CREATE INDEX faults_seen ON faults(first_seen);
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL, node TEXT, job_id INTEGER,
        reason TEXT NOT NULL, cause TEXT NOT NULL, params TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL, updated_at REAL NOT NULL,
        next_attempt_at REAL NOT NULL, error TEXT NOT NULL DEFAULT '');
    CREATE INDEX actions_open ON actions(state);
    CREATE INDEX actions_node ON actions(node, kind, updated_at);
    CREATE TABLE jobs (
        job_id INTEGER PRIMARY KEY, cap INTEGER NOT NULL, attempts INTEGER NOT NULL,
        last_cause TEXT NOT NULL, state TEXT NOT NULL, last_requeue_at REAL,
        acted_restart_count INTEGER, resumed_from_step INTEGER, updated_at REAL NOT NULL);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
        node TEXT, job_id INTEGER, cause TEXT NOT NULL, message TEXT NOT NULL);
    CREATE INDEX events_node ON events(node, id);
    """,
    # 2: keep the opted-in jobs apart from the report so a pass need not parse reports.
    """
    ALTER TABLE nodes ADD COLUMN jobs_opted_in TEXT NOT NULL DEFAULT '{}';
    """,
    # 3: which probe reported a fault, so a probe that could not look (UNKNOWN) keeps
    # its faults open instead of closing them and reopening them as repeats.
    """
    ALTER TABLE faults ADD COLUMN probe TEXT NOT NULL DEFAULT '';
    """,
    # 4: training progress from the reports, and hangs/stragglers declared once each.
    """
    ALTER TABLE nodes ADD COLUMN progress TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE findings (
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL, job_id INTEGER NOT NULL,
        restart_count INTEGER NOT NULL, node TEXT NOT NULL DEFAULT '',
        step INTEGER NOT NULL DEFAULT -1, detail TEXT NOT NULL, at REAL NOT NULL);
    CREATE UNIQUE INDEX findings_key ON findings(kind, job_id, restart_count, node, step);
    CREATE INDEX findings_at ON findings(at);
    """,
    # 5: deep checks: one row per run (its phase is the intent log of the run's Slurm
    # steps) and one per node and run with the outcome.
    """
    CREATE TABLE deep_checks (
        id INTEGER PRIMARY KEY, nodes TEXT NOT NULL, level TEXT NOT NULL,
        purpose TEXT NOT NULL, phase TEXT NOT NULL, job_id INTEGER,
        prior TEXT NOT NULL, requested_by TEXT NOT NULL, drain_first INTEGER NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, deadline REAL,
        error TEXT NOT NULL DEFAULT '');
    CREATE INDEX deep_checks_phase ON deep_checks(phase);
    CREATE TABLE deep_check_results (
        run_id INTEGER NOT NULL, node TEXT NOT NULL, purpose TEXT NOT NULL,
        outcome TEXT NOT NULL, check_name TEXT NOT NULL, cause TEXT NOT NULL,
        ran INTEGER NOT NULL, detail TEXT NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (run_id, node));
    CREATE INDEX deep_check_results_node ON deep_check_results(node, at);
    """,
    # 6: leases with fencing tokens, so only the controller holding one writes intents.
    """
    CREATE TABLE leases (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL,
        expires_at REAL NOT NULL);
    """,
    # 7: when the lease's holder took it (its token changed), for ``/v1/status``.
    """
    ALTER TABLE leases ADD COLUMN since REAL NOT NULL DEFAULT 0;
    """,
    # 8: step retries inside the allocation: one row per surgery; its phase is the
    # intent log of the Slurm steps (drain, shrink, expand, absorb). One row per failed
    # attempt of a step, so a repeated request never counts a retry twice.
    """
    CREATE TABLE step_retries (
        id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, step_id TEXT NOT NULL,
        attempt INTEGER NOT NULL, budget INTEGER NOT NULL, phase TEXT NOT NULL,
        bad_node TEXT NOT NULL, spare TEXT NOT NULL, reason TEXT NOT NULL,
        keep TEXT NOT NULL, helper_id INTEGER, new_nodes TEXT NOT NULL DEFAULT '[]',
        outcome TEXT NOT NULL DEFAULT '', cause TEXT NOT NULL,
        rollback_from TEXT NOT NULL DEFAULT '', requested_by TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL);
    CREATE INDEX step_retries_phase ON step_retries(phase);
    CREATE UNIQUE INDEX step_retries_attempt ON step_retries(job_id, step_id, attempt);
    """,
    # 9: steps under watch: a step-retry helper renews its step's row while srun runs;
    # end_at is when the controller first told it to end the step (a node fault).
    """
    CREATE TABLE step_watches (
        job_id INTEGER NOT NULL, step_id TEXT NOT NULL, attempt INTEGER NOT NULL,
        expires_at REAL NOT NULL, end_at REAL, PRIMARY KEY (job_id, step_id));
    """,
    # 10: what Slurm said of a watched step's job when the watch began (its nodes, its
    # start), never what the helper said; a surgery keeps its job's owner, so a poll is
    # answered without Slurm once the job has left the controller's view.
    """
    ALTER TABLE step_watches ADD COLUMN nodes TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE step_watches ADD COLUMN began REAL NOT NULL DEFAULT 0;
    ALTER TABLE step_watches ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE step_retries ADD COLUMN owner_uid INTEGER;
    CREATE INDEX step_retries_job ON step_retries(job_id, id);
    """,
]
