"""Pure renderers for the local cluster's files: slurm.conf, plugstack.conf and the
hook scripts (job_submit.lua is provisioning's own). No I/O here; ``files.py`` writes
them."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from hyperpod_agent.localcluster.shape import Shape

SPARE_REASON = "hyperpod:spare"
PARTITION = "main"


def slurm_conf(shape: Shape, ctl_host: str) -> str:
    d = shape.dir
    lines = [
        "# Written by `hyperpod local-cluster up`; edits are lost on the next start.",
        "ClusterName=hyperpod-local",
        f"SlurmctldHost={ctl_host}(127.0.0.1)",
        f"SlurmctldPort={shape.port_base}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={shape.munge_socket},cred_expire={shape.cred_expire}",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/spool/slurmctld.pid",
        f"SlurmdPidFile={d}/spool/%n/slurmd.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # One machine, no systemd or cgroups inside the nodes.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d}/log/jobcomp.txt",
        # Fast failure detection and recovery (see docs/local-cluster.md for timings).
        "ReturnToService=2",
        f"SlurmdTimeout={shape.slurmd_timeout}",
        f"MessageTimeout={shape.message_timeout}",
        "SlurmctldTimeout=10",
        "TCPTimeout=2",
        "KillWait=5",
        "BatchStartTimeout=10",
        "MinJobAge=600",
        "SchedulerParameters=sched_interval=2,bf_interval=2,permit_job_expansion",
        f"MaxNodeCount={len(shape.all_names) + 8}",
        "TreeWidth=65533",
        f"PlugStackConfig={d}/etc/plugstack.conf",
        "JobSubmitPlugins=lua",
        f"EpilogSlurmctld={d}/hooks/epilog_ctld.sh",
        f"TaskProlog={d}/hooks/task_prolog.sh",
        f"RebootProgram={d}/hooks/reboot.sh",
        "ResumeTimeout=30",
    ]
    for name in shape.node_names:
        lines.append(_node_line(shape, name, "UNKNOWN"))
    for name in shape.spare_names:
        # Spares are defined and running but kept out of service until the
        # controller resumes one (the spare_pool provider).
        lines.append(_node_line(shape, name, f'DRAIN Reason="{SPARE_REASON}"'))
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(shape.all_names)} Default=YES "
        "MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def _node_line(shape: Shape, name: str, state: str) -> str:
    return (
        f"NodeName={name} NodeAddr=127.0.0.1 Port={shape.node_port(name)} "
        f"CPUs={shape.cpus_per_node} RealMemory={shape.mem_mb_per_node} State={state}"
    )


def plugstack_conf(shape: Shape, services: bool = False) -> str:
    d = shape.dir
    # 'required': a plugin that fails to load makes sbatch/srun/slurmd fail loudly
    # instead of silently losing --auto-resume. Each node has its own progress and
    # memory roots (%n: the node's host name, as in task_prolog_sh), where slurmstepd
    # makes every job's directories for the job's user.
    line = (
        f"required {d}/lib/auto_resume.so statedir={d}/autoresume "
        f"progress_root={shape.progress_root}/%n memory_root={shape.memory_root}/%n "
        f"checkpoint_root={d}/checkpoints"
    )
    if services:
        # With a controller to ask: an srun --auto-resume inside a job hands itself over
        # to the hyperpod command of the Python that runs the cluster (its venv).
        line += f" step_helper={Path(sys.executable).parent / 'hyperpod'}"
    return line + "\n"


def reboot_sh(shape: Shape, python: str) -> str:
    """RebootProgram: runs on the node (hostname = node name) as a child of its
    slurmd and must return at once, so the restart is detached."""
    cmd = " ".join(
        shlex.quote(a)
        for a in [
            python,
            "-m",
            "hyperpod_agent",
            "local-cluster",
            "node-reboot",
            "--dir",
            str(shape.dir),
        ]
    )
    log = shlex.quote(str(shape.dir / "log" / "reboot.log"))
    return (
        "#!/bin/sh\n"
        "node=$(hostname)\n"
        f'echo "$(date +%s.%N) reboot requested for $node" >> {log}\n'
        # Leave the node's UTS and time namespaces: the restart belongs to the host,
        # and /proc start times read inside a rebooted node's time namespace differ.
        f"setsid nsenter --uts={shlex.quote(str(shape.dir / 'run' / 'host-uts'))} "
        f"--time={shlex.quote(str(shape.dir / 'run' / 'host-time'))} "
        f'{cmd} "$node" >> {log} 2>&1 < /dev/null &\n'
        "exit 0\n"
    )


def task_prolog_sh(shape: Shape) -> str:
    """TaskProlog: every fake node shares this machine's /dev/shm, so give each node
    its own checkpoint memory tier and progress records, as separate hosts would have.
    A value under our own roots came from another node (srun inside a batch script
    passes the batch step's environment on): it is rewritten for this node; a value
    the user chose elsewhere wins."""
    root = shlex.quote(str(shape.memory_root))
    progress = shlex.quote(str(shape.progress_root))
    return (
        "#!/bin/sh\n"
        'case "$HYPERPOD_CHECKPOINT_MEMORY_DIR" in\n'
        f'  ""|{root}/*)\n'
        f'    echo "export HYPERPOD_CHECKPOINT_MEMORY_DIR={root}/$(hostname)/$SLURM_JOB_ID" ;;\n'
        "esac\n"
        'case "$HYPERPOD_PROGRESS_DIR" in\n'
        f'  ""|{progress}/*) echo "export HYPERPOD_PROGRESS_DIR={progress}/$(hostname)" ;;\n'
        "esac\n"
        "exit 0\n"
    )


def epilog_ctld_sh(shape: Shape, python: str) -> str:
    """EpilogSlurmctld: log the job's end and tell the controller at once (when the
    services run), so an auto-resume job is requeued without waiting for a pass.
    ``hyperpod jobs notify-end`` always exits 0 within ~2 s: an epilog must not hang."""
    log = shlex.quote(str(shape.dir / "log" / "job_end.log"))
    admin = shape.dir / "etc" / "admin.toml"
    notify = " ".join(
        shlex.quote(a)
        for a in [python, "-m", "hyperpod_agent", "jobs", "notify-end", "--config", str(admin)]
    )
    return (
        "#!/bin/sh\n"
        f"printf '%s job=%s auto_resume=%s exit=%s derived=%s\\n' \"$(date +%s.%N)\" "
        '"$SLURM_JOB_ID" "${SPANK_AUTO_RESUME:-}" "${SLURM_JOB_EXIT_CODE2:-}" '
        f'"${{SLURM_JOB_DERIVED_EC:-}}" >> {log}\n'
        f"if [ -f {shlex.quote(str(admin))} ]; then {notify} 2>> {log} || true; fi\n"
        "exit 0\n"
    )
