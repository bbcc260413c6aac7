"""PNG plots of a sweep and of one run's timeline (matplotlib: the ``plots`` extra).

matplotlib is imported only here and only when a plot is asked for; without it the
caller gets :class:`PlotsUnavailable`, whose message names the extra to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hyperpod_agent.simulate.result import Result
from hyperpod_agent.simulate.sweep import Point

INSTALL_HINT = (
    'plots need matplotlib (the "plots" extra): pip install "hyperpod-agent[plots]"; '
    "in a checkout: .venv/bin/pip install -e '.[plots]'"
)
# Small PNGs for the docs: about 70 KB a figure.
DPI = 100


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotsUnavailable(INSTALL_HINT) from None
    matplotlib.use("Agg")  # files only, never a display
    return importlib.import_module("matplotlib.pyplot")


def require() -> None:
    """Fail early (before a long run) when plots cannot be drawn."""
    _pyplot()


def _save(plt: Any, fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_sweep(points: Sequence[Point], out: Path, title: str) -> list[Path]:
    """ETTR against checkpoint interval (at the largest pool) and against spares (at the
    best interval of each pool), one line per strategy."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    strategies = list(dict.fromkeys(p.strategy for p in points))
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in strategies:
        mine = [p for p in points if p.strategy is s]
        pool = max(p.spares for p in mine)
        xs = sorted((p.interval_s, p.ettr) for p in mine if p.spares == pool)
        ax.plot(
            [x / 60 for x, _ in xs], [y for _, y in xs], marker="o", label=f"{s} ({pool} spares)"
        )
    ax.set_xscale("log")
    written.append(
        _save(
            plt,
            fig,
            ax,
            out / "ettr_vs_interval.png",
            "checkpoint interval (minutes)",
            "ETTR",
            title,
        )
    )
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in strategies:
        mine = [p for p in points if p.strategy is s]
        pools = sorted({p.spares for p in mine})
        best = [max(p.ettr for p in mine if p.spares == n) for n in pools]
        ax.plot(pools, best, marker="o", label=str(s))
    written.append(
        _save(
            plt,
            fig,
            ax,
            out / "ettr_vs_spares.png",
            "spare nodes in the pool",
            "ETTR (best interval)",
            title,
        )
    )
    return written


def plot_timeline(result: Result, out: Path, days: float = 30.0) -> Path:
    """One simulated month: spares in the pool, ready ones, nodes out; incidents marked
    with the time the job lost to each (fault -> productive again)."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in result.timeline if r[0] <= days]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    top.step([r[0] for r in rows], [r[1] for r in rows], where="post", label="spares in the pool")
    top.step([r[0] for r in rows], [r[2] for r in rows], where="post", label="of them ready")
    top.step([r[0] for r in rows], [r[3] for r in rows], where="post", label="nodes out of service")
    top.set_ylabel("nodes")
    top.legend(fontsize=8)
    top.grid(True, alpha=0.3)
    incs = [i for i in result.incidents if i.at / 86400.0 <= days]
    bottom.vlines(
        [i.at / 86400.0 for i in incs], 0, [(i.down_s + i.recompute_s) / 60 for i in incs]
    )
    bottom.set_yscale("symlog")
    bottom.set_ylabel("job minutes lost")
    bottom.set_xlabel("day")
    bottom.grid(True, alpha=0.3)
    s = result.scenario
    top.set_title(
        f"{s.strategy}: {s.job_nodes} job nodes + {s.spares} spares, ETTR {result.ettr:.3f}"
    )
    path = out / f"timeline_{s.strategy}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
