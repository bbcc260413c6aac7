from pathlib import Path

from hyperpod_agent.localcluster import render
from hyperpod_agent.localcluster.shape import Shape


def shape(**kw: int) -> Shape:
    args = {"nodes": 4, "spares": 1, "port_base": 17000, **kw}
    return Shape(Path("/x/c"), **args)


def test_names_and_ports() -> None:
    s = shape()
    assert s.node_names == ["node1", "node2", "node3", "node4"]
    assert s.spare_names == ["node5"]
    assert s.node_port("node3") == 17013
    assert s.ports == [17000, 17011, 17012, 17013, 17014, 17015]


def test_slurm_conf_is_what_the_machine_and_site_have() -> None:
    conf = render.slurm_conf(shape(cred_expire=7, slurmd_timeout=2), "head")
    assert "AuthInfo=socket=/x/c/munge/munge.sock,cred_expire=7" in conf
    assert "SlurmdTimeout=2" in conf
    assert "PlugStackConfig=/x/c/etc/plugstack.conf" in conf
    assert "RebootProgram=/x/c/hooks/reboot.sh" in conf
    assert "/etc/slurm" not in conf and "/etc/munge" not in conf
    # hyperpod's part comes from provisioning's include (localcluster/provisioned.py)
    for ours in ("JobSubmitPlugins", "EpilogSlurmctld", "\nProlog=", "permit_job_expansion"):
        assert ours not in conf


def test_site_hooks_give_the_site_its_own_programs() -> None:
    conf = render.slurm_conf(Shape(Path("/x/c"), 2, 0, 17000, site_hooks=True), "head")
    assert "HealthCheckProgram=/x/c/site/nhc.sh" in conf
    assert "Prolog=/x/c/site/prolog.sh" in conf
    assert "EpilogSlurmctld=/x/c/site/epilog_ctld.sh" in conf
    assert "JobSubmitPlugins=lua" in conf


def test_spares_are_in_the_partition_and_not_drained_by_slurm_conf() -> None:
    # Drained with scontrol once slurmctld runs (LocalCluster.up), as the manual install
    # declares them: a State=DRAIN line would be applied again by every reconfigure and
    # slurmctld restart, taking a spare the controller put into service back out.
    conf = render.slurm_conf(shape(spares=2), "head")
    assert "NodeName=node5 NodeAddr=127.0.0.1 Port=17015" in conf
    assert "State=UNKNOWN" in conf.splitlines()[-2]
    assert "DRAIN" not in conf and "hyperpod:spare" not in conf
    assert "Nodes=node1,node2,node3,node4,node5,node6 " in conf


def test_no_spares() -> None:
    conf = render.slurm_conf(shape(spares=0), "head")
    assert "hyperpod:spare" not in conf


def test_plugstack_line_is_provisionings_with_per_node_roots(tmp_path: Path) -> None:
    from hyperpod_agent.localcluster import provisioned
    from hyperpod_agent.provision import render as provision_render

    for step_retry in (False, True):
        params = provisioned.parameters(shape(), step_retry)
        lay = provisioned.Layout.for_params(params, Path("/x/c"))
        line = provision_render.plugstack_line(params, lay)
        assert line.startswith("required /x/c/lib/auto_resume.so ")
        assert "statedir=/x/c/autoresume" in line
        assert "progress_root=/dev/shm/hyperpod-local-17000-progress/%n" in line
        # without services there is no controller to ask
        helper = "step_helper=/x/c/opt/hyperpod/venv/bin/hyperpod"
        assert (helper in line.split()) == step_retry


def test_reboot_program_detaches_and_quotes() -> None:
    text = render.reboot_sh(Shape(Path("/x/with space"), 1, 0, 17000), "/usr/bin/python3")
    assert "setsid nsenter --uts='/x/with space/run/host-uts'" in text
    assert "/usr/bin/python3 -m hyperpod_agent local-cluster node-reboot" in text
    assert "'/x/with space'" in text
    assert text.rstrip().endswith("exit 0")


def test_each_node_gets_its_own_checkpoint_memory_tier() -> None:
    s = shape()
    assert "TaskProlog=/x/c/hooks/task_prolog.sh" in render.slurm_conf(s, "head")
    text = render.task_prolog_sh(s)
    assert f"{s.memory_root}/$(hostname)/$SLURM_JOB_ID" in text
    assert 'case "$HYPERPOD_CHECKPOINT_MEMORY_DIR" in' in text  # the user's choice wins
    assert str(s.memory_root).startswith("/dev/shm/") and "17000" in str(s.memory_root)


def test_the_prolog_rewrites_another_nodes_value_and_keeps_the_users(tmp_path: Path) -> None:
    import subprocess

    s = shape()
    script = tmp_path / "prolog.sh"
    script.write_text(render.task_prolog_sh(s))

    def run(env: dict[str, str]) -> str:
        res = subprocess.run(
            ["sh", str(script)],
            env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", **env},
            capture_output=True,
            text=True,
            timeout=10,
        )
        return res.stdout

    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    batch = {"HYPERPOD_PROGRESS_DIR": f"{s.progress_root}/node1"}  # from the batch step
    assert f"export HYPERPOD_PROGRESS_DIR={s.progress_root}/{host}" in run(batch)
    assert "HYPERPOD_PROGRESS_DIR" not in run({"HYPERPOD_PROGRESS_DIR": "/mine"})
    out = run({"HYPERPOD_CHECKPOINT_MEMORY_DIR": f"{s.memory_root}/node1/7"})
    assert f"export HYPERPOD_CHECKPOINT_MEMORY_DIR={s.memory_root}/{host}/7" in out


def test_each_node_gets_its_own_progress_records() -> None:
    s = shape()
    text = render.task_prolog_sh(s)
    assert f"export HYPERPOD_PROGRESS_DIR={s.progress_root}/$(hostname)" in text
    assert 'case "$HYPERPOD_PROGRESS_DIR" in' in text
    assert s.progress_root != s.memory_root and "17000" in str(s.progress_root)
