"""docs/manual-install.md, word for word, on a bare local cluster.

The cluster comes up with the machine's and site's slurm.conf only (nodes, munge,
ports, a fake RebootProgram, a TaskProlog): nothing of hyperpod. The page's shell blocks
are then run in order with bash, verbatim, except the first (the variables), which this
test replaces with paths inside the cluster directory. Blocks marked ``# machine-only``
are skipped (systemctl, the package index), and ``# on: every worker`` blocks run once
per node with that node's variables. The controller and one agent per node are started
from the ExecStart lines of the drop-ins the recipe wrote, with the configs it wrote, and
two real faults follow: an ``sbatch --auto-resume=1`` job requeued after an XID 79, and
an ``srun --auto-resume`` step retried in place on the spare. Every file the recipe
writes is compared with what provisioning's renderers write for the same paths.

One machine plays every node, so files a real cluster keeps per node share one
filesystem here: the plugstack line names each node's own progress and memory roots with
the plugin's ``%n`` (the node's host name), and each node's agent.toml (its own
``/etc/hyperpod``) and health cache (its own ``/run/hyperpod``) are in a directory per
node. The Prolog and HealthCheckProgram wrappers read the head's ``agent.toml``, which no
agent runs from, so here they let every job start (the Prolog gate has its drill in
test_site_hooks.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import Dice, wait_for

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.localcluster import daemons, drill, procs
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.services import HEALTHY_GPUS
from hyperpod_agent.provision import hooks, render
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisioningParameters
from hyperpod_agent.provision.site import read_site
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import compress_hostlist

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "manual-install.md"
DIR = Path("/var/tmp/hyperpod-manual")
PORT_BASE = 20617
MANUAL_HEADER = "# Installed by hand (docs/manual-install.md)"
MACHINE_ONLY = "# machine-only"
EVERY_WORKER = "# on: every worker"
GPUS = 8
REPLACE_REASON = "hyperpod:replace gpu3 xid79"
SPARE_REASON = "hyperpod:spare"


# --------------------------------------------------------------------------- the page


@dataclass(frozen=True)
class Block:
    index: int
    text: str

    @property
    def tag(self) -> str:
        return self.text.splitlines()[0].strip() if self.text.strip() else ""

    @property
    def machine_only(self) -> bool:
        return self.tag.startswith(MACHINE_ONLY)

    @property
    def per_worker(self) -> bool:
        return self.tag.startswith(EVERY_WORKER)


def shell_blocks(markdown: str) -> list[Block]:
    """The page's ```sh blocks, in order."""
    found = re.findall(r"^```sh\n(.*?)^```\s*$", markdown, re.M | re.S)
    return [Block(i, text) for i, text in enumerate(found)]


def variable_names(block: str) -> list[str]:
    return re.findall(r"^([A-Z][A-Z0-9_]*)=", block, re.M)


def variables_text(values: dict[str, str]) -> str:
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


# --------------------------------------------------------------------------- paths


class Paths:
    """The test's values for the page's variables: provisioning's layout under the
    cluster directory as a prefix (so its renderers name the same paths), per node
    where a real node has its own."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.d = cluster.dir
        self.port = PORT_BASE + 2
        self.url = f"http://127.0.0.1:{self.port}"

    def head(self) -> dict[str, str]:
        d, shape = self.d, self.cluster.shape
        return {
            "HYPERPOD_SRC": str(REPO),
            "HYPERPOD_VENV": str(d / "opt/hyperpod/venv"),
            "HYPERPOD_LIBEXEC": str(d / "opt/hyperpod/libexec"),
            "HYPERPOD_PLUGIN_DIR": str(d / "opt/hyperpod/lib"),
            "HYPERPOD_ETC": str(d / "etc/hyperpod"),
            "HYPERPOD_STATE": str(d / "var/lib/hyperpod"),
            "HYPERPOD_MARKERS": str(d / "var/lib/hyperpod/autoresume"),
            "HYPERPOD_LOG": str(d / "var/log/hyperpod"),
            "HYPERPOD_RUN": str(d / "run/hyperpod"),
            # %n: the plugin makes each node's directories under its own root
            "HYPERPOD_PROGRESS_ROOT": f"{shape.progress_root}/%n",
            "HYPERPOD_MEMORY_ROOT": f"{shape.memory_root}/%n",
            "SLURM_ETC": str(d / "etc"),
            "SYSTEMD_DIR": str(d / "etc/systemd/system"),
            "CONTROLLER_URL": self.url,
            "CONTROLLER_LISTEN": "127.0.0.1",
            "CONTROLLER_PORT": str(self.port),
            "HYPERPOD_MODE": "act",
            "NODE_NAME": "head",
            "GPUS_PER_NODE": str(GPUS),
            "SPARE_NODES": ",".join(self.cluster.spares),
            "REBOOT_PROGRAM": "/usr/sbin/reboot",  # the site sets its own: not written
        }

    def node_root(self, node: str) -> Path:
        return self.d / "nodes" / node

    def node(self, node: str) -> dict[str, str]:
        """What a worker's shell has: its own name, /etc/hyperpod, /run/hyperpod and
        systemd directory, and its roots with %n expanded as the plugin does."""
        shape, root = self.cluster.shape, self.node_root(node)
        return {
            **self.head(),
            "HYPERPOD_ETC": str(root / "etc/hyperpod"),
            "HYPERPOD_RUN": str(root / "run/hyperpod"),
            "SYSTEMD_DIR": str(root / "etc/systemd/system"),
            "HYPERPOD_PROGRESS_ROOT": str(shape.progress_root / node),
            "HYPERPOD_MEMORY_ROOT": str(shape.memory_root / node),
            "NODE_NAME": node,
        }

    def params(self, agent_roots: tuple[str, str] | None = None) -> ProvisioningParameters:
        """The provisioning_parameters.json that describes the same install."""
        shape = self.cluster.shape
        progress, memory = agent_roots or (
            f"{shape.progress_root}/%n",
            f"{shape.memory_root}/%n",
        )
        data: dict[str, Any] = {
            "cluster_name": "manual",
            "controller": {"nodes": ["head"]},
            "worker_groups": [
                {
                    "name": "compute",
                    "nodes": shape.all_names,
                    "partitions": ["main"],
                    "gpus": GPUS,
                }
            ],
            "partitions": [{"name": "main", "default": True}],
            "spare_pool": {"nodes": shape.spare_names, "partition": "main"},
            "controller_url": self.url,
            "controller_overrides": {"policy": {"mode": "act"}},
            "agent_overrides": {"progress_dir": progress, "memory_tier": {"root": memory}},
            "slurm": {"conf_dir": "/etc"},
        }
        return parse_parameters(data, "manual install parameters")

    def layout(self) -> Layout:
        return Layout.for_params(self.params(), self.d)


# --------------------------------------------------------------------------- running it


def run_block(cluster: LocalCluster, block: Block, values: dict[str, str], who: str) -> None:
    script = "set -euo pipefail\n" + variables_text(values) + block.text
    res = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cluster.dir / "out",
        env=cluster.env,
    )
    assert res.returncode == 0, (
        f"block {block.index} ({block.tag}) on {who}: rc {res.returncode}\n"
        f"{block.text}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    )


def exec_start(dropin: Path) -> list[str]:
    """The command a drop-in makes systemd run (its last non-empty ExecStart)."""
    lines = [ln for ln in dropin.read_text().splitlines() if ln.startswith("ExecStart=")]
    commands = [ln.removeprefix("ExecStart=") for ln in lines if ln != "ExecStart="]
    assert commands, f"{dropin}: no ExecStart"
    return shlex.split(commands[-1])


def start_service(cluster: LocalCluster, name: str, argv: list[str]) -> int:
    """Start ``argv`` as the local cluster's service ``name`` (its pidfile is the one
    Services.stop and LocalCluster.down use)."""
    pid = daemons.start_process(cluster.shape, argv, f"{name}.log")
    procs.write_pidfile(cluster.dir / "run" / f"proc-{name}.pid", pid)
    return pid


def add_site_keys(path: Path, additions: dict[str, Any]) -> None:
    """The local cluster's own settings added to a config the recipe wrote, as the page
    tells an admin to add their hardware's. TOML cannot reopen a table, so the file is
    merged and written again; no key the recipe wrote may be changed by it."""
    written = tomllib.loads(path.read_text())

    def clash(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
        for key, value in ours.items():
            if key in theirs:
                assert isinstance(value, dict) and isinstance(theirs[key], dict), (
                    f"{path}: the test would change {where}{key}, which the recipe wrote"
                )
                clash(value, theirs[key], f"{where}{key}.")

    clash(additions, written, "")
    merged = render.deep_merge(written, additions)
    path.write_text(render.to_toml(merged, header=MANUAL_HEADER.removeprefix("# ")))


def beyond(theirs: dict[str, Any], written: dict[str, Any]) -> dict[str, Any]:
    """``theirs`` without every key ``written`` already has (tables key by key)."""
    out: dict[str, Any] = {}
    for key, value in theirs.items():
        if key not in written:
            out[key] = value
        elif isinstance(value, dict) and isinstance(written[key], dict):
            rest = beyond(value, written[key])
            if rest:
                out[key] = rest
    return out


def without_header(text: str, header: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True) if ln.rstrip("\n") != header)


def same_file(written: Path, expected: str) -> None:
    ours = without_header(written.read_text(), MANUAL_HEADER)
    theirs = without_header(expected, f"# {render.HEADER}")
    assert ours == theirs, (
        f"{written} differs from what provisioning writes:\n{ours}\n---\n{theirs}"
    )


# --------------------------------------------------------------------------- the cluster


class Installed:
    """The bare cluster with hyperpod installed by the page, and its services."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.paths = Paths(cluster)
        self.head = self.paths.head()
        self.slurm = SlurmClient(cluster.slurm_conf, timeout=10)
        self.admin_env = {
            **cluster.env,
            "HYPERPOD_ADMIN_CONFIG": str(Path(self.head["HYPERPOD_ETC"]) / "admin.toml"),
        }
        self.admin_env.pop("HYPERPOD_LOCAL_CLUSTER_DIR", None)
        self.blocks: list[Block] = []

    def agent_site_keys(self, node: str, written: dict[str, Any]) -> dict[str, Any]:
        """The fake node's machine facts (its GPU scenario, sysfs view, scratch mount,
        metrics port, munge socket) and the drills' short cadences: what services.py
        gives the agents of a provisioned local cluster, less the keys the page wrote."""
        return beyond(self.cluster.services.agent_config(node), written)

    def controller_site_keys(self) -> dict[str, Any]:
        """SlurmUser is root here, MUNGE has its own socket; the drills' short pass and
        wide limits (a 3-node partition under the 10% default could lose no node). No
        deep-check suite: the page names none, so the gates stay off as an admin gets
        them."""
        return {
            "slurm_user": "root",
            "reconcile_interval_s": 2.0,
            "auth": self.cluster.services.auth(),
            "policy": {
                "heartbeat_timeout_s": 30.0,
                "cooldown_s": 5.0,
                "max_unhealthy_fraction": 0.5,
                "lemon_threshold": 100,
                # Agents here probe every second: a shared cause shows within seconds,
                # and a step's fault is answered only once its window has passed.
                "shared_cause_window_s": 3.0,
            },
            "auto_resume": {"backoff_base_s": 0.0, "fault_window_s": 120.0},
        }

    # ----------------------------------------------------------------- install
    def clean(self) -> None:
        d = self.cluster.dir
        for sub in ("opt", "var", "nodes", "etc/hyperpod", "etc/systemd"):
            shutil.rmtree(d / sub, ignore_errors=True)

    def run_page(self) -> list[Block]:
        blocks = shell_blocks(DOC.read_text())
        assert len(blocks) > 5, f"{DOC}: too few shell blocks"
        first, rest = blocks[0], blocks[1:]
        assert sorted(variable_names(first.text)) == sorted(self.head), (
            "the page's variables and the test's differ: "
            f"{sorted(set(variable_names(first.text)) ^ set(self.head))}"
        )
        for block in rest:
            assert block.tag.startswith(("# on: ", MACHINE_ONLY)), (
                f"block {block.index} does not say where it runs: {block.tag!r}"
            )
        # Step 1's machine-only block makes the venv with the package; here it is the
        # Python running the tests, as the provisioned local cluster has it.
        venv = Path(self.head["HYPERPOD_VENV"])
        venv.parent.mkdir(parents=True, exist_ok=True)
        venv.symlink_to(sys.prefix)
        for block in rest:
            if block.machine_only:
                continue
            if block.per_worker:
                for node in self.cluster.shape.all_names:
                    run_block(self.cluster, block, self.paths.node(node), node)
            else:
                run_block(self.cluster, block, self.head, "the head node")
        return rest

    def add_site_settings(self) -> None:
        etc = Path(self.head["HYPERPOD_ETC"])
        add_site_keys(etc / "controller.toml", self.controller_site_keys())
        # Every node shares 127.0.0.1 here, so the origin check cannot tell them apart.
        add_site_keys(etc / "admin.toml", {"auth": self.cluster.services.auth()})
        for node in self.cluster.shape.all_names:
            # Each node's own hardware, kept out of the page's blocks on purpose: the page
            # says an admin adds what their hardware needs to the agent.toml it wrote.
            agent = Path(self.paths.node(node)["HYPERPOD_ETC"]) / "agent.toml"
            add_site_keys(agent, self.agent_site_keys(node, tomllib.loads(agent.read_text())))

    # ----------------------------------------------------------------- services
    def start_controller(self) -> None:
        dropin = Path(self.head["SYSTEMD_DIR"]) / "hyperpod-controller.service.d" / "exec.conf"
        argv = exec_start(dropin)
        assert argv[0] == f"{self.head['HYPERPOD_VENV']}/bin/hyperpod-controller", argv
        pid = start_service(self.cluster, "controller", argv)

        def answers() -> bool:
            assert procs.alive(pid), f"the controller exited: {self.log('controller')}"
            try:
                with urllib.request.urlopen(f"{self.paths.url}/v1/healthz", timeout=2):
                    return True
            except OSError:
                return False

        wait_for("the controller to answer", answers, timeout=30.0)

    def start_agent(self, node: str) -> None:
        values = self.paths.node(node)
        # What the unit's RuntimeDirectory= makes before the agent starts.
        Path(values["HYPERPOD_RUN"]).mkdir(parents=True, exist_ok=True)
        argv = exec_start(Path(values["SYSTEMD_DIR"]) / "hyperpod-agent.service.d" / "exec.conf")
        assert argv[0] == f"{values['HYPERPOD_VENV']}/bin/hyperpod-agent", argv
        start_service(self.cluster, f"agent-{node}", argv)

    def restart_agent(self, node: str) -> None:
        self.cluster.services.stop(f"agent-{node}")
        self.start_agent(node)

    def start(self) -> None:
        services = self.cluster.services
        (self.cluster.dir / "gpu").mkdir(exist_ok=True)
        for node in self.cluster.shape.all_names:
            services.make_node_hardware(node)
            services.scenario(node).write_text(json.dumps(HEALTHY_GPUS) + "\n")
        self.start_controller()
        for node in self.cluster.shape.all_names:
            self.start_agent(node)
        wait_for(
            "every agent reporting healthy to the controller",
            lambda: self.all_healthy(self.cluster.shape.all_names),
            timeout=60.0,
            step=0.5,
            detail=lambda: self.hyperpod_json("nodes"),
        )

    def stop(self) -> None:
        for node in self.cluster.shape.all_names:
            self.cluster.services.remove_node_hardware(node)

    # ----------------------------------------------------------------- reading
    def log(self, name: str) -> str:
        return daemons.log_tail(self.cluster.dir / "log" / f"{name}.log", 5)

    def hyperpod_json(self, *args: str) -> Any:
        """The admin CLI the recipe installed, reading the admin.toml it wrote."""
        res = subprocess.run(
            [f"{self.head['HYPERPOD_VENV']}/bin/hyperpod", *args, "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.admin_env,
        )
        assert res.returncode == 0, f"hyperpod {' '.join(args)}: {res.stderr.strip()}"
        return json.loads(res.stdout)

    def all_healthy(self, names: list[str]) -> bool:
        view = {n["name"]: n for n in self.hyperpod_json("nodes")}
        return all(
            view.get(n, {}).get("verdict") == "healthy" and view.get(n, {}).get("open_faults") == 0
            for n in names
        )

    def job_events(self, job_id: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.hyperpod_json("events", "--limit", "1000")
        return [e for e in events if e.get("job_id") == job_id]

    def submit(self, script: str, auto_resume: int | None, steps: int) -> tuple[int, Path]:
        # No checkpoint_root on the page's plugstack line: the job names its directory.
        ckpt = self.cluster.dir / "checkpoints" / f"{script}-{time.time_ns()}"
        return drill.submit_training(
            self.cluster,
            steps=steps,
            step_time=0.3,
            ckpt_every=5,
            auto_resume=auto_resume,
            script=script,
            env={
                "HYPERPOD_ADMIN_CONFIG": self.admin_env["HYPERPOD_ADMIN_CONFIG"],
                "HYPERPOD_CHECKPOINT_DIR": str(ckpt),
            },
        )


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    cluster = LocalCluster(DIR, nodes=3, spares=1, port_base=PORT_BASE, bare=True)
    setup = Installed(cluster)
    try:
        setup.clean()
        cluster.up(timeout=60)
        setup.blocks = setup.run_page()
        yield setup
    finally:
        cluster.down()
        setup.stop()


@pytest.fixture(scope="module")
def running(installed: Installed) -> Installed:
    """The services started from the files the page wrote (plus the site's keys)."""
    installed.add_site_settings()
    installed.start()
    return installed


# --------------------------------------------------------------------------- the tests


def test_the_page_writes_what_provisioning_writes(installed: Installed) -> None:
    paths, head = installed.paths, installed.head
    params, lay = paths.params(), paths.layout()
    site = read_site(installed.cluster.slurm_conf)
    etc, libexec = Path(head["HYPERPOD_ETC"]), Path(head["HYPERPOD_LIBEXEC"])
    slurm_etc, systemd = Path(head["SLURM_ETC"]), Path(head["SYSTEMD_DIR"])
    assert (
        lay.libexec == libexec and lay.etc == etc and lay.statedir == Path(head["HYPERPOD_MARKERS"])
    )
    plugstack = (slurm_etc / "plugstack.conf").read_text().splitlines()
    assert render.plugstack_line(params, lay).rstrip("\n") in plugstack, plugstack
    same_file(libexec / "health-check", hooks.health_check_script(lay, site))
    same_file(libexec / "prolog", hooks.prolog_script(lay, site))
    same_file(libexec / "epilog-slurmctld", hooks.epilog_script(lay, site))
    same_file(slurm_etc / "hyperpod.conf", hooks.hyperpod_conf(params, lay, site))
    assert (slurm_etc / "job_submit.lua").read_text() == hooks.JOB_SUBMIT
    assert (slurm_etc / "slurm.conf").read_text().splitlines()[-2] == (
        f"include {slurm_etc / 'hyperpod.conf'}"
    )
    same_file(etc / "admin.toml", render.to_toml(render.admin_config_data(params)))
    same_file(
        etc / "controller.toml", render.to_toml(render.controller_config_data(params, lay, "head"))
    )
    same_file(
        systemd / "hyperpod-controller.service.d" / "exec.conf",
        render.unit_dropin(lay.venv / "bin" / "hyperpod-controller", etc / "controller.toml"),
    )
    unit = "hyperpod-controller.service"
    assert (systemd / unit).read_bytes() == (REPO / "systemd" / unit).read_bytes()
    for node in installed.cluster.shape.all_names:
        values = paths.node(node)
        node_etc, node_run = Path(values["HYPERPOD_ETC"]), Path(values["HYPERPOD_RUN"])
        roots = (values["HYPERPOD_PROGRESS_ROOT"], values["HYPERPOD_MEMORY_ROOT"])
        expected = render.agent_config_data(
            paths.params(roots), node, paths.params().worker_groups[0], lay
        )
        # Each node's own /run/hyperpod: on one machine, a directory per node.
        expected |= {"cache_path": str(node_run / "health.json"), "state_dir": str(node_run)}
        written = tomllib.loads((node_etc / "agent.toml").read_text())
        assert AgentConfig.model_validate(written) == AgentConfig.model_validate(expected)
        assert written["auto_resume_markers"] == head["HYPERPOD_MARKERS"]
        node_systemd = Path(values["SYSTEMD_DIR"])
        same_file(
            node_systemd / "hyperpod-agent.service.d" / "exec.conf",
            render.unit_dropin(lay.venv / "bin" / "hyperpod-agent", node_etc / "agent.toml"),
        )
        unit = "hyperpod-agent.service"
        assert (node_systemd / unit).read_bytes() == (REPO / "systemd" / unit).read_bytes()
    # Slurm read it: the spare is pooled, the include's settings are in force.
    spare = installed.slurm.node(installed.cluster.spares[0])
    assert spare.drained and spare.reason.strip() == SPARE_REASON, spare
    # What the drill skipped: systemctl and the package index, nothing else.
    skipped = [b.text for b in installed.blocks if b.machine_only]
    assert skipped and all("systemctl " in b or 'pip" install' in b for b in skipped), skipped


def test_sbatch_auto_resume_job_is_requeued_after_an_xid79(running: Installed) -> None:
    dice = Dice("manual install: sbatch --auto-resume=1")
    job_id, out = running.submit("train.sbatch", auto_resume=1, steps=24)
    drill.wait_for(
        f"job {job_id} to reach step 6",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 6,
    )
    job = drill.job_of(running.cluster, job_id)
    victim = dice.node("victim", job.nodes)
    fault_at = drill.inject_xid(running.cluster, victim)
    timeline = drill.follow_recovery(running.cluster, job_id, victim, fault_at, out, timeout=120)
    assert victim not in timeline.new_nodes, timeline
    done = drill.wait_job_end(running.cluster, job_id, timeout=120)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 1, (done, text[-2000:])
    log = drill.parse_train_log(text)
    assert log.done_step == 24 and len(log.attempts) == 2, text[-2000:]
    assert log.attempts[1].resumed_from is not None and log.attempts[1].resumed_from >= 5
    # Replaced by the spare: the faulty node held for repair, the spare in service.
    node = running.slurm.node(victim)
    assert node.drained and node.reason.startswith(REPLACE_REASON), node
    spare = running.slurm.node(running.cluster.spares[0])
    assert not spare.drained and not spare.reason, spare
    kinds = [e["kind"] for e in running.job_events(job_id)]
    assert kinds.count("requeue") == 1, kinds
    # The repaired node goes back into the pool as the page's step 9 puts a spare there.
    running.cluster.services.scenario(victim).write_text(json.dumps(HEALTHY_GPUS) + "\n")
    running.restart_agent(victim)
    spare_block = next(b for b in running.blocks if 'Reason="hyperpod:spare"' in b.text)
    run_block(
        running.cluster, spare_block, {**running.head, "SPARE_NODES": victim}, "the head node"
    )
    wait_for(
        f"{victim} healthy again in the pool",
        lambda: running.all_healthy([victim]),
        timeout=60.0,
        step=0.5,
        detail=lambda: running.hyperpod_json("nodes"),
    )


def test_srun_auto_resume_step_is_retried_in_place_on_the_spare(running: Installed) -> None:
    spares = [
        n.name for n in running.slurm.list_nodes() if n.drained and n.reason.strip() == SPARE_REASON
    ]
    assert len(spares) == 1, running.slurm.list_nodes()
    spare = spares[0]
    dice = Dice("manual install: srun --auto-resume=1")
    job_id, out = running.submit("train_in_place.sbatch", auto_resume=None, steps=24)
    # Past its first checkpoint (every 5 steps): a fault before it restarts from step 1.
    drill.wait_for(
        f"job {job_id} to reach step 7",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 7,
    )
    job = drill.job_of(running.cluster, job_id)
    nodes = list(job.nodes)
    # Slurm cannot shrink a running job off its batch host: the fault lands elsewhere.
    victim = dice.node("victim", [n for n in nodes if n != job.batch_host])
    fault_at = drill.inject_xid(running.cluster, victim)
    timeline = drill.follow_step_retry(running.cluster, job_id, victim, fault_at, out, 120)
    assert spare in timeline.new_nodes and victim not in timeline.new_nodes, timeline
    done = drill.wait_job_end(running.cluster, job_id, timeout=120)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 0, (done, text[-2000:])
    assert text.count("batch script started on ") == 1, text[-2000:]
    log = drill.parse_train_log(text)
    kept = [n for n in nodes if n != victim]
    assert len(log.attempts) == 2, text[-2000:]
    assert log.attempts[1].nodes == compress_hostlist([*kept, spare]), log.attempts[1]
    assert log.attempts[1].resumed_from is not None and log.done_step == 24
    node = running.slurm.node(victim)
    assert node.drained and node.reason.startswith(REPLACE_REASON), node
    kinds = [e["kind"] for e in running.job_events(job_id)]
    assert "step_end" in kinds and "step_retry_planned" in kinds and "requeue" not in kinds, kinds
    # The opt-in reached the controller through the statedir the agent reads.
    marker = Path(running.head["HYPERPOD_MARKERS"]) / str(job_id)
    assert marker.exists() and "auto_resume=1" in marker.read_text(), os.listdir(marker.parent)
