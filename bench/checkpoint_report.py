"""Report of bench/checkpoint.py: the markdown tables and the figures against the targets,
printed from the rows the benchmark measured."""

from __future__ import annotations

import statistics
from typing import Any

FS_ROW = "hyperpod (memory+peer+persistent)"
S3_ROW = "hyperpod (memory+peer+S3)"

Rows = list[tuple[str, int, dict[str, Any]]]


def print_report(rows: Rows) -> None:
    """Every table of a run: per method, per restore tier, against the targets, per save
    tier."""
    print()
    print(
        f"| {'method':36} | {'size':>8} | {'blocked ms':>10} | {'durable GB/s':>12} | "
        f"{'load GB/s':>9} |"
    )
    print(f"|{'-' * 38}|{'-' * 10}:|{'-' * 11}:|{'-' * 13}:|{'-' * 10}:|")
    for name, mib, r in rows:
        print(
            f"| {name:36} | {mib:>4} MiB | {r['blocked ms']:>10.1f} | "
            f"{r['durable GB/s']:>12.2f} | {r['load GB/s']:>9.2f} |"
        )
    print_tiers(rows, "restore (hyperpod), tier", "restore s", "seconds", ".3f")
    print()
    print("Against the targets (hyperpod):")
    for name, mib, r in rows:
        if "paired ceiling GB/s" not in r:
            continue
        ceil, ours, writer = r["paired ceiling GB/s"], r["paired durable GB/s"], r["writer GB/s"]
        pairs = ", ".join(f"{d / c:.0%} of {c:.2f}" for d, c in zip(ours, ceil, strict=True))
        top, median = max(ceil), statistics.median(ceil)
        what = "write+fsync" if name == FS_ROW else "one upload of the same size"
        print(
            f"  {name}, {mib} MiB: durable save / {what} measured just before it: "
            f"{pairs}; best {max(ours):.2f} vs {top:.2f} GB/s ({max(ours) / top:.0%}), "
            f"median {statistics.median(ours):.2f} vs {median:.2f} GB/s "
            f"({statistics.median(ours) / median:.0%}); once staged, the writer reaches best "
            f"{max(writer):.2f} GB/s ({max(writer) / top:.0%}), median "
            f"{statistics.median(writer):.2f} GB/s ({statistics.median(writer) / median:.0%}); "
            f"blocked median {r['blocked median ms']:.1f} ms; all tiers "
            f"{r['all tiers GB/s']:.2f} GB/s"
            + (
                f"; peer restore {r['peer speedup']:.1f}x faster than the emulated slow "
                "persistent store"
                if "peer speedup" in r
                else ""
            )
        )
    print_tiers(rows, "save (hyperpod), durable in tier", "tier GB/s", "GB/s", ".2f")


def print_tiers(
    rows: list[tuple[str, int, dict[str, Any]]], title: str, key: str, unit: str, fmt: str
) -> None:
    """One markdown table of a per-tier figure of our rows."""
    print()
    print(f"| {'persistent tier':15} | {title:56} | {'size':>8} | {unit:>8} |")
    print(f"|{'-' * 17}|{'-' * 58}|{'-' * 10}:|{'-' * 9}:|")
    for name, mib, r in rows:
        where = "S3" if name == S3_ROW else "directory"
        for tier, v in r.get(key, {}).items():
            print(f"| {where:15} | {tier:56} | {mib:>4} MiB | {v:>8{fmt}} |")
