"""Pure renderers for what the local cluster's machine and site have: slurm.conf and
the site's own hook scripts. hyperpod's part of Slurm's configuration is provisioning's
(localcluster/provisioned.py). No I/O here; ``files.py`` writes them."""

from __future__ import annotations

import shlex

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
        # The site's own scheduler settings: provisioning's include adds what hyperpod
        # needs (permit_job_expansion for step retry) to these.
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        f"MaxNodeCount={len(shape.all_names) + 8}",
        "TreeWidth=65533",
        f"PlugStackConfig={d}/etc/plugstack.conf",
        # The machine's own hooks, which provisioning keeps: a RebootProgram that fakes
        # a reboot, and per-node memory and progress roots on a shared /dev/shm.
        f"TaskProlog={d}/hooks/task_prolog.sh",
        f"RebootProgram={d}/hooks/reboot.sh",
        "ResumeTimeout=30",
        # Everything else hyperpod adds (JobSubmitPlugins, EpilogSlurmctld, Prolog,
        # HealthCheckProgram, permit_job_expansion) comes from provisioning's include,
        # appended below by `hyperpod local-cluster up` (localcluster/provisioned.py).
    ]
    if shape.site_hooks:
        lines += [
            f"HealthCheckProgram={d}/site/nhc.sh",
            "HealthCheckInterval=5",
            f"Prolog={d}/site/prolog.sh",
            f"EpilogSlurmctld={d}/site/epilog_ctld.sh",
            "JobSubmitPlugins=lua",
        ]
    # Spares too: LocalCluster.up drains them with scontrol before any slurmd registers,
    # as docs/manual-install.md declares them. A State=DRAIN line here would be applied
    # again by every reconfigure and slurmctld restart, to a spare in service as well.
    for name in shape.all_names:
        lines.append(_node_line(shape, name, "UNKNOWN"))
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


# A site's own job_submit.lua: it tags every job, so a drill sees it still runs.
SITE_COMMENT = "site-job-submit"
SITE_JOB_SUBMIT = f"""\
-- The site's own job_submit.lua (the local cluster's site_hooks).
function slurm_job_submit(job_desc, part_list, submit_uid)
  job_desc.comment = "{SITE_COMMENT}"
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""


def site_hook_sh(shape: Shape, hook: str) -> str:
    """A site's hook program: one line per run in DIR/log/site-<hook>.log."""
    log = shlex.quote(str(shape.dir / "log" / f"site-{hook}.log"))
    return (
        "#!/bin/sh\n"
        f'echo "$(date +%s.%N) job=${{SLURM_JOB_ID:-}} node=$(hostname)" >> {log}\n'
        "exit 0\n"
    )


SITE_HOOKS = ("nhc", "prolog", "epilog_ctld")
