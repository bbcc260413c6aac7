"""hyperpod's part of Slurm's configuration, merged with what the site already set."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from provision_support import base_params

from hyperpod_agent.provision import hooks
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisioningParameters
from hyperpod_agent.provision.site import SiteSlurm, merged_list, parse_site
from hyperpod_agent.provision.steps import BEGIN, END, StepError

PREFIX = Path("/p")


def params(**slurm: object) -> ProvisioningParameters:
    data = base_params()
    data["slurm"] = {**data.get("slurm", {}), **slurm}
    return parse_parameters(data, "params.json")


def lay(p: ProvisioningParameters | None = None) -> Layout:
    return Layout.for_params(p or params(), PREFIX)


SITE = f"""\
ClusterName=site   # comment
SchedulerParameters=bf_continue,sched_interval=30
JobSubmitPlugins="pbs"
RebootProgram=/usr/local/sbin/site-reboot
HealthCheckProgram=/usr/sbin/nhc
HealthCheckInterval=300
Prolog=/etc/slurm/prolog.sh
EpilogSlurmctld=/etc/slurm/epilog_ctld.sh
AuthInfo=socket=/run/munge/munge.socket.2,cred_expire=120
NodeName=n[1-4] CPUs=8 Prolog=/not/a/setting
PartitionName=main Nodes=ALL Default=YES

{BEGIN}
include /etc/slurm/hyperpod.conf
SchedulerParameters=ours_only
{END}
"""


def test_parse_site_reads_settings_outside_our_block() -> None:
    site = parse_site(SITE)
    assert site.get("schedulerparameters") == "bf_continue,sched_interval=30"
    assert site.get("JobSubmitPlugins") == "pbs"  # quotes removed, any case
    assert site.get("ClusterName") == "site"  # comment removed
    assert site.get("Prolog") == "/etc/slurm/prolog.sh"  # not the NodeName line's
    assert site.get("Missing") is None
    assert parse_site("Prolog=/a\nProlog=/b\n").all("prolog") == ["/a", "/b"]


def test_merged_list_keeps_the_site_order_and_adds_ours_once() -> None:
    assert merged_list("bf_continue,permit_job_expansion", ["permit_job_expansion", "x"], {}) == (
        "bf_continue,permit_job_expansion,x"
    )
    assert merged_list("job_submit/lua", ["lua"], {"job_submit/lua": "lua"}) == "job_submit/lua"
    assert merged_list(None, ["lua"], {}) == "lua"


def test_include_on_an_empty_site() -> None:
    text = hooks.hyperpod_conf(params(cred_expire=20, configless=False), lay(), SiteSlurm())
    assert text.splitlines()[1:] == [
        "SchedulerParameters=permit_job_expansion,nohold_on_prolog_fail",
        "HealthCheckProgram=/p/opt/hyperpod/libexec/health-check",
        "HealthCheckInterval=60",
        "HealthCheckNodeState=ANY",
        "RebootProgram=/usr/sbin/reboot",
        "JobSubmitPlugins=lua",
        "EpilogSlurmctld=/p/opt/hyperpod/libexec/epilog-slurmctld",
        "Prolog=/p/opt/hyperpod/libexec/prolog",
        "AuthInfo=cred_expire=20",
    ]


def test_include_merges_with_the_site() -> None:
    text = hooks.hyperpod_conf(params(cred_expire=20, configless=False), lay(), parse_site(SITE))
    assert text.splitlines()[1:] == [
        "SchedulerParameters=bf_continue,sched_interval=30,permit_job_expansion,"
        "nohold_on_prolog_fail",
        "HealthCheckProgram=/p/opt/hyperpod/libexec/health-check",
        # the site's interval and reboot program stand: the parameters did not name them
        "HealthCheckNodeState=ANY",
        "JobSubmitPlugins=pbs,lua",
        "EpilogSlurmctld=/p/opt/hyperpod/libexec/epilog-slurmctld",
        "Prolog=/p/opt/hyperpod/libexec/prolog",
        "AuthInfo=socket=/run/munge/munge.socket.2,cred_expire=20",
    ]


def test_a_reboot_program_named_twice_is_a_conflict() -> None:
    p = params(reboot_program="/usr/sbin/reboot", configless=False)
    with pytest.raises(StepError, match="RebootProgram=/usr/local/sbin/site-reboot and .*"):
        hooks.hyperpod_conf(p, lay(p), parse_site(SITE))
    same = params(reboot_program="/usr/local/sbin/site-reboot", configless=False)
    assert "RebootProgram" not in hooks.hyperpod_conf(same, lay(same), parse_site(SITE))


def test_configless_refuses_a_node_hook_its_nodes_cannot_chain() -> None:
    with pytest.raises(StepError, match=r"HealthCheckProgram=/usr/sbin/nhc; with slurm.configless"):
        hooks.hyperpod_conf(params(configless=True), lay(), parse_site(SITE))


def test_wrappers_run_the_site_programs_first() -> None:
    site = parse_site(SITE)
    health = hooks.health_check_script(lay(), site).splitlines()
    assert health[2] == "/usr/sbin/nhc || true  # the site's HealthCheckProgram"
    assert health[-1].startswith("exec /p/opt/hyperpod/venv/bin/hyperpod health-check --config")
    prolog = hooks.prolog_script(lay(), site).splitlines()
    assert prolog[2] == "/etc/slurm/prolog.sh || exit $?  # the site's Prolog"
    assert prolog[-1] == (
        "exec /p/opt/hyperpod/venv/bin/hyperpod health-check --prolog "
        "--config /p/etc/hyperpod/agent.toml"
    )
    epilog = hooks.epilog_script(lay(), site)
    assert "/etc/slurm/epilog_ctld.sh || true" in epilog
    assert "jobs notify-end --config /p/etc/hyperpod/admin.toml" in epilog


def test_a_wrapper_never_chains_itself() -> None:
    ours = SiteSlurm(
        {"prolog": "/p/opt/hyperpod/libexec/prolog"}, {"prolog": ["/p/opt/hyperpod/libexec/prolog"]}
    )
    assert "||" not in hooks.prolog_script(lay(), ours)


def _run(script: str, tmp_path: Path, site_rc: int) -> subprocess.CompletedProcess[str]:
    """Run a rendered wrapper with the site's program and ours replaced by stubs that
    record they ran."""
    log = tmp_path / "ran"
    site_prog = tmp_path / "site.sh"
    site_prog.write_text(f"#!/bin/sh\necho site >> {log}\nexit {site_rc}\n")
    site_prog.chmod(0o755)
    hyperpod = tmp_path / "hyperpod"
    hyperpod.write_text(f'#!/bin/sh\necho "hyperpod $*" >> {log}\nexit 0\n')
    hyperpod.chmod(0o755)
    text = script.replace("/etc/slurm/prolog.sh", str(site_prog))
    text = text.replace("/usr/sbin/nhc", str(site_prog))
    text = text.replace("/etc/slurm/epilog_ctld.sh", str(site_prog))
    text = text.replace("/p/opt/hyperpod/venv/bin/hyperpod", str(hyperpod))
    text = text.replace("/p/var/log/hyperpod", str(tmp_path))
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(text)
    wrapper.chmod(0o755)
    return subprocess.run([str(wrapper)], capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("site_rc", [0, 3])
def test_a_failing_site_prolog_still_fails_the_job(tmp_path: Path, site_rc: int) -> None:
    proc = _run(hooks.prolog_script(lay(), parse_site(SITE)), tmp_path, site_rc)
    ran = (tmp_path / "ran").read_text().splitlines()
    assert proc.returncode == site_rc
    assert ran[0] == "site"
    assert ("hyperpod health-check --prolog" in " ".join(ran)) == (site_rc == 0)


@pytest.mark.parametrize("site_rc", [0, 3])
def test_epilog_and_health_check_run_ours_whatever_the_site_said(
    tmp_path: Path, site_rc: int
) -> None:
    for script, ours in (
        (hooks.epilog_script(lay(), parse_site(SITE)), "hyperpod jobs notify-end"),
        (hooks.health_check_script(lay(), parse_site(SITE)), "hyperpod health-check --config"),
    ):
        (tmp_path / "ran").unlink(missing_ok=True)
        proc = _run(script, tmp_path, site_rc)
        ran = (tmp_path / "ran").read_text().splitlines()
        assert ran[0] == "site" and ran[1].startswith(ours), ran
        assert proc.returncode == 0


def test_epilog_notifies_even_when_its_log_is_not_writable(tmp_path: Path) -> None:
    script = hooks.epilog_script(lay(), SiteSlurm())
    script = script.replace("/p/var/log/hyperpod/job_end.log", "/proc/no/such/job_end.log")
    proc = _run(script, tmp_path, 0)
    assert proc.returncode == 0
    assert (tmp_path / "ran").read_text().count("jobs notify-end") == 1
