"""perftest bandwidth reports (`ib_write_bw` and the other `*_bw` tools).

After the connection banner the client prints a header naming the unit,
`` #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]`` with
``--report_gbits``, else ``[MiB/sec]`` (``[MB/sec]`` in older releases; both are 2^20
bytes a second), then one row per message size. Errors (no device, no connection) go to
stderr and no table is printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement
from hyperpod_agent.deepcheck.parsing import ParseError, integer, number

_HEADER = re.compile(r"#bytes\s.*BW average\[(Gb/sec|MiB/sec|MB/sec)\]")

# bytes per second of one unit; Gb is 10^9 bits
_BYTES_PER_S = {"Gb/sec": 1e9 / 8, "MiB/sec": 1048576.0, "MB/sec": 1048576.0}


@dataclass(frozen=True)
class IbRow:
    size: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float


@dataclass(frozen=True)
class IbReport:
    unit: str
    rows: tuple[IbRow, ...]


def to_gbps(value: float, unit: str) -> float:
    """A bandwidth in ``unit`` as Gb/s (10^9 bits a second)."""
    return value * _BYTES_PER_S[unit] * 8 / 1e9


def parse_ib_bw(text: str) -> IbReport:
    """The result table; ParseError when there is none."""
    unit: str | None = None
    rows: list[IbRow] = []
    for line in text.splitlines():
        if unit is None:
            if header := _HEADER.search(line):
                unit = header[1]
            continue
        tokens = line.split()
        if len(tokens) >= 5 and tokens[0].isdigit():
            rows.append(
                IbRow(
                    size=integer(tokens[0], "#bytes"),
                    iterations=integer(tokens[1], "#iterations"),
                    bw_peak=number(tokens[2], "BW peak"),
                    bw_average=number(tokens[3], "BW average"),
                    msg_rate_mpps=number(tokens[4], "MsgRate"),
                )
            )
    if unit is None:
        raise ParseError("no result table")
    if not rows:
        raise ParseError("no result row under the table header")
    return IbReport(unit, tuple(rows))


def judge_ib(report: IbReport, min_gbps: float) -> Judgement:
    """The largest message size's average bandwidth against the floor (small messages
    measure latency, not the link)."""
    row = max(report.rows, key=lambda r: r.size)
    avg = to_gbps(row.bw_average, report.unit)
    figures: dict[str, float] = {
        "bw_avg_gbps": avg,
        "bw_peak_gbps": to_gbps(row.bw_peak, report.unit),
        "msg_rate_mpps": row.msg_rate_mpps,
        "size_bytes": row.size,
    }
    sign, outcome = (">=", CheckOutcome.OK) if avg >= min_gbps else ("<", CheckOutcome.FAIL)
    cause = f"ib_write_bw {avg:.1f} Gb/s {sign} floor {min_gbps:g} Gb/s at {row.size} B"
    return Judgement(outcome, cause, figures)
