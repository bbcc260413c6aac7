"""``hyperpod agent baseline``: record what this healthy node has, so that its probes
check it against itself (LBNL NHC's ``nhc-genconf`` is the model).

Recorded: the GPU count and model (through the gpu probe's backend: NVML, or the fake
scenario), the IB/EFA ports and physical network interfaces that are up, and the mounts
of ``[probes.disk]`` that are mounted. A disabled probe contributes nothing. The file
format, its reader and writer live with the probes (``probes/_baseline.py``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.errors import ConfigError, HyperpodError
from hyperpod_agent.probes._sysfs import list_dir, under
from hyperpod_agent.probes.baseline import (
    Baseline,
    BaselineError,
    DiskBaseline,
    GpuBaseline,
    NicBaseline,
    read_baseline,
    render_baseline,
)
from hyperpod_agent.probes.disk import read_mountinfo
from hyperpod_agent.probes.gpu import make_backend
from hyperpod_agent.probes.gpu_backend import GpuBackend
from hyperpod_agent.probes.nic import ib_port_down, netdev_is_up, read_ib_ports, read_netdev


def gather_gpu(backend: GpuBackend) -> GpuBaseline:
    """The GPUs the backend sees now; refuses a node that is visibly not healthy."""
    try:
        sample = backend.sample()
    finally:
        backend.close()
    if sample.error:
        raise HyperpodError(
            f"gpu: couldn't read the GPUs: {sample.error} "
            "(on a node without GPUs, disable [probes.gpu])"
        )
    lost = [g.component for g in sample.gpus if g.lost]
    if lost:
        raise HyperpodError(f"gpu: {', '.join(lost)} lost: record the baseline of a healthy node")
    models = {g.name for g in sample.gpus if g.name}
    return GpuBaseline(count=len(sample.gpus), model=models.pop() if len(models) == 1 else None)


def physical_interfaces_up(sysfs_root: Path) -> list[str]:
    """Network interfaces backed by a device (not lo, bridges, veths...) that are up."""
    net = under(sysfs_root, "/class/net")
    out = []
    for name in list_dir(net):
        if not (net / name / "device").exists():
            continue
        state = read_netdev(sysfs_root, name)
        if state is not None and netdev_is_up(state.operstate, state.carrier):
            out.append(name)
    return out


def gather(config: AgentConfig, backend: GpuBackend | None = None) -> Baseline:
    """This node's baseline, read now through the probes' readers and roots."""
    ctx = config.probe_context()
    probes = config.probes
    gpu = None
    if probes.gpu.enabled:
        gpu = gather_gpu(backend if backend is not None else make_backend(probes.gpu))
    nic = NicBaseline()
    if probes.nic.enabled:
        ports = read_ib_ports(ctx.sysfs_root, [])
        nic = NicBaseline(
            ports=[p.component for p in ports if ib_port_down(p) is None],
            interfaces=physical_interfaces_up(ctx.sysfs_root),
        )
    disk = DiskBaseline()
    if probes.disk.enabled:
        try:
            table = read_mountinfo(ctx)
        except OSError as exc:
            raise HyperpodError(f"disk: couldn't read the mount table: {exc}") from None
        disk = DiskBaseline(mounts=[m.path for m in probes.disk.mounts if m.path in table])
    return Baseline(
        node=config.node_name,
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        gpu=gpu,
        nic=nic,
        disk=disk,
    )


def differences(expected: Baseline, actual: Baseline) -> list[str]:
    """What ``actual`` lacks against ``expected``: what the probes would report (pure).
    Anything ``actual`` has beyond the baseline is not a difference."""
    out = []
    if expected.node != actual.node:
        out.append(f"recorded on {expected.node!r}, this node is {actual.node!r}")
    if expected.gpu is not None:
        have = actual.gpu.count if actual.gpu is not None else 0
        if have < expected.gpu.count:
            out.append(f"gpu: {have} GPU(s), the baseline has {expected.gpu.count}")
        model = actual.gpu.model if actual.gpu is not None else None
        if expected.gpu.model and model and model != expected.gpu.model:
            out.append(f"gpu: model {model!r}, the baseline has {expected.gpu.model!r}")
    for port in expected.nic.ports:
        if port not in actual.nic.ports:
            out.append(f"nic: port {port} not up")
    for name in expected.nic.interfaces:
        if name not in actual.nic.interfaces:
            out.append(f"nic: interface {name} not up")
    for path in expected.disk.mounts:
        if path not in actual.disk.mounts:
            out.append(f"disk: {path} not mounted")
    return out


def load(path: Path) -> Baseline:
    """``read_baseline`` with the CLI's error: exit 3, naming the file and the key."""
    try:
        return read_baseline(path)
    except BaselineError as exc:
        raise ConfigError(str(exc)) from None


def write(path: Path, baseline: Baseline) -> None:
    """Write ``baseline`` to ``path`` atomically (a reader never sees half a file)."""
    text = render_baseline(baseline)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise HyperpodError(f"{path}: couldn't write the baseline: {exc.strerror or exc}") from None
