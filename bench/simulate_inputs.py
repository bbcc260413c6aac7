"""Derive the simulator's component durations from what our benchmarks recorded.

None of the benchmarks writes JSON; their figures are the tables in docs/benchmarks.md,
written by the benchmarks themselves or from their output. This reads those tables
(median and p90/p95/p99/max columns), the repair durations of the vendored fault trace and
the controller's defaults, and writes hyperpod_agent/simulate/inputs.json with the source
of every number. What no benchmark measures is marked "assumption" and says so.

    .venv/bin/python bench/simulate_inputs.py            # rewrite the shipped file
    .venv/bin/python bench/simulate_inputs.py --out x.json --check
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hyperpod_agent.controller.config import ControllerConfig  # noqa: E402
from hyperpod_agent.simulate.inputs import parse_inputs  # noqa: E402
from hyperpod_agent.simulate.trace import durations_days, read_trace  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "hyperpod_agent" / "simulate" / "inputs.json"
_NUM = re.compile(r"(\d+(?:\.\d+)?)\s*(ms)?(?:\s*\((\d+(?:\.\d+)?)\))?")


def table_row(doc: str, heading: str, label: str, nth_table: int = 0) -> dict[str, str]:
    """The cells of the row starting with ``label`` in the ``nth_table`` table under the
    heading that starts with ``heading``, by column name."""
    at = doc.find(heading)
    if at < 0:
        raise SystemExit(f"{DOC}: no heading {heading!r}")
    section = doc[at:]
    tables: list[list[str]] = []
    current: list[str] = []
    for line in section.splitlines()[1:]:
        if line.startswith("#") and tables:
            break
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    rows = tables[nth_table]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0].replace("`", "").startswith(label):
            return dict(zip(head, cells, strict=False))
    raise SystemExit(f"{DOC}: {heading!r}: no row {label!r}")


def seconds(cell: str) -> tuple[float, float | None]:
    """``7.75 (8.4)`` -> (7.75, 8.4); ``50`` in a ms column or ``56 ms`` -> seconds."""
    m = _NUM.search(cell.replace("*", ""))
    if m is None:
        raise SystemExit(f"not a figure: {cell!r}")
    scale = 0.001 if m.group(2) else 1.0
    second = float(m.group(3)) * scale if m.group(3) else None
    return float(m.group(1)) * scale, second


def where(heading: str, label: str, column: str) -> str:
    return f"docs/benchmarks.md, {heading.lstrip('# ')}: row {label!r}, column {column!r}"


def build() -> dict[str, Any]:
    doc = DOC.read_text()
    c: dict[str, Any] = {}

    h = "## XID 79 to node out, real agents"
    r = table_row(doc, h, "XID 79 -> out")
    c["detect_s"] = {
        "percentiles": {
            "50": seconds(r["p50 s"])[0],
            "95": seconds(r["p95 s"])[0],
            "100": seconds(r["max s"])[0],
        },
        "source": where(h, "XID 79 -> out", "p50 s, p95 s, max s")
        + " (bench/detect_drain.py --agents): XID written -> node out in sinfo",
    }
    h = "## Fault report to drain"
    r = table_row(doc, h, "faulty report -> drained")
    c["drain_s"] = {
        "percentiles": {
            "50": seconds(r["p50 ms"])[0] / 1000,
            "99": seconds(r["p99 ms"])[0] / 1000,
            "100": seconds(r["max ms"])[0] / 1000,
        },
        "source": where(h, "faulty report -> drained", "p50 ms, p99 ms, max ms")
        + " (bench/detect_drain.py)",
    }
    cfg = ControllerConfig()
    hb, pass_s = cfg.policy.heartbeat_timeout_s, cfg.reconcile_interval_s
    c["detect_dead_s"] = {
        "percentiles": {"0": hb, "100": hb + pass_s},
        "source": f"assumption, not benchmarked: the controller's defaults, heartbeat_timeout_s "
        f"{hb:g} s plus up to one reconcile_interval_s ({pass_s:g} s) "
        "(hyperpod_agent/controller/config.py)",
    }
    h = "### Step retry inside the allocation"
    r = table_row(doc, h, "step retry, idle cluster", nth_table=1)
    drained, again, first = (
        seconds(r["drained"]),
        seconds(r["running again"]),
        seconds(r["first new step"]),
    )
    c["step_restart_s"] = {
        "percentiles": {
            "50": round(again[0] - drained[0], 3),
            "90": round((again[1] or again[0]) - (drained[1] or drained[0]), 3),
        },
        "source": where(h, "step retry, idle cluster", "running again minus drained")
        + " (bench/recovery.py --only step-retry; second table): medians and p90s subtracted, "
        "an approximation of the difference's distribution",
    }
    c["first_step_s"] = {
        "percentiles": {
            "50": round(first[0] - again[0], 3),
            "90": round((first[1] or first[0]) - (again[1] or again[0]), 3),
        },
        "source": where(h, "step retry, idle cluster", "first new step minus running again")
        + " (the toy job's 0.25 s step included)",
    }
    r = table_row(doc, h, "requeue (", nth_table=0)
    req, again = seconds(r["requeued"]), seconds(r["running again"])
    c["requeue_restart_s"] = {
        "percentiles": {
            "50": round(again[0] - req[0], 3),
            "90": round((again[1] or again[0]) - (req[1] or req[0]), 3),
        },
        "source": where(h, "requeue (cred_expire=5), idle cluster", "running again minus requeued")
        + " (bench/recovery.py); cred_expire=5 as provisioning sets it (Slurm's default 120 "
        "adds about 115 s); an idle cluster: a busy one queued it 31 s in the same benchmark",
    }
    c["job_init_s"] = {
        "percentiles": {"10": 90.0, "50": 180.0, "90": 420.0},
        "source": "assumption, not benchmarked: a large job's start-up (process launch, "
        "framework and NCCL initialisation, data loaders) before it restores; our toy "
        "job starts in under a second. Replace with your framework's figure",
    }
    h = "## Checkpoints (bench/checkpoint.py)"
    r = table_row(doc, h, "hyperpod (memory + peer + persistent directory)")
    restore = r["restore s"]
    peer = float(re.search(r"peer (\d+(?:\.\d+)?)", restore).group(1))  # type: ignore[union-attr]
    persistent = float(re.search(r"1 GB/s (\d+(?:\.\d+)?)", restore).group(1))  # type: ignore[union-attr]
    c["restore_s"] = {
        "value": persistent,
        "source": where(h, "hyperpod (memory + peer + persistent directory)", "restore s")
        + ": 1 GiB per rank from a persistent store at 1 GB/s",
    }
    c["restore_memory_s"] = {
        "value": peer,
        "source": where(h, "hyperpod (memory + peer + persistent directory)", "restore s")
        + ": 1 GiB per rank from the peer replica (the replaced node's ranks; the others "
        "restore from memory, faster)",
    }
    c["checkpoint_block_s"] = {
        "value": seconds(r["blocked per save"])[0],
        "source": where(h, "hyperpod (memory + peer + persistent directory)", "blocked per save")
        + ": 1 GiB of state per rank",
    }
    r = table_row(doc, h, "torch.save + fsync")
    c["baseline_checkpoint_block_s"] = {
        "value": seconds(r["blocked per save"])[0],
        "source": where(h, "torch.save + fsync", "blocked per save") + ": 1 GiB per rank",
    }
    c["step_s"] = {
        "value": 10.0,
        "source": "assumption: one training step of a large job; memory checkpoints are "
        "taken once a step",
    }
    c["reboot_s"] = {
        "percentiles": {"10": 180.0, "50": 300.0, "90": 600.0},
        "source": "assumption, not benchmarked: a GPU server's reboot (firmware, OS, driver, "
        "slurmd back); the local cluster's fake reboot (3.5 s) is not one",
    }
    h = "## Recovery: fault to running again"
    r = table_row(doc, h, "Slurm alone, defaults")
    down = seconds(r["drained / node down"])
    c["slurm_detect_dead_s"] = {
        "percentiles": {"50": down[0], "90": down[1]},
        "source": where(h, "Slurm alone, defaults", "drained / node down")
        + " (bench/recovery.py): slurmd killed -> node DOWN with SlurmdTimeout=300",
    }
    c["slurm_detect_hang_s"] = {
        "value": 600.0,
        "source": "docs/benchmarks.md, Hang -> detected -> training again: PyTorch's NCCL "
        "process-group default timeout, 600 s (Slurm alone never sees a GPU or link fault: "
        "the job waits for its collective to time out)",
    }
    c["resubmit_wait_s"] = {
        "percentiles": {"10": 300.0, "50": 1800.0, "90": 14400.0, "100": 43200.0},
        "source": "assumption: a person notices the failed job and resubmits it (nights and "
        "weekends make the tail)",
    }
    trace = read_trace()
    days = durations_days(trace)
    pct = {
        str(p): round(days[min(len(days) - 1, int(p / 100 * len(days)))] * 86400.0, 1)
        for p in (0, 10, 25, 50, 75, 90, 95, 99, 100)
    }
    c["repair_s"] = {
        "percentiles": pct,
        "source": f"data/stepfun-fault-trace/fault_trace.json: fault_start -> fault_end of its "
        f"{len(days)} faults (StepFun InfiniteHBD trace, Apache-2.0); the parametric model's "
        "time out of service",
    }
    return {
        "about": "Component durations for hyperpod simulate, seconds. Generated by "
        "bench/simulate_inputs.py from docs/benchmarks.md (toy jobs on a 2-core VM, 1 GiB "
        "of checkpoint state per rank), the vendored fault trace and the controller's "
        "defaults; entries marked assumption are not measured here.",
        "components": c,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="parse the result as the simulator does")
    args = ap.parse_args()
    data = build()
    parse_inputs(data, str(args.out))  # the simulator must accept what we write
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out} ({len(data['components'])} components)")
    if args.check:
        comps = data["components"]
        figures = {k: v.get("percentiles", v.get("value")) for k, v in comps.items()}
        print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
