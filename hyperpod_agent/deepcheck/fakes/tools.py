"""The fake tools' behaviour: read the scenario, parse the arguments the real tool
takes, print the real tool's format (render.py) and exit with its exit status.

Every fake can also be told to wait (``delay_s``), to hang with a child process in its
group (``hang``, writing both pids to the scenario's ``pid_file``), to ignore SIGTERM, to
print garbage, or to exit with a given status.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping

from hyperpod_agent.deepcheck.fakes import render
from hyperpod_agent.deepcheck.fakes.scenario import (
    Behaviour,
    DcgmiFake,
    IbFake,
    NcclFake,
    NvidiaSmiFake,
    Scenario,
    ScenarioError,
    StressNgFake,
    load_scenario,
    node_name,
    record_pids,
)

HANG_S = 3600.0  # a hang still ends: nothing here may run forever
IB_DEFAULT_PORT = 18515  # perftest's
IB_ACCEPT_S = 120.0
GARBAGE = "\x1b[31m*** fake tool printing noise ***\x1b[0m\n{not: json, 12 ab\x00\n"


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _size(text: str) -> int:
    # nccl-tests and perftest take 8, 64K, 8M, 8G (powers of 1024)
    match = re.fullmatch(r"(\d+)([KkMmGg]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    power: int = {"": 0, "k": 1, "m": 2, "g": 3}[match[2].lower()]
    scale: int = 1024**power
    return int(match[1]) * scale


def _dcgmi(argv: list[str], cfg: Behaviour, node: str) -> int:
    assert isinstance(cfg, DcgmiFake)
    parser = argparse.ArgumentParser(prog="dcgmi")
    parser.add_argument("command", choices=["diag"])
    parser.add_argument("-r", "--run", required=True)
    parser.add_argument("-j", "--json", action="store_true")
    args, _ = parser.parse_known_args(argv)
    if args.run not in ("1", "2", "3", "4"):
        _err(f"Error: invalid diagnostic level {args.run!r} (the fake runs levels 1-4)\n")
        return 2
    if not args.json:
        _err("fake dcgmi: only JSON output (-j) is implemented\n")
        return 2
    text, code = render.dcgm_diag(int(args.run), cfg)
    _out(text)
    return code


def _all_reduce_perf(argv: list[str], cfg: Behaviour, node: str) -> int:
    assert isinstance(cfg, NcclFake)
    parser = argparse.ArgumentParser(prog="all_reduce_perf")
    parser.add_argument("-b", "--minbytes", type=_size, default=32 * 1024 * 1024)
    parser.add_argument("-e", "--maxbytes", type=_size, default=32 * 1024 * 1024)
    parser.add_argument("-f", "--stepfactor", type=int, default=2)
    parser.add_argument("-g", "--ngpus", type=int, default=1)
    parser.add_argument("-t", "--nthreads", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    if args.minbytes > args.maxbytes or args.stepfactor < 2 or args.ngpus < 1:
        _err("invalid sizes for 'minbytes' and 'maxbytes'\n")
        return 6
    sizes = [args.minbytes]
    while sizes[-1] * args.stepfactor <= args.maxbytes and len(sizes) < 64:
        sizes.append(sizes[-1] * args.stepfactor)
    text, code = render.nccl_all_reduce(sizes, args.ngpus * args.nthreads, cfg, node, os.getpid())
    _out(text)
    return code


def _ib_write_bw(argv: list[str], cfg: Behaviour, node: str) -> int:
    assert isinstance(cfg, IbFake)
    parser = argparse.ArgumentParser(prog="ib_write_bw")
    parser.add_argument("-d", "--ib-dev", default="mlx5_0")
    parser.add_argument("-p", "--port", type=int, default=IB_DEFAULT_PORT)
    parser.add_argument("-s", "--size", type=_size, default=65536)
    parser.add_argument("-n", "--iters", type=int, default=5000)
    parser.add_argument("--report_gbits", action="store_true")
    parser.add_argument("server", nargs="?")
    args, _ = parser.parse_known_args(argv)
    if cfg.error is not None:
        _err(f" {cfg.error}\n")
        return 1
    report = render.ib_report(args.ib_dev, args.size, args.iters, cfg.bw_gbps, args.report_gbits)
    if args.server is None:
        return _ib_server(args.port, report)
    try:
        conn = socket.create_connection((args.server, args.port), timeout=5.0)
    except OSError:
        _err(
            f"Couldn't connect to {args.server}:{args.port}\n"
            "Unable to open file descriptor for socket connection\n"
            " Unable to init the socket connection\n"
        )
        return 1
    with conn:
        conn.settimeout(10.0)
        conn.sendall(f"{node}\n".encode())
        conn.recv(64)
    _out(report)
    return 0


def _ib_server(port: int, report: str) -> int:
    try:
        server = socket.create_server(("127.0.0.1", port))
    except OSError as exc:
        _err(f"Couldn't listen to port {port}: {exc.strerror}\n")
        return 1
    with server:
        _out(render.IB_WAITING)
        server.settimeout(IB_ACCEPT_S)
        try:
            conn, _ = server.accept()
        except TimeoutError:
            _err("Couldn't accept a client connection\n")
            return 1
        with conn:
            conn.settimeout(10.0)
            conn.recv(256)
            conn.sendall(b"ok\n")
    _out(report)
    return 0


def _nvidia_smi(argv: list[str], cfg: Behaviour, node: str) -> int:
    assert isinstance(cfg, NvidiaSmiFake)
    if argv[:1] != ["nvlink"] or not {"--status", "-s"} & set(argv):
        _err("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        return 2
    _out(render.nvlink_status(cfg))
    return 0


def _seconds(text: str) -> int:
    match = re.fullmatch(r"(\d+)([smh]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}")
    return int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _stress_ng(argv: list[str], cfg: Behaviour, node: str) -> int:
    assert isinstance(cfg, StressNgFake)
    parser = argparse.ArgumentParser(prog="stress-ng")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--vm", type=int, default=0)
    parser.add_argument("--timeout", type=_seconds, default=86400)
    args, _ = parser.parse_known_args(argv)
    text, code = render.stress_ng(args.cpu, args.vm, args.timeout, cfg, os.getpid())
    _out(text)
    return code


TOOLS: dict[str, Callable[[list[str], Behaviour, str], int]] = {
    "dcgmi": _dcgmi,
    "all_reduce_perf": _all_reduce_perf,
    "ib_write_bw": _ib_write_bw,
    "nvidia-smi": _nvidia_smi,
    "stress-ng": _stress_ng,
}


def _hang(scenario: Scenario) -> int:
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only sleeps until it is killed
        try:
            time.sleep(HANG_S)
        finally:
            os._exit(0)
    record_pids(scenario, os.getpid(), child)
    _out("working...\n")
    time.sleep(HANG_S)
    return 0


def main(tool: str, argv: list[str], env: Mapping[str, str] = os.environ) -> int:
    """Run fake ``tool`` with ``argv``; returns the exit status."""
    try:
        scenario = load_scenario(env)
    except ScenarioError as exc:
        _err(f"fake {tool}: {exc}\n")
        return 64
    cfg = scenario.settings(tool, node_name(env))
    if cfg.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cfg.delay_s:
        time.sleep(cfg.delay_s)
    if cfg.hang:
        return _hang(scenario)
    if cfg.garbage:
        _out(GARBAGE)
        return cfg.exit_code or 0
    code = TOOLS[tool](argv, cfg, node_name(env))
    return code if cfg.exit_code is None else cfg.exit_code
