"""Pure renderers of hyperpod's part of Slurm's configuration: the slurm.conf include,
the hook programs it names, and job_submit.lua. Each is rendered from the parameters
*and* what the site's slurm.conf already sets (site.py), so a site's hooks keep
running. No I/O here; the steps in slurm_steps.py read the site and write.
"""

from __future__ import annotations

import shlex

from hyperpod_agent.provision import site as site_conf
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.models import ProvisioningParameters
from hyperpod_agent.provision.render import HEADER
from hyperpod_agent.provision.site import SiteSlurm
from hyperpod_agent.provision.steps import StepError

# A job_submit.lua carrying this line is ours to replace; any other one is the site's,
# and gets our function chained in front of its own (JOB_SUBMIT_CHAIN).
JOB_SUBMIT_MARKER = "Installed by hyperpod"
_COPY_AUTO_RESUME = """\
  if job_desc.spank_job_env ~= nil then
    local value = nil
    for _, entry in pairs(job_desc.spank_job_env) do
      local m = string.match(entry, "^AUTO_RESUME=(%d+)$")
      if m ~= nil then value = m end
    end
    if value ~= nil then
      job_desc.admin_comment = "auto_resume=" .. value
    end
  end
"""
JOB_SUBMIT = f"""\
-- {JOB_SUBMIT_MARKER}: copy the --auto-resume value that the SPANK plugin put
-- in the job-control environment into admin_comment, where the controller reads
-- it. Users cannot change admin_comment and it survives requeue.
function slurm_job_submit(job_desc, part_list, submit_uid)
{_COPY_AUTO_RESUME}  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""
# Appended (between markers) to a site's own job_submit.lua: ours runs first, then the
# site's function, whose answer stands. A re-run replaces the block, so the site's
# function is captured again, never our wrapper of it.
JOB_SUBMIT_CHAIN = f"""\
local hyperpod_site_job_submit = slurm_job_submit
function slurm_job_submit(job_desc, part_list, submit_uid)
{_COPY_AUTO_RESUME}  if hyperpod_site_job_submit ~= nil then
    return hyperpod_site_job_submit(job_desc, part_list, submit_uid)
  end
  return slurm.SUCCESS
end
"""

# Step retry grows a running job (permit_job_expansion, DESIGN §4). A job whose node
# fails our Prolog gate is requeued, not held (nohold_on_prolog_fail), so auto-resume
# brings it back without an admin's release.
SCHEDULER_PARAMETERS = ["permit_job_expansion", "nohold_on_prolog_fail"]
_PLUGIN_ALIASES = {"job_submit/lua": "lua"}


def hyperpod_conf(params: ProvisioningParameters, layout: Layout, site: SiteSlurm) -> str:
    """The slurm.conf include. Slurm takes a setting's last value and the include is
    at the end of slurm.conf, so every list keeps the site's items and every program
    the site had runs from our wrapper."""
    s = params.slurm
    if s.configless:
        _refuse_node_hooks(layout, site)
    lines = [
        f"# {HEADER}",
        # Merged with the site's own SchedulerParameters, which this line replaces.
        "SchedulerParameters="
        + site_conf.merged_list(site.get("SchedulerParameters"), SCHEDULER_PARAMETERS, {}),
        f"HealthCheckProgram={layout.libexec / 'health-check'}",
    ]
    interval_named = "health_check_interval" in s.model_fields_set
    if interval_named or site.get("HealthCheckInterval") is None:
        lines.append(f"HealthCheckInterval={s.health_check_interval}")
    if site.get("HealthCheckNodeState") is None:
        lines.append("HealthCheckNodeState=ANY")
    named = "reboot_program" in s.model_fields_set
    reboot = site_conf.reboot_program(site, s.reboot_program, named)
    if reboot is not None:
        lines.append(f"RebootProgram={reboot}")
    lines += [
        # job_submit.lua (next to slurm.conf) copies --auto-resume into admin_comment.
        "JobSubmitPlugins="
        + site_conf.merged_list(site.get("JobSubmitPlugins"), ["lua"], _PLUGIN_ALIASES),
        f"EpilogSlurmctld={layout.libexec / 'epilog-slurmctld'}",
        f"Prolog={layout.libexec / 'prolog'}",
    ]
    if s.cred_expire is not None:
        # A requeued job waits cred_expire + 1 s before it may start again (DESIGN §4).
        # AuthInfo is one setting: the site's other items (socket=...) are kept.
        items = [
            i
            for i in (site.get("AuthInfo") or "").split(",")
            if i.strip() and not i.strip().startswith("cred_expire=")
        ]
        lines.append("AuthInfo=" + ",".join([*items, f"cred_expire={s.cred_expire}"]))
    return "\n".join(lines) + "\n"


def _refuse_node_hooks(layout: Layout, site: SiteSlurm) -> None:
    """Configless nodes have no slurm.conf, so their wrappers cannot chain a site's
    node-side program: refuse rather than silently stop running it."""
    for key, name in (("HealthCheckProgram", "health-check"), ("Prolog", "prolog")):
        theirs = site_conf.chained(site, key, layout.libexec / name)
        if theirs:
            raise StepError(
                f"slurm.conf sets {key}={theirs[0]}; with slurm.configless the nodes' "
                f"hyperpod {name} wrapper cannot run it: call it from your own program "
                "(or run it as an agent script probe) and remove the setting"
            )


def _hyperpod(layout: Layout, *args: str) -> str:
    return shlex.join([str(layout.hyperpod_bin), *args])


def health_check_script(layout: Layout, site: SiteSlurm) -> str:
    """HealthCheckProgram takes no arguments, so a wrapper supplies them. slurmd
    ignores its exit status: the site's check (NHC drains nodes itself) runs first,
    then ours, which reads the agent's verdict; draining stays the controller's."""
    ours = layout.libexec / "health-check"
    chain = site_conf.chain_lines(
        site_conf.chained(site, "HealthCheckProgram", ours), "HealthCheckProgram", False
    )
    check = _hyperpod(layout, "health-check", "--config", str(layout.etc / "agent.toml"))
    return f"#!/bin/sh\n# {HEADER}\n{chain}exec {check}\n"


def prolog_script(layout: Layout, site: SiteSlurm) -> str:
    """Prolog: the site's prologs first (a failure stands), then the gate that keeps a
    new job off a node whose agent has an urgent fault (``health-check --prolog``)."""
    ours = layout.libexec / "prolog"
    chain = site_conf.chain_lines(site_conf.chained(site, "Prolog", ours), "Prolog", True)
    agent = layout.etc / "agent.toml"
    gate = _hyperpod(layout, "health-check", "--prolog", "--config", str(agent))
    return f"#!/bin/sh\n# {HEADER}\n{chain}exec {gate}\n"


def epilog_script(layout: Layout, site: SiteSlurm) -> str:
    """EpilogSlurmctld (runs as SlurmUser): the site's epilogs, one line per finished
    job, and the controller told at once so an auto-resume job is requeued without
    waiting for a pass. ``notify-end`` always exits within about 2 s; nothing here
    fails the job."""
    ours = layout.libexec / "epilog-slurmctld"
    chain = site_conf.chain_lines(
        site_conf.chained(site, "EpilogSlurmctld", ours), "EpilogSlurmctld", False
    )
    log = shlex.quote(str(layout.log_dir / "job_end.log"))
    admin = layout.etc / "admin.toml"
    notify = _hyperpod(layout, "jobs", "notify-end", "--config", str(admin))
    return (
        f"#!/bin/sh\n# {HEADER}\n{chain}"
        "printf '%s job=%s auto_resume=%s exit=%s\\n' \"$(date +%s.%N)\" "
        f'"$SLURM_JOB_ID" "${{SPANK_AUTO_RESUME:-}}" "${{SLURM_JOB_EXIT_CODE2:-}}" '
        f">> {log} 2>/dev/null\n"
        # notify-end itself always exits 0: a failure here is the log's redirection
        # (a log directory SlurmUser may not write), so notify without the log.
        f"{notify} 2>> {log} || {notify} 2>/dev/null\n"
        "exit 0\n"
    )
