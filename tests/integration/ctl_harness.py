"""Runs the controller as a real subprocess against the local cluster and talks to it
over loopback HTTP with real (MUNGE) authentication."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.models import Node


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 20.0, step: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class ControllerProcess:
    """``python -m hyperpod_agent.controller.cli run`` with its own config and state."""

    def __init__(self, workdir: Path, cluster: Any, port: int, **policy: Any) -> None:
        self.workdir = workdir
        self.cluster = cluster
        self.port = port
        self.auth = AuthConfig(mode="munge", munge_socket=cluster.munge_socket)
        self.config_path = workdir / "controller.toml"
        pol = {
            "max_unhealthy_fraction": 0.5,
            "heartbeat_timeout_s": 30,
            "cooldown_s": 2,
            "retry_backoff_s": 1,
            # Act on a fault at once; shared causes have tests of their own.
            "shared_cause_window_s": 0,
            **policy,
        }
        lines = [
            f"listen_port = {port}",
            f'state_db = "{workdir / "state.db"}"',
            f'slurm_conf = "{cluster.slurm_conf}"',
            "reconcile_interval_s = 1",
            'slurm_user = "root"',  # the local cluster's SlurmUser
            "[auth]",
            'mode = "munge"',
            f'munge_socket = "{cluster.munge_socket}"',
            "[policy]",
        ]
        lines += [f"{k} = {json.dumps(v)}" for k, v in pol.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "controller.log"
        self.slurm = SlurmClient(cluster.slurm_conf)
        self._seq: dict[str, int] = {}

    def start(self, extra_env: dict[str, str] | None = None, wait: bool = True) -> None:
        env = {**self.cluster.env, **(extra_env or {})}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hyperpod_agent.controller.cli",
                    "run",
                    "--config",
                    str(self.config_path),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        if wait:
            wait_for("controller healthz", self._healthy, timeout=30)

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"controller exited {self.proc.returncode}: {self.log.read_text()[-2000:]}"
            )
        try:
            status, body = self.request("GET", "/v1/healthz", None, auth=False)
        except OSError:
            return False
        return status == 200 and body.get("last_pass_at") is not None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def request(
        self, method: str, path: str, body: Any, node: str | None = None, auth: bool = True
    ) -> tuple[int, Any]:
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        if auth:
            headers.update(ClientAuth(self.auth, node).headers(method, path, data))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=data or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def report(self, node: str, findings: list[dict[str, Any]], agent: str = "it") -> int:
        seq = self._seq.get(node, 0) + 1
        self._seq[node] = seq
        now = datetime.now(UTC).isoformat()
        body = {
            "node": node,
            "agent_id": f"{agent}-{os.getpid()}",
            "seq": seq,
            "generated_at": now,
            "verdict": "faulty" if findings else "healthy",
            # What the agent's verdict confirmed: here, every FAIL finding.
            "confirmed": [
                {"probe": "gpu", "component": f["component"], "code": f["code"]}
                for f in findings
                if f.get("status") == "FAIL"
            ],
            "results": [
                {
                    "probe": "gpu",
                    "status": "FAIL" if findings else "OK",
                    "findings": findings,
                    "at": now,
                }
            ],
        }
        status, answer = self.request("POST", "/v1/reports", body, node=node)
        assert status == 200, answer
        return status

    def events(self, node: str | None = None) -> list[dict[str, Any]]:
        path = "/v1/events?limit=1000" + (f"&node={node}" if node else "")
        status, body = self.request("GET", path, None)
        assert status == 200, body
        return list(body)

    def node(self, name: str) -> Node:
        return self.slurm.node(name)


def finding(
    code: str,
    action: str,
    component: str = "gpu0",
    urgent: bool = False,
    message: str = "injected by test",
) -> dict[str, Any]:
    return {
        "component": component,
        "code": code,
        "status": "FAIL",
        "action": action,
        "urgent": urgent,
        "message": message,
    }


def restore(cluster: Any) -> None:
    """Put every node back as the fixture promises: node1..4 idle, spares held."""
    slurm = SlurmClient(cluster.slurm_conf)
    for name in cluster.nodes:
        node = slurm.node(name)
        if node.drained or node.reason:
            try:
                slurm.resume(name)
            except Exception:  # noqa: BLE001 - already resumed by a reboot; checked below
                pass
    for name in cluster.spares:
        node = slurm.node(name)
        if node.reason != "hyperpod:spare":
            slurm.drain(name, "hyperpod:spare")
    cluster.wait_idle(list(cluster.nodes), timeout=30)
