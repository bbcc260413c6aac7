"""Hostlist expansion and compression, as Slurm prints and accepts them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperpod_agent.errors import SlurmParseError
from hyperpod_agent.slurm.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node1", ["node1"]),
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("node[1-2],gpu7,login", ["node1", "node2", "gpu7", "login"]),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("node[9-10]", ["node9", "node10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("node[1-2],node2,node1", ["node1", "node2"]),
        ("", []),
        ("(null)", []),
        ("  node1  ", ["node1"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("node[1-3", "unbalanced '['"),
        ("node1-3]", "unbalanced ']'"),
        ("node[3-1]", "descending range"),
        ("node[a-b]", "bad range"),
        ("node[1-]", "bad range"),
        ("node[[1-2]]", "nested"),
        ("node1 node2", "whitespace"),
        (f"node[1-{MAX_HOSTS + 1}]", "more than"),
        ("a[1-1000]b[1-1000]", "more than"),
    ],
)
def test_expand_rejects_malformed(expr: str, why: str) -> None:
    with pytest.raises(SlurmParseError, match=r"^hostlist: unexpected output: .*") as exc:
        expand_hostlist(expr)
    assert why in str(exc.value)


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["node1", "node2", "node3", "node5"], "node[1-3,5]"),
        (["node5", "node1", "node2", "node1"], "node[1-2,5]"),
        (["node1"], "node1"),
        (["node08", "node09", "node10"], "node[08-10]"),
        (["gpu2", "login", "node1", "gpu1"], "gpu[1-2],login,node1"),
        (["node9", "node10"], "node[9-10]"),
        ([], ""),
    ],
)
def test_compress(names: list[str], expr: str) -> None:
    assert compress_hostlist(names) == expr


@pytest.mark.parametrize("bad", ["node[1]", "a,b", "node 1"])
def test_compress_rejects_non_names(bad: str) -> None:
    with pytest.raises(SlurmParseError, match="not a node name"):
        compress_hostlist([bad])


_names = st.lists(
    st.builds(
        lambda prefix, num, pad: f"{prefix}{str(num).zfill(pad)}",
        st.sampled_from(["node", "gpu", "a-b", "x"]),
        st.integers(min_value=0, max_value=120),
        st.sampled_from([0, 0, 3]),
    ),
    max_size=40,
)


@given(_names)
def test_compress_then_expand_round_trips(names: list[str]) -> None:
    assert sorted(expand_hostlist(compress_hostlist(names))) == sorted(set(names))
