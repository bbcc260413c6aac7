"""The node baseline: its file format, the shared source the probes read, the baseline
probe's configuration finding, and the gpu probe against the baseline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.baseline import (
    Baseline,
    BaselineConfig,
    BaselineError,
    BaselineProbe,
    BaselineSource,
    DiskBaseline,
    GpuBaseline,
    NicBaseline,
    baseline_of,
    parse_baseline,
    read_baseline,
    render_baseline,
)
from hyperpod_agent.probes.gpu import GpuConfig, GpuProbe

GOOD = """\
version = 1
node = "node1"
recorded_at = "2026-11-27T19:00:00+00:00"

[gpu]
count = 8
model = "NVIDIA H100 80GB HBM3"

[nic]
ports = ["mlx5_1/1", "mlx5_0/1"]
interfaces = ["eth0"]

[disk]
mounts = ["/scratch/", "/"]
"""


def full() -> Baseline:
    return Baseline(
        node="node1",
        recorded_at="2026-11-27T19:00:00+00:00",
        gpu=GpuBaseline(count=8, model='H100 "SXM"\\x'),
        nic=NicBaseline(ports=["mlx5_0/1"], interfaces=["eth0", "ib0"]),
        disk=DiskBaseline(mounts=["/", "/scratch"]),
    )


# --- the format ---------------------------------------------------------------------------


def test_parse_normalises_and_sorts() -> None:
    b = parse_baseline(GOOD)
    assert b.gpu == GpuBaseline(count=8, model="NVIDIA H100 80GB HBM3")
    assert b.nic.ports == ["mlx5_0/1", "mlx5_1/1"]
    assert b.disk.mounts == ["/", "/scratch"]
    assert b.summary() == (
        "8 GPU(s) (NVIDIA H100 80GB HBM3), 2 port(s), 1 interface(s), 2 mount(s)"
    )


@pytest.mark.parametrize("baseline", [full(), Baseline(node="n-2.x")])
def test_render_reads_back_unchanged(baseline: Baseline) -> None:
    assert parse_baseline(render_baseline(baseline)) == baseline


def test_sections_are_optional() -> None:
    b = parse_baseline('version = 1\nnode = "n1"\n')
    assert b.gpu is None and b.nic.ports == [] and b.disk.mounts == []


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("version = [", "b.toml: invalid TOML"),
        ('node = "n1"\nversion = 2', "b.toml: version: Input should be 1"),
        ("version = 1", "b.toml: node: Field required"),
        ('version = 1\nnode = "n1"\nextra = 1', "b.toml: extra: Extra inputs"),
        ('version = 1\nnode = "n1"\n[gpu]\ncount = "eight"', "b.toml: gpu.count:"),
        ('version = 1\nnode = "n1"\n[gpu]\ncount = 65', "gpu.count: Input should be less"),
        ('version = 1\nnode = "n1"\n[nic]\nports = ["mlx5_0"]', "expected <device>/<port>"),
        ('version = 1\nnode = "n1"\n[nic]\ninterfaces = ["a/b"]', "plain interface name"),
        ('version = 1\nnode = "n1"\n[disk]\nmounts = ["scratch"]', "absolute paths"),
        ('version = 1\nnode = "a b"', "b.toml: node: String should match"),
    ],
)
def test_malformed_files_name_the_file_and_key(text: str, expect: str) -> None:
    with pytest.raises(BaselineError) as err:
        parse_baseline(text, "b.toml")
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="nope.toml: no such file"):
        read_baseline(tmp_path / "nope.toml")
    with pytest.raises(BaselineError, match="cannot read"):
        read_baseline(tmp_path)  # a directory
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(BaselineError, match="bin.toml: cannot read"):
        read_baseline(tmp_path / "bin.toml")


# --- the source ---------------------------------------------------------------------------


def bump(path: Path, text: str) -> None:
    """Rewrite ``path`` with a new modification time, as a later edit would have."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_source_reloads_on_change_and_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    path.write_text(GOOD)
    source = BaselineSource(path, "node1")
    assert source.get().baseline == parse_baseline(GOOD) and source.get().problem is None
    bump(path, "version = 1\nnode = 'node1'\n[gpu]\ncount = -1\n")
    view = source.get()
    assert view.baseline == parse_baseline(GOOD)
    assert view.problem is not None and "gpu.count" in view.problem
    bump(path, GOOD.replace("count = 8", "count = 4"))
    view = source.get()
    assert view.problem is None and view.baseline is not None and view.baseline.gpu
    assert view.baseline.gpu.count == 4


def test_source_missing_file_and_another_nodes_file(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    source = BaselineSource(path, "node1")
    assert source.get().baseline is None and "no such file" in str(source.get().problem)
    path.write_text(GOOD.replace('"node1"', '"node7"'))
    view = source.get()
    assert view.baseline is None
    assert "recorded on 'node7', not on 'node1'" in str(view.problem)
    assert baseline_of(source) is None and baseline_of(None) is None


# --- the baseline probe -------------------------------------------------------------------


def baseline_probe(path: Path | None) -> BaselineProbe:
    source = BaselineSource(path, "node1") if path is not None else None
    return BaselineProbe(BaselineConfig(), ProbeContext(node_name="node1", baseline=source))


def test_probe_without_a_baseline_is_ok() -> None:
    out = baseline_probe(None).check()
    assert (out.status, out.message) == (Status.OK, "no baseline configured")


def test_probe_with_a_good_baseline_summarises_it(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(GOOD)
    out = baseline_probe(tmp_path / "b.toml").check()
    assert out.status is Status.OK and "8 GPU(s)" in out.message


def test_malformed_baseline_is_one_configuration_finding(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text("version = 1\nnode = 3\n")
    out = baseline_probe(tmp_path / "b.toml").check()
    (finding,) = out.findings
    assert (finding.component, finding.code) == ("baseline", "config_baseline")
    assert (finding.status, finding.action, finding.urgent) == (Status.WARN, Action.NONE, False)
    assert "b.toml: node:" in finding.message


# --- the gpu probe against the baseline ---------------------------------------------------


def gpu_probe(tmp_path: Path, generate: int, baseline: str | None, **cfg: object) -> GpuProbe:
    scenario = tmp_path / "gpus.json"
    scenario.write_text(json.dumps({"generate": generate}))
    source = None
    if baseline is not None:
        (tmp_path / "b.toml").write_text(baseline)
        source = BaselineSource(tmp_path / "b.toml", "node1")
    config = GpuConfig(backend="fake", fake_scenario=scenario, kmsg_path=None, **cfg)  # type: ignore[arg-type]
    return GpuProbe(config, ProbeContext(node_name="node1", baseline=source))


def test_gpu_missing_versus_the_baseline_fails_from_the_first_run(tmp_path: Path) -> None:
    # Without a baseline the first sample sets the count and 7 of 8 would pass.
    out = gpu_probe(tmp_path, 7, GOOD).check()
    (finding,) = out.findings
    assert (finding.code, finding.action, finding.urgent) == ("gpu_count", Action.REBOOT, True)
    assert finding.message == "7 GPUs visible, 8 expected (baseline)"
    assert gpu_probe(tmp_path, 7, None).check().status is Status.OK


def test_more_gpus_than_the_baseline_is_not_a_fault(tmp_path: Path) -> None:
    assert gpu_probe(tmp_path, 9, GOOD).check().status is Status.OK


def test_configured_expected_count_wins_over_the_baseline(tmp_path: Path) -> None:
    assert gpu_probe(tmp_path, 7, GOOD, expected_count=7).check().status is Status.OK


def test_malformed_baseline_leaves_the_gpu_probe_on_its_own_count(tmp_path: Path) -> None:
    assert gpu_probe(tmp_path, 7, "version = 1\n[gpu]\n").check().status is Status.OK


def test_fake_backend_names_the_model(tmp_path: Path) -> None:
    probe = gpu_probe(tmp_path, 1, None)
    probe.check()
    assert probe._backend is not None
    assert probe._backend.sample().gpus[0].name == "NVIDIA H100 80GB HBM3"
