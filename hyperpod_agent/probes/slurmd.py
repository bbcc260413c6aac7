"""The slurmd probe: MUNGE and this node's slurmd answer, under the right name.

- MUNGE: a credential round trip, ``munge -n`` piped into ``unmunge``, on the socket
  Slurm uses (``munge_socket``, else ``AuthInfo=socket=…`` from slurm.conf, else
  MUNGE's default). Every Slurm RPC depends on it.
- slurmd: ``scontrol show slurmd`` sends an authenticated request to the slurmd and
  prints its answer; that is the one check that proves slurmd *answers* (a pid file
  or an open port also pass for a frozen slurmd). ``SLURMD_NODENAME`` makes builds
  with several slurmd per host ask the one of this node (at its NodeAddr:Port from
  slurm.conf); other builds ignore it and ask the local slurmd.
- identity: the ``Hostname`` slurmd reports (its ``NodeName``) must match the agent's
  node name (short forms compared), so a node never vouches for another. A mismatch
  is the agent's configuration, not the node's health (typically ``NodeHostname``
  differs from ``NodeName`` and ``node_name`` was left at the host name): a reboot
  cannot mend it, so it is a configuration finding that never drains or reboots.
  Builds with several slurmd per host find the slurmd by the agent's node name: there
  a name slurm.conf does not have leaves scontrol without an address, the same
  configuration finding.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

from pydantic import Field, model_validator

from hyperpod_agent.errors import SlurmError, SlurmTimeout
from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig
from hyperpod_agent.slurm.client import SlurmClient

log = logging.getLogger(__name__)


class SlurmdConfig(ProbeConfig):
    """``[probes.slurmd]``."""

    interval_s: float = Field(default=15.0, gt=0, le=3600)
    munge: bool = True
    munge_socket: str | None = Field(default=None, pattern=r"^/")
    slurmd: bool = True
    check_hostname: bool = True
    command_timeout_s: float = Field(default=3.0, gt=0, le=60)
    munge_bin: str = "munge"
    unmunge_bin: str = "unmunge"
    scontrol_bin: str = "scontrol"

    @model_validator(mode="after")
    def _fits(self) -> SlurmdConfig:
        # munge, unmunge and scontrol run one after the other
        if 3 * self.command_timeout_s >= self.timeout_s:
            raise ValueError(
                f"3 x command_timeout_s ({self.command_timeout_s}) must be below timeout_s "
                f"({self.timeout_s})"
            )
        return self


_AUTHINFO = re.compile(r"^\s*AuthInfo\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)


def parse_authinfo_socket(slurm_conf_text: str) -> str | None:
    """The ``socket=`` of ``AuthInfo`` in a slurm.conf, if any."""
    for match in _AUTHINFO.finditer(slurm_conf_text):
        for item in match.group(1).split(","):
            key, _, value = item.partition("=")
            if key.strip().lower() == "socket" and value:
                return value.strip()
    return None


def parse_key_values(text: str) -> dict[str, str]:
    """``Key   = value`` lines (``scontrol show slurmd``, ``unmunge``'s ``KEY: value``)."""
    values = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([^=:]+?)\s*[=:]\s*(.*?)\s*$", line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def short_name(host: str) -> str:
    return host.split(".", 1)[0]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


# What scontrol prints when it has no address for SLURMD_NODENAME (Slurm 22.05). Only
# builds with several slurmd per host route by that name; there a node_name that is no
# NodeName of slurm.conf (nor a node slurmctld knows an address for) leaves the request
# without an address: the agent's configuration, never a dead slurmd.
_NO_ADDRESS = re.compile(r"family = 0, port = 0|Address family '0' not supported")


def no_address(stderr: str) -> bool:
    """Whether scontrol's ``stderr`` says it had no address to send the request to."""
    return _NO_ADDRESS.search(stderr) is not None


def first_error(stderr: str) -> str:
    """The first ``prog: error: why`` line of Slurm's stderr, without its prefix: the
    last line is often a generic summary (``slurm_load_slurmd_status: No error``)."""
    for line in stderr.splitlines():
        _, sep, why = line.partition("error: ")
        if sep and why.strip():
            return why.strip()[:200]
    return _last_line(stderr)


class SlurmdProbe(Probe[SlurmdConfig]):
    name = "slurmd"
    config_model = SlurmdConfig

    _mismatch_logged: tuple[str, str] | None = None

    def check(self) -> Outcome:
        """One MUNGE round trip and one ``scontrol show slurmd``."""
        findings: list[Finding] = []
        parts = []
        if self.config.munge:
            finding = self._munge()
            if finding is not None:
                findings.append(finding)
            parts.append("munge ok" if finding is None else "munge failed")
        if self.config.slurmd:
            slurmd_findings, summary = self._slurmd()
            findings.extend(slurmd_findings)
            parts.append(summary)
        return Outcome.from_findings(findings, ok_message=", ".join(parts) or "nothing checked")

    # --- munge -------------------------------------------------------------------------------

    def munge_socket(self) -> str | None:
        """The socket to test: configured, else slurm.conf's AuthInfo, else the default."""
        if self.config.munge_socket is not None:
            return self.config.munge_socket
        conf = self.context.slurm_conf
        if conf is None:
            return None
        try:
            return parse_authinfo_socket(Path(conf).read_text(encoding="utf-8"))
        except OSError:
            return None

    def _munge(self) -> Finding | None:
        socket = self.munge_socket()
        extra = ["--socket", socket] if socket else []
        cfg = self.config
        try:
            encoded = self._run([cfg.munge_bin, "-n", *extra], None)
            if encoded.returncode != 0:
                return _munge_fail(f"munge: {_last_line(encoded.stderr) or 'failed'}")
            decoded = self._run([cfg.unmunge_bin, *extra], encoded.stdout)
        except subprocess.TimeoutExpired as exc:
            return _munge_fail(f"{Path(str(exc.cmd[0])).name}: no answer within {exc.timeout:g}s")
        status = parse_key_values(decoded.stdout).get("STATUS", "")
        if decoded.returncode != 0 or not status.startswith("Success"):
            why = status or _last_line(decoded.stderr) or f"exit {decoded.returncode}"
            return _munge_fail(f"unmunge: {why}")
        return None

    def _run(self, argv: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        # A missing binary raises FileNotFoundError: an agent setup problem -> UNKNOWN.
        return subprocess.run(
            argv,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=self.config.command_timeout_s,
            check=False,
        )

    # --- slurmd ------------------------------------------------------------------------------

    def _slurmd(self) -> tuple[list[Finding], str]:
        node = self.context.node_name
        client = SlurmClient(
            self.context.slurm_conf,
            timeout=self.config.command_timeout_s,
            env={**os.environ, "SLURMD_NODENAME": node},
        )
        try:
            out = client.show_slurmd(self.config.scontrol_bin)
        except SlurmTimeout:
            why = f"no answer within {self.config.command_timeout_s:g}s"
            return [_slurmd_fail("slurmd_unresponsive", why)], "slurmd not answering"
        except SlurmError as exc:
            if exc.returncode is None:
                raise  # scontrol or slurm.conf missing: the agent's setup, not the node
            if no_address(exc.stderr):
                return [self._unknown_name(node)], "slurmd not asked"
            why = first_error(exc.stderr) or f"scontrol exit {exc.returncode}"
            return [_slurmd_fail("slurmd_down", why)], "slurmd down"
        info = parse_key_values(out)
        if "Slurmd PID" not in info:
            raise SlurmError(["scontrol", "show", "slurmd"], 0, out, "unexpected output")
        summary = f"slurmd pid {info['Slurmd PID']} answers"
        reported = info.get("Hostname", "")
        if self.config.check_hostname and reported and short_name(reported) != short_name(node):
            return [self._name_mismatch(short_name(reported), node)], summary
        return [], summary

    def _name_mismatch(self, reported: str, node: str) -> Finding:
        why = (
            f"slurmd is NodeName {reported!r} but the agent runs as node_name {node!r} "
            f'(NodeHostname differs from NodeName?): set node_name = "{reported}" in '
            "agent.toml, or check_hostname = false"
        )
        return self._config_node_name(why, (reported, node))

    def _unknown_name(self, node: str) -> Finding:
        why = (
            f"Slurm has no address for node_name {node!r}: no NodeName {node!r} in "
            "slurm.conf (NodeHostname differs from NodeName?), or its NodeAddr does not "
            "resolve: set node_name to this node's NodeName in agent.toml"
        )
        return self._config_node_name(why, ("", node))

    def _config_node_name(self, why: str, names: tuple[str, str]) -> Finding:
        if self._mismatch_logged != names:
            self._mismatch_logged = names
            log.warning("slurmd probe: configuration error: %s", why)
        return Finding(
            component="slurmd",
            code="config_node_name",
            status=Status.WARN,
            action=Action.NONE,
            message=why,
        )


def _munge_fail(message: str) -> Finding:
    return Finding(
        component="munge",
        code="munge_failed",
        status=Status.FAIL,
        action=Action.REBOOT,
        message=message,
    )


def _slurmd_fail(code: str, message: str) -> Finding:
    return Finding(
        component="slurmd", code=code, status=Status.FAIL, action=Action.REBOOT, message=message
    )
