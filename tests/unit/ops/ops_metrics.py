"""The metrics the code declares, read from the real registries (shared by the ops tests).

Built the way the daemons build them: the agent's ``AgentMetrics().registry`` (driven
once so every labelled family has samples), the controller's ``metrics.REGISTRY`` and
the checkpoint library's module-level metrics (on prometheus_client's default registry).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from hyperpod_agent.health import ProbeResult, Status, Verdict

if TYPE_CHECKING:
    from hyperpod_agent.agent.metrics import AgentMetrics

# Sample names a family of each type puts on the wire (text exposition format).
SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
# Labels the client library adds to samples, not declared by us.
_LIBRARY_LABELS = {"le", "quantile"}


@dataclass(frozen=True)
class Declared:
    """One metric family as the code declares it."""

    family: str  # name without sample suffix (a counter without _total)
    type: str
    labels: frozenset[str]
    component: str
    help: str

    @property
    def query_name(self) -> str:
        """The name to write in PromQL and in the docs: counters with ``_total``."""
        return self.family + "_total" if self.type == "counter" else self.family


def agent_metrics() -> AgentMetrics:
    """The agent's metrics, driven once so every labelled family has samples."""
    from hyperpod_agent.agent.metrics import AgentMetrics

    m = AgentMetrics()
    m.set_xid_source(lambda: {79: 2})
    result = ProbeResult(probe="gpu", status=Status.OK, duration_s=0.01, at=datetime.now(UTC))
    m.observe(result, True)
    m.set_verdict(Verdict.HEALTHY)
    return m


def _wrappers(namespace: Iterable[object]) -> list[MetricWrapperBase]:
    return [v for v in namespace if isinstance(v, MetricWrapperBase)]


def _declared(
    component: str, sources: Iterable[Collector], wrappers: Iterable[MetricWrapperBase]
) -> list[Declared]:
    # A labelled metric without children has no samples: its wrapper knows the names.
    declared = {
        fam.name: set(getattr(w, "_labelnames", ())) for w in wrappers for fam in w.describe()
    }
    out = []
    for source in sources:
        for fam in source.collect():
            seen = {k for s in fam.samples for k in s.labels} - _LIBRARY_LABELS
            labels = frozenset(declared.get(fam.name, set()) | seen)
            out.append(Declared(fam.name, fam.type, labels, component, fam.documentation))
    return out


def declared_metrics() -> list[Declared]:
    """Every metric family of the agent, the controller and the checkpoint library."""
    from hyperpod_agent.checkpoint import metrics as checkpoint
    from hyperpod_agent.controller import metrics as controller

    agent = agent_metrics()
    ckpt = _wrappers(vars(checkpoint).values())
    return (
        _declared("agent", [agent.registry], _wrappers(vars(agent).values()))
        + _declared("controller", [controller.REGISTRY], _wrappers(vars(controller).values()))
        + _declared("checkpoint", ckpt, ckpt)
    )


def exposed_names(families: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Map every sample name a set of (family name, type) exposes to its family."""
    out: dict[str, str] = {}
    for name, kind in families:
        for suffix in SUFFIXES[kind]:
            out[name + suffix] = name
    return out


def all_exported() -> dict[str, str]:
    """Every sample name the code can put on the wire -> its family."""
    return exposed_names((d.family, d.type) for d in declared_metrics())
