"""``hyperpod simulate``: projected goodput (ETTR) of one large job on a cluster."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from hyperpod_agent.simulate import plots, run
from hyperpod_agent.simulate.faults import ParametricModel
from hyperpod_agent.simulate.inputs import InputsError, load_inputs
from hyperpod_agent.simulate.ledger import PHASES
from hyperpod_agent.simulate.result import Result, Scenario, Strategy
from hyperpod_agent.simulate.run import DEFAULT_RATE, FaultSource, make_faults
from hyperpod_agent.simulate.sweep import DEFAULT_INTERVALS, default_spares, recommend, run_sweep
from hyperpod_agent.simulate.trace import TraceError


def _table(results: list[Result]) -> str:
    lines = [
        f"{'strategy':<20} {'ETTR':>7} {'GPU-h lost':>11}  "
        + " ".join(f"{p:>10}" for p in PHASES)
        + "  incidents"
    ]
    for r in results:
        phases = " ".join(f"{r.gpu_hours(r.by_phase.get(p, 0.0)):>10.0f}" for p in PHASES)
        lines.append(
            f"{r.scenario.strategy.value:<20} {r.ettr:>7.4f} {r.gpu_hours(r.lost_s):>11.0f}  "
            f"{phases}  {len(r.incidents)}"
        )
    return "\n".join(lines)


def _causes(results: list[Result]) -> str:
    causes = sorted({c for r in results for c in r.by_cause})
    head = f"{'GPU-h lost by cause':<20} " + " ".join(f"{c:>13}" for c in causes)
    rows = [
        f"{r.scenario.strategy.value:<20} "
        + " ".join(f"{r.gpu_hours(r.by_cause.get(c, 0.0)):>13.0f}" for c in causes)
        for r in results
    ]
    return "\n".join([head, *rows])


@click.command("simulate")
@click.option(
    "--nodes",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="nodes in the cluster: the job's and the spare pool",
)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--days", type=click.FloatRange(min=0, min_open=True, max=3650), default=30.0, show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True, max=10_000),
    default=None,
    help=f"faults per 1,000 node-days [default: {DEFAULT_RATE:g}; with --trace and "
    "no --rate, the trace's own]",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="a fault trace in the StepFun format [default: the vendored "
    "data/stepfun-fault-trace/fault_trace.json]",
)
@click.option("--parametric", is_flag=True, help="the parametric fault model, not the trace")
@click.option(
    "--cv",
    type=click.FloatRange(min=0, min_open=True, max=10),
    default=1.0,
    show_default=True,
    help="--parametric: inter-arrival CV (1 Poisson, >1 bursty)",
)
@click.option(
    "--lemons",
    type=(float, float),
    default=(0.0, 0.0),
    show_default=True,
    metavar="NODES FAULTS",
    help="--parametric: share of lemon nodes and the share of faults they carry, e.g. 0.05 0.25",
)
@click.option(
    "--strategy",
    "strategies",
    type=click.Choice([s.value for s in Strategy]),
    multiple=True,
    help="repeatable [default: all four]",
)
@click.option(
    "--checkpoint-interval",
    type=click.FloatRange(min=1),
    default=1800.0,
    show_default=True,
    help="seconds of training between checkpoints",
)
@click.option(
    "--spares",
    type=click.IntRange(min=0),
    default=None,
    help="spare nodes (of --nodes) [default: 2 % of the nodes]",
)
@click.option("--sweep", is_flag=True, help="sweep checkpoint interval and spares; recommend")
@click.option(
    "--target",
    type=click.FloatRange(min=0, max=1),
    default=0.95,
    show_default=True,
    help="--sweep: the ETTR to reach",
)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout")
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="write PNG plots here (needs the plots extra)",
)
@click.option(
    "--inputs",
    "inputs_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="component durations [default: the shipped inputs.json]",
)
def simulate_cmd(
    nodes: int, gpus_per_node: int, days: float, seed: int, rate: float | None,
    trace_path: Path | None, parametric: bool, cv: float, lemons: tuple[float, float],
    strategies: tuple[str, ...], checkpoint_interval: float, spares: int | None, sweep: bool,
    target: float, as_json: bool, plots_dir: Path | None, inputs_path: Path | None,
) -> None:  # fmt: skip
    """Project the goodput (ETTR) of one job on all non-spare nodes, under real faults
    (the StepFun trace, or a parametric model) and the controller's own decisions."""
    if parametric and trace_path is not None:
        raise click.UsageError("--trace and --parametric exclude each other")
    if not parametric and (cv != 1.0 or lemons != (0.0, 0.0)):
        raise click.UsageError("--cv and --lemons apply to --parametric only")
    if spares is None:
        spares = round(0.02 * nodes)
    if spares >= nodes:
        raise click.BadParameter(
            f"{spares} spares leave no node for the job", param_hint="--spares"
        )
    if plots_dir is not None:
        try:
            plots.require()
        except plots.PlotsUnavailable as exc:
            raise click.UsageError(str(exc)) from None
    try:
        inputs = load_inputs(inputs_path)
    except InputsError as exc:
        raise click.BadParameter(str(exc), param_hint="--inputs") from None
    try:
        model = ParametricModel(cv=cv, lemon_nodes=lemons[0], lemon_faults=lemons[1])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lemons") from None
    source = FaultSource(
        rate=rate if (rate is not None or trace_path is not None) else DEFAULT_RATE,
        trace_path=trace_path,
        parametric=model if parametric else None,
    )
    chosen = [Strategy(s) for s in strategies] or list(Strategy)
    base = Scenario(nodes, spares, gpus_per_node, days, checkpoint_interval, chosen[0], seed)
    try:
        faults = make_faults(base, source, inputs)
    except TraceError as exc:
        raise click.BadParameter(str(exc), param_hint="--trace") from None
    results = [run.simulate(replace(base, strategy=s), inputs, faults=faults) for s in chosen]
    out: dict[str, Any] = {"results": [r.to_dict() for r in results]}
    if sweep:
        pools = sorted({*default_spares(nodes), spares})
        points = run_sweep(base, chosen, DEFAULT_INTERVALS, pools, inputs, source, faults)
        recs = recommend(points, target)
        out["sweep"] = [vars(p) | {"strategy": p.strategy.value} for p in points]
        out["recommendations"] = [r.to_dict() for r in recs]
    if plots_dir is not None:
        written = [str(plots.plot_timeline(r, plots_dir, min(days, 30.0))) for r in results]
        if sweep:
            title = f"{nodes} nodes x {gpus_per_node} GPUs, {days:g} days"
            written += [str(p) for p in plots.plot_sweep(points, plots_dir, title)]
        out["plots"] = written
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(
        f"{nodes} nodes x {gpus_per_node} GPUs ({spares} spares), {days:g} days, seed {seed}, "
        f"{len(faults)} faults ({'parametric' if parametric else 'trace'})"
    )
    click.echo(_table(results))
    click.echo(_causes(results))
    if sweep:
        for r in recs:
            verdict = "reaches" if r.met else "best found, short of"
            click.echo(
                f"{r.strategy.value}: {r.spares} spares, checkpoint every "
                f"{r.interval_s / 60:g} min -> ETTR {r.ettr:.4f} ({verdict} {target:g})"
            )
    for path in out.get("plots", []):
        click.echo(f"wrote {path}")


simulate = simulate_cmd  # the name cli.py registers
