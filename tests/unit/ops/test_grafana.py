"""docs/grafana/hyperpod.json: well-formed, and every metric it queries is one the code exports.

The exported names come from the real registries, built the way the daemons build them
(the agent's ``AgentMetrics().registry``, the controller's ``metrics.REGISTRY``, the
checkpoint library's module-level metrics), so renaming a metric in the code without
updating the dashboard fails here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ops_dashboard import DS_VAR, all_panels, expressions, load, metric_names
from ops_metrics import agent_metrics, all_exported, exposed_names
from prometheus_client import generate_latest
from prometheus_client.registry import Collector

# ---------------------------------------------------------------- helpers


def families(registry: Collector) -> list[tuple[str, str]]:
    """(name, type) of every family a registry or collector yields."""
    return [(m.name, m.type) for m in registry.collect()]


def unknown_metrics(exprs: list[tuple[str, str]], exported: dict[str, str]) -> list[str]:
    return sorted(
        f"{where}: {name}"
        for where, expr in exprs
        for name in metric_names(expr)
        if name not in exported
    )


# ---------------------------------------------------------------- the tokenizer


def test_metric_names_tokenizer() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le) (rate(hyperpod_fault_to_drain_seconds_bucket"
        '{job="hyperpod_controller", a=~"hyperpod_x|y"}[$__rate_interval])))'
        " / on() group_left hyperpod_faults_total + hyperpod_incident_mode"
    )
    assert metric_names(expr) == {
        "hyperpod_fault_to_drain_seconds_bucket",
        "hyperpod_faults_total",
        "hyperpod_incident_mode",
    }
    assert metric_names("sum(up) + $hyperpod_var") == set()


def test_exposed_names_suffix_rules() -> None:
    names = exposed_names(
        [("hyperpod_a", "counter"), ("hyperpod_b_seconds", "histogram"), ("hyperpod_c", "gauge")]
    )
    assert {
        "hyperpod_a_total",
        "hyperpod_b_seconds_bucket",
        "hyperpod_b_seconds_count",
        "hyperpod_b_seconds_sum",
        "hyperpod_c",
    } <= set(names)
    # A counter is not queryable without _total, a gauge has no buckets.
    assert "hyperpod_a" not in names and "hyperpod_c_bucket" not in names


def test_suffix_rules_match_the_wire_format() -> None:
    # Every sample name the real registries print is predicted by the suffix rules.
    from hyperpod_agent.controller import metrics as controller

    for reg in (agent_metrics().registry, controller.REGISTRY):
        text = generate_latest(reg).decode()
        on_wire = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln[:1] != "#"}
        assert on_wire and on_wire <= set(exposed_names(families(reg)))


def test_a_bogus_metric_is_caught() -> None:
    exported = all_exported()
    bad = [
        ("panel 1 'x'", "sum(rate(hyperpod_no_such_metric_total[5m]))"),
        ("panel 2 'y'", "sum(hyperpod_faults)"),  # counter without _total
        ("panel 3 'z'", "hyperpod_incident_mode_bucket"),  # gauge has no buckets
    ]
    assert unknown_metrics(bad, exported) == [
        "panel 1 'x': hyperpod_no_such_metric_total",
        "panel 2 'y': hyperpod_faults",
        "panel 3 'z': hyperpod_incident_mode_bucket",
    ]


# ---------------------------------------------------------------- the dashboard


def test_every_queried_metric_is_exported() -> None:
    exprs = expressions(load())
    assert len(exprs) > 20
    assert unknown_metrics(exprs, all_exported()) == []


@pytest.mark.parametrize(
    "family",
    [
        "hyperpod_controller_nodes",
        "hyperpod_controller_nodes_health",
        "hyperpod_incident_mode",
        "hyperpod_faults",
        "hyperpod_actions",
        "hyperpod_fault_to_drain_seconds",
        "hyperpod_requeues",
        "hyperpod_reports",
        "hyperpod_probe_status",
        "hyperpod_probe_success",
        "hyperpod_probe_duration_seconds",
        "hyperpod_node_verdict",
        "hyperpod_gpu_xid",
        "hyperpod_agent_cycles",
    ],
)
def test_dashboard_covers(family: str) -> None:
    exported = all_exported()
    used = {exported[n] for _, e in expressions(load()) for n in metric_names(e) if n in exported}
    assert family in used


def test_fault_to_drain_quantiles() -> None:
    exprs = [e for _, e in expressions(load())]
    for q in ("0.5", "0.95"):
        assert any(
            f"histogram_quantile({q}," in e and "hyperpod_fault_to_drain_seconds_bucket" in e
            for e in exprs
        )


def test_structure() -> None:
    dash = load()
    assert dash["schemaVersion"] >= 36
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": DS_VAR}, v["name"]

    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in all_panels(dash):
        where = f"panel {p['id']} {p.get('title')!r}"
        gp = p["gridPos"]
        assert {"h", "w", "x", "y"} <= set(gp), where
        assert all(isinstance(gp[k], int) and gp[k] >= 0 for k in "hwxy"), where
        assert gp["w"] >= 1 and gp["x"] + gp["w"] <= 24, where
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": DS_VAR}, where
        assert p["targets"], where
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), where
        for t in p["targets"]:
            assert t.get("datasource", p["datasource"]) == p["datasource"], where
            assert t["expr"].strip(), where


def test_no_hard_coded_datasource_uid() -> None:
    def uids(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                yield str(ds.get("uid"))
            elif isinstance(ds, str):
                yield ds
            for v in node.values():
                yield from uids(v)
        elif isinstance(node, list):
            for v in node:
                yield from uids(v)

    found = set(uids(load()))
    assert found == {DS_VAR}


def test_top_level_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], int] = {}
    for p in load()["panels"]:
        gp = p["gridPos"]
        for y in range(gp["y"], gp["y"] + gp["h"]):
            for x in range(gp["x"], gp["x"] + gp["w"]):
                assert (x, y) not in cells, f"panel {p['id']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["id"]
