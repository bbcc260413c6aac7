"""Where a train_ddp.py rank runs: its rank and world from the environment, the
nodes of its launch, the rendezvous host and its address, and the checkpoint library's
environment (peers, memory directory). No torch here."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
from collections.abc import Mapping


def int_env(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if env.get(name):
            return int(env[name])
    return default


def step_nodes(env: Mapping[str, str]) -> list[str]:
    """The nodes of this launch: Slurm's step node list, else the job's."""
    from hyperpod_agent.slurm.hostlist import expand_hostlist

    text = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    return list(expand_hostlist(text)) if text else []


def node_address(host: str) -> str:
    """An address to reach ``host`` at. Slurm node names need not resolve (a cluster
    that reaches its nodes by NodeAddr has no DNS entries for them): then ask Slurm
    for the node's NodeAddr."""
    try:
        socket.getaddrinfo(host, None)
        return host
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", host],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return host
    for field in out.split():
        if field.startswith("NodeAddr=") and len(field) > len("NodeAddr="):
            return field.removeprefix("NodeAddr=")
    return host


def rendezvous_host(env: Mapping[str, str]) -> str:
    """HYPERPOD_RDZV_HOST first: a MASTER_ADDR computed once in a batch script still
    names the node a step retry took out."""
    for name in ("HYPERPOD_RDZV_HOST", "MASTER_ADDR"):
        if env.get(name):
            return env[name]
    nodes = step_nodes(env)
    if not nodes:
        raise SystemExit("train_ddp: no HYPERPOD_RDZV_HOST, MASTER_ADDR or Slurm node list")
    return nodes[0]


def checkpoint_env(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """The checkpoint library's environment, with the peers and memory directory the
    options ask for."""
    out = dict(env)
    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    if args.memory_per_node is not None:
        out["HYPERPOD_CHECKPOINT_MEMORY_DIR"] = str(args.memory_per_node / node)
    if args.peer_port is not None and not env.get("HYPERPOD_CHECKPOINT_PEERS"):
        nodes = sorted(step_nodes(env))
        if len(nodes) > 1:
            out["HYPERPOD_CHECKPOINT_PEERS"] = ",".join(
                f"{n}={args.peer_host}:{args.peer_port + i}"
                if args.peer_host
                else f"{n}={n}:{args.peer_port}"
                for i, n in enumerate(nodes)
            )
            out.setdefault("HYPERPOD_CHECKPOINT_SERVE", "1")
    return out
