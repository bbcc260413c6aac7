"""Whatever Slurm prints, the parsers answer with data or a typed error, never a crash."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm.parse import (
    expand_hostlist,
    parse_kv_line,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats()
    | st.text(max_size=12)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=5,
)
_NODE_FIELDS = [
    "state",
    "state_flags",
    "partitions",
    "port",
    "boot_time",
    "reason",
    "reason_set_by_user",
    "reason_changed_at",
    "slurmd_start_time",
    "address",
]
_JOB_FIELDS = [
    "nodes",
    "restart_cnt",
    "admin_comment",
    "exit_code",
    "requeue",
    "start_time",
    "end_time",
    "state_reason",
    "user_name",
    "name",
    "batch_host",
    "partition",
    "comment",
]
# Objects that get past the identity checks, so every other field is really exercised.
_nodes = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=6).filter(str.strip)},
    optional={k: _json for k in _NODE_FIELDS},
)
_jobs = st.fixed_dictionaries(
    {
        "job_id": st.integers(min_value=1, max_value=10**7),
        "job_state": st.sampled_from(["RUNNING", "FAILED", "PENDING", ["COMPLETED"]]),
    },
    optional={k: _json for k in _JOB_FIELDS},
)
_slow = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])


def _doc(key: str, items: list[Any]) -> str:
    return json.dumps({"meta": {}, "errors": [], key: items})


@_slow
@given(st.lists(_nodes, min_size=1, max_size=3))
def test_sinfo_fields_of_any_type(items: list[dict[str, Any]]) -> None:
    try:
        nodes = parse_sinfo_json(_doc("nodes", items))
    except SlurmParseError:
        return
    assert all(n.name for n in nodes)


@_slow
@given(st.lists(_jobs, min_size=1, max_size=3))
def test_squeue_fields_of_any_type(items: list[dict[str, Any]]) -> None:
    try:
        jobs = parse_squeue_json(_doc("jobs", items))
    except SlurmParseError:
        return
    assert all(j.job_id > 0 and j.state for j in jobs)


@_slow
@given(st.sampled_from(_NODE_FIELDS), _json)
def test_each_sinfo_field_alone(key: str, value: Any) -> None:
    try:
        parse_sinfo_json(_doc("nodes", [{"name": "n1", key: value}]))
    except SlurmParseError as exc:
        assert f"node n1.{key} is " in str(exc)


@_slow
@given(st.sampled_from(_JOB_FIELDS), _json)
def test_each_squeue_field_alone(key: str, value: Any) -> None:
    try:
        parse_squeue_json(_doc("jobs", [{"job_id": 1, "job_state": "FAILED", key: value}]))
    except SlurmParseError as exc:
        assert f"job 1.{key}" in str(exc) or "bad node list" in str(exc)


@given(_json)
def test_any_json_document(doc: Any) -> None:
    for parser in (parse_sinfo_json, parse_squeue_json):
        try:
            parser(json.dumps(doc))
        except SlurmError:
            pass


@given(st.text(max_size=60))
def test_any_text_as_hostlist(text: str) -> None:
    try:
        names = expand_hostlist(text)
    except SlurmParseError:
        return
    assert all(isinstance(n, str) and n for n in names)


@given(st.text(max_size=200))
def test_any_text_as_scontrol_output(text: str) -> None:
    for parser in (parse_scontrol_nodes, parse_scontrol_jobs):
        try:
            parser(text)
        except SlurmParseError:
            pass
    try:
        parse_kv_line(text)
    except SlurmParseError:
        pass


@given(
    st.lists(
        st.sampled_from(
            [
                "NodeName=",
                "State=",
                "Reason=",
                "Port=",
                "BootTime=",
                "Partitions=",
                "x",
                " ",
                "[",
                "]",
                "@",
                "2026-11-22T06:39:46",
                "1",
                "-",
                "+DRAIN",
                "(null)",
                ",",
            ]
        ),
        max_size=30,
    )
)
def test_key_value_soup(parts: list[str]) -> None:
    for prefix, parser in (
        ("NodeName=n ", parse_scontrol_nodes),
        ("JobId=1 ", parse_scontrol_jobs),
    ):
        try:
            parser(prefix + "".join(parts))
        except SlurmParseError:
            pass
