"""``hyperpod agent baseline``: recording a node, writing, checking, bad input; and the
agent with a baseline (good, malformed) in its configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperpod_agent.agent import baseline as node_baseline
from hyperpod_agent.agent.cli import agent
from hyperpod_agent.agent.config import AgentConfig, load_agent_config
from hyperpod_agent.agent.daemon import Agent
from hyperpod_agent.command import run_command
from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.health import Action, Status, Verdict
from hyperpod_agent.probes.baseline import Baseline, GpuBaseline, parse_baseline
from hyperpod_agent.probes.gpu_backend import GpuSample, GpuState

SUMMARY = "8 GPU(s) (NVIDIA H100 80GB HBM3), 1 port(s), 1 interface(s), 2 mount(s)"


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    """A fake node: 8 fake GPUs, two IB ports (one never cabled), eth0 up, lo and a
    bridge up, / and /scratch mounted; its agent.toml."""
    sys, proc = tmp_path / "sys", tmp_path / "proc"
    for device, state, phys in (
        ("mlx5_0", "4: ACTIVE", "5: LinkUp"),
        ("mlx5_1", "1: DOWN", "3: Disabled"),
    ):
        write(sys, f"class/infiniband/{device}/ports/1/state", state)
        write(sys, f"class/infiniband/{device}/ports/1/phys_state", phys)
    for name, physical in (("eth0", True), ("lo", False), ("br0", False)):
        write(sys, f"class/net/{name}/operstate", "unknown" if name == "lo" else "up")
        write(sys, f"class/net/{name}/carrier", "1")
        if physical:
            (sys / "class/net" / name / "device").mkdir()
    scratch = tmp_path / "scratch"  # a real directory: the disk probe statvfs()s it
    scratch.mkdir()
    mounts = [
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw",
        f"40 22 0:35 / {scratch} rw,relatime - xfs /dev/nvme0n1 rw",
    ]
    write(proc, "1/mountinfo", "\n".join(mounts))
    scenario = tmp_path / "gpus.json"
    scenario.write_text(json.dumps({"generate": 8}))
    toml = tmp_path / "agent.toml"
    toml.write_text(f"""
node_name = "node1"
cache_path = "{tmp_path / "health.json"}"
state_dir = "{tmp_path}"
sysfs_root = "{sys}"
procfs_root = "{proc}"
baseline = "{tmp_path / "baseline.toml"}"
[metrics]
enabled = false
[probes.gpu]
backend = "fake"
fake_scenario = "{scenario}"
kmsg_path = ""
[probes.disk]
mounts = [{{path = "/", write_probe = false}},
          {{path = "{scratch}", name = "scratch", write_probe = false}},
          {{path = "/fsx", required = false, write_probe = false}}]
[probes.slurmd]
enabled = false
[probes.script]
enabled = false
[probes.cpu]
enabled = false
""")
    return toml


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        run_command(agent, args, prog_name="hyperpod agent")
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


# --- recording ----------------------------------------------------------------------------


def test_gather_records_what_the_healthy_node_has(node: Path) -> None:
    b = node_baseline.gather(load_agent_config(node))
    assert b.node == "node1" and b.recorded_at
    assert b.gpu == GpuBaseline(count=8, model="NVIDIA H100 80GB HBM3")
    assert b.nic.ports == ["mlx5_0/1"]  # the port never cabled is not expected up
    assert b.nic.interfaces == ["eth0"]  # no lo, no bridge
    assert b.disk.mounts == ["/", str(node.parent / "scratch")]  # /fsx: optional, absent


def test_disabled_probes_record_nothing(node: Path) -> None:
    cfg = load_agent_config(node)
    off = cfg.probes.model_copy(
        update={
            n: getattr(cfg.probes, n).model_copy(update={"enabled": False})
            for n in ("gpu", "nic", "disk")
        }
    )
    b = node_baseline.gather(cfg.model_copy(update={"probes": off}))
    assert b.gpu is None and b.nic.ports == [] and b.disk.mounts == []


class Backend:
    def __init__(self, sample: GpuSample) -> None:
        self.sample_ = sample
        self.closed = False

    def sample(self) -> GpuSample:
        return self.sample_

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("sample", "expect"),
    [
        (GpuSample(error="NVML: driver not loaded"), "couldn't read the GPUs: NVML: driver"),
        (GpuSample([GpuState(0), GpuState(1, lost=True)]), "gpu1 lost"),
    ],
)
def test_a_node_that_is_not_healthy_is_not_recorded(
    node: Path, sample: GpuSample, expect: str
) -> None:
    backend = Backend(sample)
    with pytest.raises(HyperpodError, match=expect):
        node_baseline.gather(load_agent_config(node), backend)
    assert backend.closed


def test_mixed_models_record_no_model() -> None:
    gpus = [GpuState(0, name="A"), GpuState(1, name="B")]
    assert node_baseline.gather_gpu(Backend(GpuSample(gpus))) == GpuBaseline(count=2)


def test_differences_lists_only_what_is_missing() -> None:
    expected = parse_baseline(
        'version = 1\nnode = "node1"\n[gpu]\ncount = 8\nmodel = "H100"\n'
        '[nic]\nports = ["mlx5_0/1"]\ninterfaces = ["eth0"]\n[disk]\nmounts = ["/scratch"]\n'
    )
    assert node_baseline.differences(expected, expected) == []
    more = expected.model_copy(update={"gpu": GpuBaseline(count=9, model="H100")})
    assert node_baseline.differences(expected, more) == []
    bare = Baseline(node="node2", gpu=GpuBaseline(count=7, model="A100"))
    assert node_baseline.differences(expected, bare) == [
        "recorded on 'node1', this node is 'node2'",
        "gpu: 7 GPU(s), the baseline has 8",
        "gpu: model 'A100', the baseline has 'H100'",
        "nic: port mlx5_0/1 not up",
        "nic: interface eth0 not up",
        "disk: /scratch not mounted",
    ]


# --- the command --------------------------------------------------------------------------


def test_prints_the_baseline(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["baseline", "--config", str(node)], capsys)
    assert code == 0
    assert parse_baseline(out).gpu == GpuBaseline(count=8, model="NVIDIA H100 80GB HBM3")
    assert not (node.parent / "baseline.toml").exists()


def test_write_then_check(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = node.parent / "baseline.toml"
    code, out, err = cli(["baseline", "--config", str(node), "--write", str(path)], capsys)
    assert code == 0
    assert out.strip() == f"{path}: {SUMMARY}"
    assert err == ""  # agent.toml already points at it
    assert (path.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []
    code, out, _ = cli(["baseline", "--config", str(node), "--check", str(path)], capsys)
    assert (code, out.strip()) == (0, f"{path}: node1 matches ({SUMMARY})")
    (node.parent / "gpus.json").write_text(json.dumps({"generate": 7}))
    code, out, _ = cli(["baseline", "--config", str(node), "--check", str(path)], capsys)
    assert (code, out.strip()) == (1, f"{path}: gpu: 7 GPU(s), the baseline has 8")


def test_write_elsewhere_says_where_to_point_the_agent(
    node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.toml"
    code, _, err = cli(["baseline", "--config", str(node), "--write", str(other)], capsys)
    assert code == 0 and f'baseline = "{other}"' in err


@pytest.mark.parametrize(
    ("args", "code", "expect"),
    [
        (["--write", "a.toml", "--check", "b.toml"], 2, "--write and --check exclude each other"),
        (["--bogus"], 2, "No such option '--bogus'"),
        (["--check"], 2, "requires an argument"),
        (["--check", "{tmp}/absent.toml"], 3, "absent.toml: no such file"),
        (["--check", "{tmp}/bad.toml"], 3, "bad.toml: gpu.count: Input should be a valid integer"),
        (["--write", "{tmp}/no/such/dir/b.toml"], 1, "couldn't write the baseline: No such file"),
    ],
)
def test_bad_arguments_and_files_exit_non_zero_with_one_line(
    node: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    expect: str,
) -> None:
    (tmp_path / "bad.toml").write_text('version = 1\nnode = "node1"\n[gpu]\ncount = "eight"\n')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    got, out, err = cli(["baseline", "--config", str(node), *args], capsys)
    assert got == code, err
    assert expect in err and len(err.strip().splitlines()) == 1
    assert out == ""


# --- the agent with a baseline ------------------------------------------------------------


def run_once(config: AgentConfig):  # type: ignore[no-untyped-def]
    the_agent = Agent(config)
    try:
        return the_agent.run_once()
    finally:
        the_agent.close()


def test_agent_checks_the_node_against_its_baseline(node: Path) -> None:
    config = load_agent_config(node)
    node_baseline.write(config.baseline, node_baseline.gather(config))  # type: ignore[arg-type]
    report = run_once(config)
    assert report.verdict is Verdict.HEALTHY, report.message
    assert [r.probe for r in report.results] == ["gpu", "nic", "disk", "baseline"]
    (node.parent / "gpus.json").write_text(json.dumps({"generate": 7}))
    report = run_once(config)
    assert report.verdict is Verdict.FAULTY
    assert "gpus gpu_count REBOOT urgent" in report.message


@pytest.mark.parametrize(
    "content", [None, "version = 1\nnode = [\n", 'version = 1\nnode = "node9"\n']
)
def test_agent_keeps_running_with_a_bad_baseline(node: Path, content: str | None) -> None:
    config = load_agent_config(node)
    if content is not None:
        config.baseline.write_text(content)  # type: ignore[union-attr]
    report = run_once(config)
    assert report.verdict is Verdict.DEGRADED  # never faulty for this
    by_probe = {r.probe: r for r in report.results}
    assert {"gpu", "nic", "disk"} <= set(by_probe)
    assert all(by_probe[p].status is Status.OK for p in ("gpu", "nic", "disk"))
    findings = [f for r in report.results for f in r.findings]
    assert [(f.code, f.status, f.action) for f in findings] == [
        ("config_baseline", Status.WARN, Action.NONE)
    ]


def test_no_baseline_configured_leaves_the_baseline_probe_out(node: Path) -> None:
    config = load_agent_config(node).model_copy(update={"baseline": None})
    assert "baseline" not in config.enabled_probes()


def test_config_rejects_a_relative_baseline_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="baseline"):
        AgentConfig(baseline=Path("baseline.toml"))
