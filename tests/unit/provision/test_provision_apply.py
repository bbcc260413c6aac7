"""Plans for each role applied under a temporary prefix: exactly what is written, and
that a second run, a dry run and a failed run behave."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path
from typing import Any

import pytest
from provision_support import (
    AGENT_UNIT,
    CONTROLLER_UNIT,
    PLUGIN_BYTES,
    Healthz,
    base_params,
    tree,
)

from hyperpod_agent.provision import hooks
from hyperpod_agent.provision.apply import Retry, apply_plan, with_retry
from hyperpod_agent.provision.commands import Mount, SystemdEnable
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisionError, StepFailed
from hyperpod_agent.provision.plan import Options, build_plan
from hyperpod_agent.provision.steps import (
    BEGIN,
    END,
    Change,
    Context,
    ManagedBlock,
    Step,
    StepError,
)

DIRS = {
    "etc": "dir 0755",
    "etc/hyperpod": "dir 0755",
    "etc/slurm": "dir 0755",
    "opt": "dir 0755",
    "opt/hyperpod": "dir 0755",
    "opt/hyperpod/lib": "dir 0755",
    "opt/hyperpod/libexec": "dir 0755",
    "run": "dir 0755",
    "run/hyperpod": "dir 0755",
    "var": "dir 0755",
    "var/lib": "dir 0755",
    "var/lib/hyperpod": "dir 0750",
    "var/lib/hyperpod/autoresume": "dir 0755",
    "var/log": "dir 0755",
    "var/log/hyperpod": "dir 0755",
    "var/log/hyperpod/.provision.lock": "file 0600",
    "var/log/hyperpod/provision.log": "file 0644",
    "opt/hyperpod/lib/auto_resume.so": "file 0755",
    "opt/hyperpod/libexec/health-check": "file 0755",
    "opt/hyperpod/libexec/prolog": "file 0755",
    "etc/slurm/plugstack.conf": "file 0644",
}
WANTS = "etc/systemd/system/multi-user.target.wants"
UNIT_DIRS = {
    "etc/systemd": "dir 0755",
    "etc/systemd/system": "dir 0755",
    "etc/systemd/system/multi-user.target.wants": "dir 0755",
}


@pytest.fixture(autouse=True)
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def plan_for(data: dict[str, Any], node: str, prefix: Path, source: Path, **kw: Any) -> Any:
    params = parse_parameters(data, "params.json")
    return build_plan(params, node, Options(prefix=prefix, source=source, skip_install=True, **kw))


def changed_names(result: Any) -> list[str]:
    return [o.name for o in result.changed]


# --- worker -------------------------------------------------------------------------------


def test_worker_writes_exactly_its_files(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    result = apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    assert tree(prefix) == {
        **DIRS,
        **UNIT_DIRS,
        "etc/hyperpod/agent.toml": "file 0644",
        # the step-retry helper of a job's srun --auto-resume finds the controller here
        "etc/hyperpod/admin.toml": "file 0644",
        "etc/systemd/system/hyperpod-agent.service": "file 0644",
        "etc/systemd/system/hyperpod-agent.service.d": "dir 0755",
        "etc/systemd/system/hyperpod-agent.service.d/provision.conf": "file 0644",
        f"{WANTS}/hyperpod-agent.service": "link -> ../hyperpod-agent.service",
    }
    assert result.summary() == "node1: worker (group gpu): 17 of 18 steps changed"
    agent = (prefix / "etc/hyperpod/agent.toml").read_text()
    assert f'cache_path = "{prefix}/run/hyperpod/health.json"' in agent
    assert 'node_name = "node1"' in agent and "expected_count = 8" in agent
    assert (prefix / "etc/systemd/system/hyperpod-agent.service").read_text() == AGENT_UNIT
    dropin = prefix / "etc/systemd/system/hyperpod-agent.service.d/provision.conf"
    assert dropin.read_text().splitlines()[1:] == [
        "[Service]",
        "ExecStart=",
        f"ExecStart={prefix}/opt/hyperpod/venv/bin/hyperpod-agent --config "
        f"{prefix}/etc/hyperpod/agent.toml",
    ]
    assert (prefix / "opt/hyperpod/lib/auto_resume.so").read_bytes() == PLUGIN_BYTES
    assert (prefix / "etc/slurm/plugstack.conf").read_text() == (
        f"{BEGIN}\nrequired {prefix}/opt/hyperpod/lib/auto_resume.so "
        f"statedir={prefix}/var/lib/hyperpod/autoresume "
        f"step_helper={prefix}/opt/hyperpod/venv/bin/hyperpod "
        "progress_root=/dev/shm/hyperpod-progress memory_root=/dev/shm/hyperpod-ckpt "
        f"checkpoint_root=/fsx/ckpt\n{END}\n"
    )
    log = (prefix / "var/log/hyperpod/provision.log").read_text()
    assert "provisioning node1 as worker (group gpu)" in log
    assert "17 of 18 steps changed" in log


def test_second_run_changes_nothing(params: dict[str, Any], prefix: Path, source: Path) -> None:
    apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    before = {p: p.stat().st_mtime_ns for p in prefix.rglob("*") if not p.is_symlink()}
    again = apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    assert again.changed == []
    assert again.summary() == "node1: worker (group gpu): no changes (18 steps already as desired)"
    after = {p: p.stat().st_mtime_ns for p in prefix.rglob("*") if not p.is_symlink()}
    changed = {p for p in before if before[p] != after[p]}
    assert changed <= {prefix / "var/log/hyperpod/provision.log", prefix / "var/log/hyperpod"}


def test_dry_run_writes_nothing(params: dict[str, Any], prefix: Path, source: Path) -> None:
    result = apply_plan(plan_for(params, "node1", prefix, source), dry_run=True)
    assert not prefix.exists()
    assert not (source / "spank_plugin/auto_resume.so").exists()
    assert len(result.changed) == 17
    assert all(o.status == "would change" for o in result.changed)
    agent = next(o for o in result.outcomes if o.name.endswith("agent.toml"))
    assert agent.change is not None and '+node_name = "node1"' in agent.change.diff


def test_dry_run_after_a_change_shows_a_diff(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    params["worker_groups"][0]["expected_gpus"] = 4
    result = apply_plan(plan_for(params, "node1", prefix, source), dry_run=True)
    (only,) = result.changed
    assert only.name == f"file {prefix}/etc/hyperpod/agent.toml"
    assert only.change is not None
    assert "-expected_count = 8\n+expected_count = 4" in only.change.diff
    assert "expected_count = 8" in (prefix / "etc/hyperpod/agent.toml").read_text()


def test_mode_drift_is_repaired(params: dict[str, Any], prefix: Path, source: Path) -> None:
    apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    os.chmod(prefix / "etc/hyperpod/agent.toml", 0o600)
    result = apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    (only,) = result.changed
    assert only.change == Change("mode 0600 -> 0644")
    assert tree(prefix)["etc/hyperpod/agent.toml"] == "file 0644"


def test_plugin_rebuilt_when_its_source_changes(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    src = source / "spank_plugin/auto_resume.c"
    src.write_bytes(b"v2\n")
    built = source / "spank_plugin/auto_resume.so"  # older than its source, whatever the clock
    os.utime(built, ns=(src.stat().st_mtime_ns - 10**10,) * 2)
    result = apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    assert changed_names(result) == [
        f"build {source}/spank_plugin",
        f"file {prefix}/opt/hyperpod/lib/auto_resume.so",
    ]
    assert (prefix / "opt/hyperpod/lib/auto_resume.so").read_bytes() == b"v2\n"


def test_spare_worker_role(params: dict[str, Any], prefix: Path, source: Path) -> None:
    plan = plan_for(params, "node5", prefix, source)
    assert str(plan.role) == "worker (group gpu, spare)"


# --- controller and login -----------------------------------------------------------------


def test_controller_writes_exactly_its_files(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    (prefix / "etc/slurm").mkdir(parents=True)
    (prefix / "etc/slurm/slurm.conf").write_text("ClusterName=test\nJobSubmitPlugins=\n")
    os.chmod(prefix / "etc/slurm/slurm.conf", 0o640)
    result = apply_plan(plan_for(params, "head", prefix, source), verify=False)
    assert tree(prefix) == {
        **DIRS,
        **UNIT_DIRS,
        "etc/slurm/slurm.conf": "file 0640",
        "etc/slurm/hyperpod.conf": "file 0644",
        "etc/slurm/job_submit.lua": "file 0644",
        "opt/hyperpod/libexec/epilog-slurmctld": "file 0755",
        "etc/hyperpod/controller.toml": "file 0640",
        "etc/hyperpod/admin.toml": "file 0644",
        "etc/systemd/system/hyperpod-controller.service": "file 0644",
        "etc/systemd/system/hyperpod-controller.service.d": "dir 0755",
        "etc/systemd/system/hyperpod-controller.service.d/provision.conf": "file 0644",
        f"{WANTS}/hyperpod-controller.service": "link -> ../hyperpod-controller.service",
    }
    unchanged = [o.name for o in result.outcomes if o.status == "unchanged"]
    assert unchanged == [
        f"directory {prefix}/etc/slurm",
        f"block in {prefix}/etc/fstab",
        f"site {prefix}/etc/slurm/slurm.conf",
    ]
    assert (prefix / "etc/slurm/slurm.conf").read_text() == (
        f"ClusterName=test\nJobSubmitPlugins=\n\n{BEGIN}\n"
        f"include {prefix}/etc/slurm/hyperpod.conf\n{END}\n"
    )
    assert (prefix / "etc/slurm/job_submit.lua").read_text() == hooks.JOB_SUBMIT
    controller = (prefix / "etc/hyperpod/controller.toml").read_text()
    assert 'listen_host = "127.0.0.1"' in controller and "listen_port = 28899" in controller
    assert (prefix / "etc/systemd/system/hyperpod-controller.service").read_text() == (
        CONTROLLER_UNIT
    )
    again = apply_plan(plan_for(params, "head", prefix, source), verify=False)
    assert again.changed == []


def test_managed_block_is_replaced_not_duplicated(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    conf = prefix / "etc/slurm/plugstack.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        f"optional /usr/lib/x.so\n{BEGIN}\nrequired /old/auto_resume.so\n{END}\n"
        "optional /usr/lib/y.so\n"
    )
    apply_plan(plan_for(params, "node1", prefix, source), verify=False)
    lines = conf.read_text().splitlines()
    assert lines[:2] == ["optional /usr/lib/x.so", "optional /usr/lib/y.so"]
    assert lines.count(BEGIN) == 1 and "/old/" not in conf.read_text()
    assert lines[-2].startswith(f"required {prefix}/opt/hyperpod/lib/auto_resume.so ")


def test_empty_block_removes_the_old_one(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(f"/dev/sda1 / ext4 defaults 0 1\n\n{BEGIN}\nx:/y /y nfs d 0 0\n{END}\n")
    step = ManagedBlock(fstab, "")
    step.apply(Context())
    assert fstab.read_text() == "/dev/sda1 / ext4 defaults 0 1\n"
    assert step.inspect(Context()) is None


def test_controller_needs_slurm_conf(params: dict[str, Any], prefix: Path, source: Path) -> None:
    with pytest.raises(StepFailed) as info:
        apply_plan(plan_for(params, "head", prefix, source), verify=False)
    assert str(info.value) == (
        f"head: step 'site {prefix}/etc/slurm/slurm.conf' failed: "
        f"{prefix}/etc/slurm/slurm.conf: no such file (Slurm must be configured first)"
    )
    log = (prefix / "var/log/hyperpod/provision.log").read_text()
    assert f"ERROR site {prefix}/etc/slurm/slurm.conf" in log


def test_site_job_submit_lua_gets_ours_chained_in_front(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    (prefix / "etc/slurm").mkdir(parents=True)
    (prefix / "etc/slurm/slurm.conf").write_text("ClusterName=test\nJobSubmitPlugins=pbs\n")
    site = "function slurm_job_submit(job_desc, part_list, submit_uid)\n  return 0\nend\n"
    (prefix / "etc/slurm/job_submit.lua").write_text(site)
    apply_plan(plan_for(params, "head", prefix, source), verify=False)
    text = (prefix / "etc/slurm/job_submit.lua").read_text()
    # The site's file stays, byte for byte, with our block after it.
    assert text.startswith(site)
    assert text.count("local hyperpod_site_job_submit = slurm_job_submit") == 1
    assert "JobSubmitPlugins=pbs,lua" in (prefix / "etc/slurm/hyperpod.conf").read_text()
    # A second run replaces the block instead of chaining ours to itself.
    again = apply_plan(plan_for(params, "head", prefix, source), verify=False)
    assert again.changed == []
    assert (prefix / "etc/slurm/job_submit.lua").read_text() == text


def test_login_writes_exactly_its_files(params: dict[str, Any], prefix: Path, source: Path) -> None:
    apply_plan(plan_for(params, "login2", prefix, source), verify=False)
    assert tree(prefix) == {**DIRS, "etc/hyperpod/admin.toml": "file 0644"}
    assert (prefix / "etc/hyperpod/admin.toml").read_text().splitlines()[1:] == [
        "",
        "[controller]",
        'url = "http://127.0.0.1:28899"',
    ]


def test_not_configless_puts_slurm_pieces_on_every_node(
    params: dict[str, Any], prefix: Path, source: Path
) -> None:
    params["slurm"]["configless"] = False
    names = [s.name for s in plan_for(params, "login1", prefix, source).steps]
    assert f"file {prefix}/etc/slurm/hyperpod.conf" in names


def test_node_in_no_group(params: dict[str, Any], prefix: Path, source: Path) -> None:
    with pytest.raises(ProvisionError) as info:
        plan_for(params, "ghost", prefix, source)
    assert str(info.value) == (
        "node ghost is in no group of the parameters (controller 'controller', login 'login', "
        "worker 'gpu', worker 'cpu')"
    )


def test_without_prefix_systemctl_and_mount_steps(params: dict[str, Any], source: Path) -> None:
    params["mounts"] = [
        {"path": "/fsx", "type": "lustre", "source": "fs@tcp:/x", "required": False}
    ]
    plan = build_plan(parse_parameters(params, "p"), "node1", Options(source=source))
    kinds = {type(s) for s in plan.steps}
    assert SystemdEnable in kinds and Mount in kinds
    mount = next(s for s in plan.steps if isinstance(s, Mount))
    assert mount.optional and mount.network
    enable = next(s for s in plan.steps if isinstance(s, SystemdEnable))
    assert enable.restart_on == [
        "file /etc/systemd/system/hyperpod-agent.service",
        "file /etc/systemd/system/hyperpod-agent.service.d/provision.conf",
        "file /etc/hyperpod/agent.toml",
        f"install {source} into /opt/hyperpod/venv",
    ]


# --- retries, optional steps, the lock ----------------------------------------------------


class Flaky(Step):
    network = True

    def __init__(self, fail_times: int, optional: bool = False) -> None:
        self.name, self.fail_times, self.calls, self.done = "flaky", fail_times, 0, False
        self.optional = optional

    def inspect(self, ctx: Context) -> Change | None:
        return None if self.done else Change("fetch")

    def apply(self, ctx: Context) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise StepError("connection reset")
        self.done = True


def test_network_step_retried_with_exponential_backoff() -> None:
    waits: list[float] = []
    step = Flaky(fail_times=3)
    with_retry(lambda: step.apply(Context()), "flaky", Retry(5, 2.0, 5.0), waits.append)
    assert waits == [2.0, 4.0, 5.0] and step.done


def test_network_step_gives_up(params: dict[str, Any], prefix: Path, source: Path) -> None:
    plan = plan_for(params, "login1", prefix, source)
    plan.steps.insert(1, Flaky(fail_times=99))
    waits: list[float] = []
    with pytest.raises(StepFailed) as info:
        apply_plan(plan, verify=False, retry=Retry(3, 1.0, 60.0), sleep=waits.append)
    assert str(info.value) == (
        "login1: step 'flaky' failed: connection reset (gave up after 3 attempts)"
    )
    assert waits == [1.0, 2.0]


def test_optional_step_failure_goes_on(params: dict[str, Any], prefix: Path, source: Path) -> None:
    plan = plan_for(params, "login1", prefix, source)
    plan.steps.insert(1, Flaky(fail_times=99, optional=True))
    result = apply_plan(plan, verify=False, retry=Retry(2, 0.0, 0.0), sleep=lambda s: None)
    failed = [o for o in result.outcomes if o.status == "failed (optional)"]
    assert [o.name for o in failed] == ["flaky"]
    assert (prefix / "etc/hyperpod/admin.toml").exists()


def test_concurrent_run_refused(params: dict[str, Any], prefix: Path, source: Path) -> None:
    lock = prefix / "var/log/hyperpod/.provision.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(StepFailed, match="another provisioning run holds"):
            apply_plan(plan_for(params, "login1", prefix, source), verify=False)
    finally:
        os.close(fd)
    assert not (prefix / "etc").exists()


# --- verification -------------------------------------------------------------------------


def fake_gpu_overrides(tmp_path: Path, gpus: int) -> dict[str, Any]:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"generate": gpus}))
    off = {"enabled": False}
    return {
        "metrics": {"enabled": False},
        "probes": {
            "gpu": {"backend": "fake", "fake_scenario": str(scenario), "kmsg_path": ""},
            "nic": off,
            "disk": off,
            "cpu": off,
            "slurmd": off,
            "script": off,
        },
    }


def test_worker_verify_runs_one_agent_cycle(prefix: Path, source: Path, tmp_path: Path) -> None:
    data = base_params()
    data["agent_overrides"] = fake_gpu_overrides(tmp_path, 8)
    result = apply_plan(plan_for(data, "node1", prefix, source, python=sys.executable))
    ((name, line),) = result.checks
    assert name == "verify: agent reports healthy"
    assert line.startswith("node1: healthy")
    assert (prefix / "run/hyperpod/health.json").exists()


def test_worker_verify_failure_names_the_check(prefix: Path, source: Path, tmp_path: Path) -> None:
    data = base_params()
    data["agent_overrides"] = fake_gpu_overrides(tmp_path, 7)
    with pytest.raises(StepFailed) as info:
        apply_plan(plan_for(data, "node1", prefix, source, python=sys.executable))
    assert str(info.value).startswith(
        "node1: verify: agent reports healthy: failed: agent run --once: exit 1: node1: faulty"
    )
    assert info.value.exit_code == 6


def test_login_verify_asks_the_controller(prefix: Path, source: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        data = base_params()
        data["controller_url"] = f"http://127.0.0.1:{server.server_port}"
        result = apply_plan(plan_for(data, "login1", prefix, source))
    finally:
        server.shutdown()
        server.server_close()
    assert result.checks == [
        (
            f"verify: controller answers {data['controller_url']}/v1/healthz",
            f"{data['controller_url']}/v1/healthz: HTTP 200",
        )
    ]


def test_login_verify_gives_up_when_nothing_answers(prefix: Path, source: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), Healthz)
    port = server.server_port
    server.server_close()  # a port nothing listens on
    data = base_params()
    data["controller_url"] = f"http://127.0.0.1:{port}"
    with pytest.raises(StepFailed) as info:
        apply_plan(
            plan_for(data, "login1", prefix, source, verify_timeout_s=0.5), sleep=lambda s: None
        )
    assert str(info.value).startswith(
        f"login1: verify: controller answers http://127.0.0.1:{port}/v1/healthz: failed: "
    )
    assert str(info.value).endswith("(still failing after 0.5 s)")
