"""Inputs (component durations), the fault trace and the cause mapping."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.simulate.causes import CLASSES, TRACE_CAUSES, trace_class
from hyperpod_agent.simulate.faults import trace_faults
from hyperpod_agent.simulate.inputs import (
    DEFAULT_INPUTS,
    Distribution,
    InputsError,
    load_inputs,
    parse_distribution,
    parse_inputs,
)
from hyperpod_agent.simulate.trace import TraceError, default_trace_path, parse_trace, read_trace


def shipped() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DEFAULT_INPUTS.read_text())
    return data


def test_the_shipped_inputs_parse_and_name_a_source_for_every_figure() -> None:
    load_inputs()
    for name, entry in shipped()["components"].items():
        assert entry["source"].strip(), name
        assert (
            "docs/benchmarks.md" in entry["source"]
            or "assumption" in entry["source"]
            or ("fault_trace" in entry["source"])
        ), name


def test_percentiles_are_an_inverse_cdf() -> None:
    d = parse_distribution({"percentiles": {"50": 1.0, "90": 3.0}, "source": "x"}, "c")
    assert d.quantile(0.1) == 1.0  # flat below the lowest point
    assert d.quantile(0.7) == pytest.approx(2.0)
    assert d.quantile(0.99) == 3.0
    assert d.median == 1.0
    rng = random.Random(1)
    draws = [d.sample(rng) for _ in range(2000)]
    assert 1.0 <= min(draws) and max(draws) <= 3.0
    assert sum(draws) / len(draws) == pytest.approx(d.mean, rel=0.05)


def test_fixed_and_samples() -> None:
    assert Distribution.fixed(4.0).sample(random.Random(0)) == 4.0
    d = parse_distribution({"samples": [1, 2, 3], "source": "x"}, "c")
    assert d.mean == 2.0 and d.median == 2.0


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"value": 1.0}, "source"),
        ({"value": -1, "source": "x"}, "finite duration >= 0"),
        ({"value": "5", "source": "x"}, "number of seconds"),
        ({"value": 1, "samples": [1], "source": "x"}, "exactly one"),
        ({"samples": [], "source": "x"}, "non-empty list"),
        ({"percentiles": {"50": 2, "90": 1}, "source": "x"}, "p90 (1) is below p50 (2)"),
        ({"percentiles": {"150": 2}, "source": "x"}, "outside 0..100"),
        ({"percentiles": {"p50": 2}, "source": "x"}, "not a percentile"),
        ({"value": 1, "source": "x", "median": 2}, "unknown key(s) median"),
    ],
)
def test_bad_entries_are_named(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(InputsError, match="f.json: components.detect_s") as err:
        data = shipped()
        data["components"]["detect_s"] = entry
        parse_inputs(data, "f.json")
    assert says in str(err.value)


def test_missing_and_unknown_components(tmp_path: Path) -> None:
    data = shipped()
    del data["components"]["reboot_s"]
    data["components"]["warp_s"] = {"value": 1, "source": "x"}
    with pytest.raises(InputsError, match="missing: reboot_s"):
        parse_inputs(data, "f.json")
    del data["components"]["warp_s"]
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.raises(InputsError, match="bad.json: not JSON"):
        load_inputs(path)


def test_the_vendored_trace_is_complete() -> None:
    trace = read_trace()
    assert default_trace_path().parent.name == "stepfun-fault-trace"
    assert len(trace.histories) == 400 and trace.faults == 584
    assert trace.rate_per_1000_node_days == pytest.approx(4.195, abs=0.01)


def test_every_trace_cause_has_a_class_of_its_own() -> None:
    causes = {iv.cause for h in read_trace().histories for iv in h}
    unmapped = {c for c in causes if (c.split(": ", 1)[0], c.split(": ", 1)[1]) not in TRACE_CAUSES
                and (c.split(": ", 1)[0], "*") not in TRACE_CAUSES}  # fmt: skip
    # only the trace's own "Unknown Error" classes fall back on unknown
    assert all("Unknown" in c or "Other Failures" in c or "Test" in c for c in unmapped), unmapped
    assert trace_class("GPU", "GPU xid Error") is CLASSES["gpu_xid"]
    assert trace_class("Motherboard", "Motherboard Failed").dead


def test_parse_trace_pairs_starts_with_ends() -> None:
    ft = {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}
    events = [
        {"node_id": "a", "event_time": 1.0, "event_type": "fault_start", "fault_type": ft},
        {"node_id": "b", "event_time": 2.0, "event_type": "fault_start", "fault_type": ft},
        {"node_id": "a", "event_time": 1.5, "event_type": "fault_end", "fault_type": ft},
    ]
    trace = parse_trace(events, servers=3, days=10.0)
    spans = sorted((iv.start_d, iv.duration_d) for h in trace.histories for iv in h)
    assert spans == [(1.0, 0.5), (2.0, 8.0)]  # b never ended: to the end of the trace
    assert len(trace.histories) == 3 and trace.histories[2] == ()
    with pytest.raises(TraceError, match="event 0: unknown event_type 'oops'"):
        parse_trace([{**events[0], "event_type": "oops"}])


def test_trace_bootstrap_rescales_the_rate_not_the_repairs() -> None:
    trace = read_trace()
    rng = random.Random(3)
    faults = trace_faults(rng, trace, 4000, 200.0, 2.0)
    assert 1000.0 * len(faults) / (4000 * 200.0) == pytest.approx(2.0, rel=0.15)
    durations = sorted(f.duration for f in faults)
    assert durations[len(durations) // 2] / 86400 == pytest.approx(0.85, rel=0.5)
