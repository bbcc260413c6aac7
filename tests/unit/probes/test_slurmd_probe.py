"""The slurmd probe with stand-in munge/unmunge/scontrol executables.

The stand-ins replay output captured from Slurm 22.05 and MUNGE 0.5.15; the real
daemons are exercised in tests/integration/test_probe_faults.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.slurmd import (
    SlurmdConfig,
    SlurmdProbe,
    first_error,
    no_address,
    parse_authinfo_socket,
    parse_key_values,
)

SHOW_SLURMD = """\
Active Steps             = NONE
Actual CPUs              = 2
Boot time                = 2026-11-22T06:41:16
Hostname                 = node2
Last slurmctld msg time  = NONE
Slurmd PID               = 8982
Slurmd Logfile           = /var/tmp/lab/log/slurmd-node2.log
Version                  = 22.05.8
"""
UNMUNGE_OK = """\
STATUS:          Success (0)
ENCODE_HOST:     localhost (127.0.0.1)
ENCODE_TIME:     2026-11-22 06:41:18 +0000 (1795329678)
UID:             root (0)
LENGTH:          0
"""
REFUSED = """\
scontrol: error: slurm_slurmd_info: Connection refused
slurm_load_slurmd_status: Connection refused
"""
SLURM_CONF = """\
ClusterName=lab
AuthType=auth/munge
AuthInfo=socket=/var/tmp/lab/munge/munge.sock,cred_expire=10
"""


class Fakes:
    """Shell stand-ins whose behaviour is set by files in their directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.conf.write_text(SLURM_CONF)
        self._script("munge", 'printf "%s " "$@" > {d}/munge.args\n{mode}\necho CRED:xyz', "munge")
        self._script(
            "unmunge",
            'read cred; echo "$cred" > {d}/unmunge.in\n{mode}\ncat {d}/unmunge.out',
            "unmunge",
        )
        self._script(
            "scontrol",
            'echo "$SLURMD_NODENAME $SLURM_CONF $*" > {d}/scontrol.env\n{mode}\n'
            "cat {d}/scontrol.out",
            "scontrol",
        )
        (root / "unmunge.out").write_text(UNMUNGE_OK)
        (root / "scontrol.out").write_text(SHOW_SLURMD)

    def _script(self, name: str, body: str, mode_name: str) -> None:
        mode = f"[ -f {self.root}/{mode_name}.sh ] && . {self.root}/{mode_name}.sh"
        path = self.root / name
        path.write_text("#!/bin/sh\n" + body.format(d=self.root, mode=mode) + "\n")
        path.chmod(0o755)

    def behave(self, name: str, shell: str) -> None:
        (self.root / f"{name}.sh").write_text(shell + "\n")

    def probe(self, node: str = "node2", **cfg: object) -> SlurmdProbe:
        settings = {
            "munge_bin": str(self.root / "munge"),
            "unmunge_bin": str(self.root / "unmunge"),
            "scontrol_bin": str(self.root / "scontrol"),
            "command_timeout_s": 1.0,
            **cfg,
        }
        ctx = ProbeContext(node_name=node, slurm_conf=str(self.conf))
        return SlurmdProbe(SlurmdConfig.model_validate(settings), ctx)


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    return Fakes(tmp_path)


# --- parsers -------------------------------------------------------------------------------


def test_parse_authinfo_socket() -> None:
    assert parse_authinfo_socket(SLURM_CONF) == "/var/tmp/lab/munge/munge.sock"
    assert parse_authinfo_socket("authinfo = cred_expire=5,SOCKET=/run/m.sock") == "/run/m.sock"
    assert parse_authinfo_socket("AuthInfo=cred_expire=5\n") is None
    assert parse_authinfo_socket("#AuthInfo=socket=/x\n") is None


def test_parse_key_values_both_styles() -> None:
    show = parse_key_values(SHOW_SLURMD)
    assert show["Hostname"] == "node2"
    assert show["Slurmd PID"] == "8982"
    assert show["Boot time"] == "2026-11-22T06:41:16"
    assert parse_key_values(UNMUNGE_OK)["STATUS"] == "Success (0)"


def test_first_error_skips_the_generic_summary() -> None:
    assert first_error(REFUSED) == "slurm_slurmd_info: Connection refused"
    assert first_error("just one line\n") == "just one line"
    assert first_error("") == ""


# --- probe ---------------------------------------------------------------------------------


def test_healthy(fakes: Fakes) -> None:
    out = fakes.probe().check()
    assert out.status is Status.OK, out.message
    assert out.message == "munge ok, slurmd pid 8982 answers"
    # the socket came from slurm.conf, the node name and slurm.conf reached scontrol
    assert (fakes.root / "munge.args").read_text().split() == [
        "-n",
        "--socket",
        "/var/tmp/lab/munge/munge.sock",
    ]
    assert (fakes.root / "unmunge.in").read_text().strip() == "CRED:xyz"
    assert (fakes.root / "scontrol.env").read_text().split() == [
        "node2",
        str(fakes.conf),
        "show",
        "slurmd",
    ]


def test_configured_munge_socket_wins(fakes: Fakes) -> None:
    fakes.probe(munge_socket="/run/munge/other.sock").check()
    assert "/run/munge/other.sock" in (fakes.root / "munge.args").read_text()


def test_munge_encode_failure(fakes: Fakes) -> None:
    fakes.behave("munge", "echo 'munge: Error: Failed to access \"/x\": No such file' >&2; exit 1")
    out = fakes.probe().check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.component, finding.code, finding.action) == (
        "munge",
        "munge_failed",
        Action.REBOOT,
    )
    assert "No such file" in finding.message


def test_unmunge_rejects_credential(fakes: Fakes) -> None:
    (fakes.root / "unmunge.out").write_text("STATUS:          Invalid credential (6)\n")
    fakes.behave("unmunge", f"cat {fakes.root}/unmunge.out; exit 6")
    out = fakes.probe().check()
    assert out.findings[0].code == "munge_failed"
    assert "Invalid credential" in out.findings[0].message


def test_munge_hang_is_bounded(fakes: Fakes) -> None:
    fakes.behave("munge", "exec sleep 10")
    out = fakes.probe(slurmd=False).check()
    assert out.findings[0].code == "munge_failed"
    assert "no answer within 1s" in out.findings[0].message


def test_slurmd_refusing_connections_is_down(fakes: Fakes) -> None:
    fakes.behave("scontrol", f"printf '{REFUSED}' >&2; exit 1")
    out = fakes.probe().check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.code, finding.message) == (
        "slurmd_down",
        "slurm_slurmd_info: Connection refused",
    )
    assert out.message.startswith("slurmd: ")


def test_slurmd_not_answering_in_time(fakes: Fakes) -> None:
    fakes.behave("scontrol", "exec sleep 10")
    out = fakes.probe(munge=False).check()
    assert [f.code for f in out.findings] == ["slurmd_unresponsive"]


def test_slurmd_answering_for_another_node_is_a_configuration_finding(fakes: Fakes) -> None:
    out = fakes.probe(node="node3").check()
    assert [f.code for f in out.findings] == ["config_node_name"]
    (finding,) = out.findings
    assert finding.status is Status.WARN and out.status is Status.WARN
    assert finding.action is Action.NONE and not finding.urgent
    assert "'node2'" in finding.message and 'node_name = "node2"' in finding.message
    assert fakes.probe(node="node3", check_hostname=False).check().status is Status.OK


# scontrol of a build with several slurmd per host (Debian's Slurm 22.05) when
# SLURMD_NODENAME is no NodeName of slurm.conf, captured on the local cluster.
NO_ADDRESS = """\
scontrol: error: slurm_get_port: Address family '0' not supported
scontrol: error: Error connecting, bad data: family = 0, port = 0
scontrol: error: slurm_slurmd_info: No error
slurm_load_slurmd_status: No error
"""


def test_a_node_name_slurm_has_no_address_for_is_a_configuration_finding(
    fakes: Fakes, caplog: pytest.LogCaptureFixture
) -> None:
    fakes.behave("scontrol", f'printf "{NO_ADDRESS}" >&2; exit 1')
    probe = fakes.probe(node="ip-10-0-0-2", munge=False)
    with caplog.at_level("WARNING", logger="hyperpod_agent.probes.slurmd"):
        outs = [probe.check() for _ in range(3)]
    for out in outs:
        (finding,) = out.findings
        assert (finding.code, finding.status, finding.action) == (
            "config_node_name",
            Status.WARN,
            Action.NONE,
        )
        assert not finding.urgent and out.status is Status.WARN
        assert "no NodeName 'ip-10-0-0-2' in slurm.conf" in finding.message
    assert len([r for r in caplog.records if "configuration error" in r.message]) == 1
    checked = fakes.probe(node="ip-10-0-0-2", munge=False, check_hostname=False).check()
    assert [f.code for f in checked.findings] == ["config_node_name"]


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (NO_ADDRESS, True),
        (REFUSED, False),
        ("scontrol: error: slurm_slurmd_info: Connection timed out\n", False),
        ("", False),
    ],
)
def test_no_address(stderr: str, expected: bool) -> None:
    assert no_address(stderr) is expected


def test_fqdn_and_short_names_match(fakes: Fakes) -> None:
    (fakes.root / "scontrol.out").write_text(SHOW_SLURMD.replace("= node2", "= node2.cluster"))
    assert fakes.probe(node="node2").check().status is Status.OK


def test_unexpected_scontrol_output_raises(fakes: Fakes) -> None:
    (fakes.root / "scontrol.out").write_text("something else\n")
    with pytest.raises(SlurmError):
        fakes.probe().check()


def test_missing_binaries_raise_for_the_runner(fakes: Fakes, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fakes.probe(munge_bin=str(tmp_path / "absent")).check()
    with pytest.raises(SlurmError):
        fakes.probe(munge=False, scontrol_bin=str(tmp_path / "absent")).check()


def test_missing_slurm_conf_raises(fakes: Fakes) -> None:
    fakes.conf.unlink()
    with pytest.raises(SlurmError, match="slurm.conf not found"):
        fakes.probe(munge=False).check()


def test_everything_disabled(fakes: Fakes) -> None:
    out = fakes.probe(munge=False, slurmd=False).check()
    assert (out.status, out.message) == (Status.OK, "nothing checked")


@pytest.mark.parametrize(
    "cfg",
    [{"command_timeout_s": 4, "timeout_s": 10}, {"munge_socket": "relative.sock"}, {"x": 1}],
)
def test_config_rejects_bad_values(cfg: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SlurmdConfig.model_validate(cfg)


def test_config_defaults() -> None:
    cfg = SlurmdConfig()
    assert cfg.interval_s == 15 and cfg.command_timeout_s == 3 and cfg.check_hostname
