"""nccl-tests (`all_reduce_perf` and friends): the text table and its footer.

Each data row is ``size count type redop root`` then, out-of-place and in-place,
``time algbw busbw #wrong`` (#wrong is "N/A" when validation is off; with ``-I 1`` four
per-iteration columns follow each group). The footer says
``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth    : X``; the average is
over every row, both placements, in GB/s. A CUDA or NCCL call that fails prints
``<host>: Test CUDA failure <file>:<line> '<error>'`` (or "Test NCCL failure") and the
test stops there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement, one_line
from hyperpod_agent.deepcheck.parsing import ParseError, integer, number

_FAILURE = re.compile(r"^\S+: Test (CUDA|NCCL) failure \S+ (.*)$")
_FOOTER = re.compile(r"^#\s*(Out of bounds values|Avg bus bandwidth)\s*:\s*(\S+)")


@dataclass(frozen=True)
class NcclRow:
    size: int
    oop_busbw: float
    oop_wrong: float | None
    ip_busbw: float
    ip_wrong: float | None


@dataclass(frozen=True)
class NcclReport:
    rows: tuple[NcclRow, ...]
    avg_busbw_gbps: float | None
    out_of_bounds: int | None
    failure: str | None = None


def _wrong(token: str, what: str) -> float | None:
    return None if token == "N/A" else number(token, what)


def _row(tokens: list[str], per_iteration: bool) -> NcclRow:
    size = integer(tokens[0], "size")
    # time algbw busbw #wrong, then 4 per-iteration columns when -I 1 is on
    width = 8 if per_iteration else 4
    oop, ip = tokens[5 : 5 + width], tokens[5 + width : 5 + 2 * width]
    if len(ip) < 4:
        raise ParseError(f"row for {size} B has {len(tokens)} columns")
    return NcclRow(
        size=size,
        oop_busbw=number(oop[2], f"busbw at {size} B"),
        oop_wrong=_wrong(oop[3], f"#wrong at {size} B"),
        ip_busbw=number(ip[2], f"busbw at {size} B"),
        ip_wrong=_wrong(ip[3], f"#wrong at {size} B"),
    )


def parse_nccl(text: str) -> NcclReport:
    """Rows, footer and failure line; ParseError when the output stops before the
    summary without saying why."""
    rows: list[NcclRow] = []
    avg: float | None = None
    oob: int | None = None
    per_iteration = False
    for line in text.splitlines():
        stripped = line.strip()
        if failure := _FAILURE.match(stripped):
            return NcclReport(tuple(rows), avg, oob, f"{failure[1]} failure {failure[2]}")
        if stripped.startswith("#"):
            per_iteration = per_iteration or "i_min" in stripped
            if footer := _FOOTER.match(stripped):
                if footer[1] == "Avg bus bandwidth":
                    avg = number(footer[2], "Avg bus bandwidth")
                else:
                    oob = integer(footer[2], "Out of bounds values")
            continue
        tokens = stripped.split()
        if len(tokens) >= 13 and tokens[0].isdigit():
            rows.append(_row(tokens, per_iteration))
    if avg is None:
        raise ParseError(f"no 'Avg bus bandwidth' line after {len(rows)} rows")
    if not rows:
        raise ParseError("no result rows")
    return NcclReport(tuple(rows), avg, oob)


def judge_nccl(report: NcclReport, min_busbw_gbps: float) -> Judgement:
    """FAIL on a CUDA/NCCL failure, on any wrong element (data corruption) or on an
    average bus bandwidth below the floor."""
    figures: dict[str, float] = {"sizes": len(report.rows)}
    if report.rows:
        figures["max_busbw_gbps"] = max(max(r.oop_busbw, r.ip_busbw) for r in report.rows)
    if report.avg_busbw_gbps is not None:
        figures["avg_busbw_gbps"] = report.avg_busbw_gbps
    if report.failure is not None:
        return Judgement(CheckOutcome.FAIL, one_line(f"all_reduce_perf: {report.failure}"), figures)
    wrong_results = [
        (row.size, place, wrong)
        for row in report.rows
        for place, wrong in (("out-of-place", row.oop_wrong), ("in-place", row.ip_wrong))
        if wrong
    ]
    if any(r.oop_wrong is not None or r.ip_wrong is not None for r in report.rows):
        figures["wrong"] = sum(w for _, _, w in wrong_results)
    if report.out_of_bounds is not None:
        figures["out_of_bounds"] = report.out_of_bounds
    if wrong_results or report.out_of_bounds:
        if wrong_results:
            size, place, _ = wrong_results[0]
            cause = (
                f"data corruption: {figures['wrong']:.0f} wrong elements in "
                f"{len(wrong_results)} results (first at {size} B {place})"
            )
        else:
            cause = f"data corruption: {report.out_of_bounds} out of bounds values"
        return Judgement(CheckOutcome.FAIL, cause, figures)
    avg = report.avg_busbw_gbps or 0.0
    if avg < min_busbw_gbps:
        return Judgement(
            CheckOutcome.FAIL, f"busbw {avg:.1f} GB/s < floor {min_busbw_gbps:g} GB/s", figures
        )
    return Judgement(
        CheckOutcome.OK, f"busbw {avg:.1f} GB/s >= floor {min_busbw_gbps:g} GB/s", figures
    )
