"""Benchmark and projections of the goodput simulator (hyperpod simulate).

    .venv/bin/python bench/simulate.py --speed            # CPU seconds, events per second
    .venv/bin/python bench/simulate.py --projection --plots docs/img
    .venv/bin/python bench/simulate.py --projection --sizes 12500 --rates 6.5   # one row

--speed runs the two benchmark rows: 2,048 nodes x 365 days (target under 60 s on one
core) and 12,500 nodes x 365 days (target under 10 minutes), each strategy in turn, at
3.8 faults per 1,000 node-days from the vendored trace.

--projection prints the docs/goodput.md table: ETTR at 2,048 and 12,500 nodes (x 8 GPUs)
at 2.3, 3.8 and 6.5 faults per 1,000 node-days for the four strategies (one simulated
month, seed 1, 5 % of the nodes as spares, checkpoints every 30 minutes); with --plots,
the sweep plots (2,048 nodes, 3.8, two weeks) and the timeline of the month (matplotlib:
.venv/bin/pip install -e '.[plots]').
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hyperpod_agent.simulate import plots  # noqa: E402
from hyperpod_agent.simulate.inputs import load_inputs  # noqa: E402
from hyperpod_agent.simulate.result import Scenario, Strategy  # noqa: E402
from hyperpod_agent.simulate.run import FaultSource, make_faults, simulate  # noqa: E402
from hyperpod_agent.simulate.sweep import (  # noqa: E402
    DEFAULT_INTERVALS,
    default_spares,
    recommend,
    run_sweep,
)

SIZES = (2048, 12500)
RATES = (2.3, 3.8, 6.5)
SPARE_SHARE = 0.05


def speed(sizes: list[int], days: float, strategies: list[Strategy]) -> None:
    inputs = load_inputs()
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores, shared)")
    print("| nodes | days | strategy | faults | events | CPU s | events/s | decide calls |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for nodes in sizes:
        base = Scenario(nodes, round(0.02 * nodes), 8, days, 1800.0, Strategy.SLURM, seed=1)
        faults = make_faults(base, FaultSource(rate=3.8), inputs)
        for strategy in strategies:
            t0 = time.process_time()
            r = simulate(replace(base, strategy=strategy), inputs, faults=faults)
            cpu = time.process_time() - t0
            print(
                f"| {nodes:,} | {days:g} | {strategy} | {len(faults):,} | {r.events:,} | "
                f"{cpu:.1f} | {r.events / cpu:,.0f} | {r.decide_calls + r.step_decisions:,} |",
                flush=True,
            )


def projection(
    days: float,
    plots_dir: Path | None,
    sizes: tuple[int, ...] = SIZES,
    rates: tuple[float, ...] = RATES,
) -> None:
    inputs = load_inputs()
    print(
        f"{days:g} days, seed 1, {SPARE_SHARE:.0%} spares, checkpoint every 30 min, "
        "faults from the vendored trace rescaled to each rate"
    )
    print("| GPUs | nodes (spares) | faults / 1,000 node-days | " + " | ".join(Strategy) + " |")
    print("|---|---|---:|" + "---:|" * len(Strategy))
    month = None
    for nodes in sizes:
        spares = round(SPARE_SHARE * nodes)
        for rate in rates:
            base = Scenario(nodes, spares, 8, days, 1800.0, Strategy.SLURM, seed=1)
            faults = make_faults(base, FaultSource(rate=rate), inputs)
            results = [simulate(replace(base, strategy=s), inputs, faults=faults) for s in Strategy]
            cells = " | ".join(f"{r.ettr:.3f}" for r in results)
            print(f"| {nodes * 8:,} | {nodes:,} ({spares}) | {rate:g} | {cells} |", flush=True)
            if nodes == SIZES[0] and rate == 3.8:
                month = results
    if plots_dir is None:
        return
    if month is None:
        raise SystemExit("--plots needs the 2,048-node row at 3.8 (the month it draws)")
    for r in month:
        print(f"wrote {plots.plot_timeline(r, plots_dir, days)}")
    nodes = SIZES[0]
    base = Scenario(nodes, 0, 8, 14.0, 1800.0, Strategy.SLURM, seed=1)
    source = FaultSource(rate=3.8)
    pools = sorted({*default_spares(nodes), round(0.06 * nodes)})
    points = run_sweep(base, list(Strategy), DEFAULT_INTERVALS, pools, inputs, source)
    for rec in recommend(points, 0.95):
        print(f"sweep: {rec.to_dict()}")
    title = f"{nodes:,} nodes x 8 GPUs, 3.8 faults / 1,000 node-days, 14 days"
    for path in plots.plot_sweep(points, plots_dir, title):
        print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--sizes", default="2048,12500", help="node counts")
    ap.add_argument("--rates", default="2.3,3.8,6.5", help="--projection: faults / 1,000 node-days")
    ap.add_argument("--strategies", default=",".join(Strategy), help="--speed: strategies")
    ap.add_argument("--days", type=float, default=None, help="[365 for --speed, 30 otherwise]")
    ap.add_argument("--projection", action="store_true")
    ap.add_argument("--plots", type=Path, default=None, help="--projection: PNGs here")
    args = ap.parse_args()
    if args.plots is not None:
        try:
            plots.require()
        except plots.PlotsUnavailable as exc:
            ap.error(str(exc))
    try:
        sizes = [int(n) for n in args.sizes.split(",")]
        rates = [float(r) for r in args.rates.split(",")]
        strategies = [Strategy(s) for s in args.strategies.split(",")]
    except ValueError as exc:
        ap.error(f"--sizes, --rates or --strategies: {exc}")
    if args.speed:
        speed(sizes, args.days or 365.0, strategies)
    if args.projection:
        projection(args.days or 30.0, args.plots, tuple(sizes), tuple(rates))
    if not (args.speed or args.projection):
        ap.error("say --speed and/or --projection")


if __name__ == "__main__":
    main()
