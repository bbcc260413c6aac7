"""The suite file: defaults, order, levels, and one-line errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hyperpod_agent.deepcheck.config import (
    DcgmCheck,
    IbCheck,
    NcclCheck,
    StressCheck,
    Suite,
    load_suite,
)
from hyperpod_agent.errors import ConfigError

DOCS = Path(__file__).resolve().parents[3] / "docs" / "deep-checks.md"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_suite(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'suite.toml'}: ")
    return message


MINIMAL = """
[[checks]]
name = "dcgm-quick"
kind = "dcgm"
diag_level = 2
levels = ["quick"]
"""


def test_minimal_suite_has_working_defaults(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, MINIMAL))
    assert suite.stop_on_fail is False
    assert suite.kill_grace_s == 2.0
    assert suite.output_limit_bytes == 4 * 1024 * 1024
    (check,) = suite.checks
    assert isinstance(check, DcgmCheck)
    assert (check.executable, check.diag_level, check.gating) == ("dcgmi", 2, True)
    assert check.timeout_s == 600  # level 2 runs about two minutes


@pytest.mark.parametrize(("level", "timeout"), [(1, 120), (2, 600), (3, 3600), (4, 10800)])
def test_dcgm_time_limit_follows_the_level(level: int, timeout: float) -> None:
    check = DcgmCheck.model_validate({"name": "d", "kind": "dcgm", "diag_level": level})
    assert check.timeout_s == timeout
    explicit = DcgmCheck.model_validate(
        {"name": "d", "kind": "dcgm", "diag_level": level, "timeout_s": 5}
    )
    assert explicit.timeout_s == 5


def test_order_is_kept_and_levels_select(tmp_path: Path) -> None:
    suite = load_suite(
        write(
            tmp_path,
            """
stop_on_fail = true
[[checks]]
name = "stress"
kind = "stress"
[[checks]]
name = "dcgm-full"
kind = "dcgm"
diag_level = 3
levels = ["full"]
[[checks]]
name = "nccl"
kind = "nccl"
min_busbw_gbps = 150
gating = false
""",
        ),
    )
    assert [c.name for c in suite.checks] == ["stress", "dcgm-full", "nccl"]
    assert [c.name for c in suite.at_level("quick")] == ["stress", "nccl"]
    assert [c.name for c in suite.at_level("full")] == ["stress", "dcgm-full", "nccl"]
    stress = suite.checks[0]
    assert isinstance(stress, StressCheck)
    assert (stress.cpu, stress.vm, stress.duration_s, stress.verify) == (0, 2, 60, True)
    assert stress.timeout_s == 120
    nccl = suite.checks[2]
    assert isinstance(nccl, NcclCheck)
    assert nccl.args == ["-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
    assert not nccl.gating


def test_ib_defaults_to_loopback(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, '[[checks]]\nname = "ib"\nkind = "ib"\nmin_ib_gbps = 350\n'))
    check = suite.checks[0]
    assert isinstance(check, IbCheck)
    assert (check.peer, check.port, check.device) == (None, None, None)
    assert "--report_gbits" in check.args


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL.replace("diag_level", "dieg_level"), r"checks\.0\.dcgm\.dieg_level: Extra inputs"),
        (MINIMAL.replace("diag_level = 2", "diag_level = 5"), r"checks\.0\.dcgm\.diag_level: .*4"),
        (MINIMAL.replace("diag_level = 2", "diag_level = [2]"), r"checks\.0\.dcgm\.diag_level: "),
        (
            '[[checks]]\nname = "n"\nkind = "nccl"\n',
            r"checks\.0\.nccl\.min_busbw_gbps: Field required",
        ),
        (
            '[[checks]]\nname = "i"\nkind = "ib"\nmin_ib_gbps = -1\n',
            r"checks\.0\.ib\.min_ib_gbps: ",
        ),
        ('[[checks]]\nname = "x"\nkind = "gpu-burn"\n', r"checks\.0: .*'kind'"),
        ('[[checks]]\nname = "x"\n', r"checks\.0: .*'kind'"),
        (
            MINIMAL.replace('["quick"]', '["medium"]'),
            r"checks\.0\.dcgm\.levels\.0: .*'quick' or 'full'",
        ),
        (MINIMAL + MINIMAL, r"checks: duplicate check names: dcgm-quick"),
        ("checks = []\n", r"checks: List should have at least 1 item"),
        (MINIMAL + "stop_on_failure = true\n", r"checks\.0\.dcgm\.stop_on_failure"),
        ("stop_on_failure = true\n" + MINIMAL, r"stop_on_failure: Extra inputs"),
        (
            '[[checks]]\nname = "s"\nkind = "stress"\nduration_s = 60\ntimeout_s = 30\n',
            r"checks\.0\.stress: .*timeout_s \(30\) must exceed duration_s \(60\)",
        ),
        (
            '[[checks]]\nname = "s"\nkind = "script"\npath = "check.sh"\n',
            r"checks\.0\.script\.path: .*absolute",
        ),
        ('[[checks]]\nname = "has space"\nkind = "stress"\n', r"checks\.0\.stress\.name: "),
        ("[[checks]\n", r"invalid TOML"),
    ],
)
def test_malformed_suite_is_one_line_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert re.search(expected, error_of(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_suite(tmp_path / "absent.toml")


def test_example_suite_in_the_docs_is_valid(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, "docs/deep-checks.md has no toml example"
    suite = load_suite(write(tmp_path, blocks[0]))
    assert suite.at_level("quick") and suite.at_level("full")
    assert isinstance(suite, Suite)
