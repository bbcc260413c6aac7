"""Slurm hostlist expressions: ``node[1-3,5]`` <-> ``node1 node2 node3 node5``.

Pure functions. Slurm prints node sets in this compressed form everywhere (``nodes`` in
``squeue --json``, ``NodeList=`` in ``scontrol show job``) and accepts it in every command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hyperpod_agent.errors import SlurmParseError

# An absurd range (``node[1-99999999]``) must fail fast instead of eating the memory of a daemon.
MAX_HOSTS = 100_000

_ARGV = ["hostlist"]
# [0-9], not \d: Unicode digits such as "²" are not node numbers.
_DIGITS = re.compile(r"[0-9]+")
_TRAILING_DIGITS = re.compile(r"(.*?)([0-9]+)")
_EMPTY = ("", "(null)", "None", "N/A")


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmParseError(_ARGV, f"nested '[' in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(_ARGV, f"unbalanced ']' in {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmParseError(_ARGV, f"unbalanced '[' in {expr!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(spec: str, expr: str) -> list[str]:
    """``1-3,05`` -> ``["1", "2", "3", "05"]`` keeping the zero padding of each range."""
    out: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not _DIGITS.fullmatch(lo) or (sep and not _DIGITS.fullmatch(hi)):
            raise SlurmParseError(_ARGV, f"bad range {item!r} in {expr!r}")
        if not sep:
            out.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise SlurmParseError(_ARGV, f"descending range {item!r} in {expr!r}")
        if last - first + 1 > MAX_HOSTS:
            raise SlurmParseError(_ARGV, f"range {item!r} has more than {MAX_HOSTS} hosts")
        # Slurm pads every number of a range to the width of its first bound: node[01-10].
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(first, last + 1))
    return out


def _expand_one(word: str, expr: str) -> list[str]:
    """Expand one comma-free word, possibly with several bracket groups (``r[1-2]n[1-2]``)."""
    names = [""]
    rest = word
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.find("]", open_at)
        prefix, spec, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
        numbers = _expand_range(spec, expr)
        if len(names) * len(numbers) > MAX_HOSTS:
            raise SlurmParseError(_ARGV, f"{expr!r} has more than {MAX_HOSTS} hosts")
        names = [n + prefix + num for n in names for num in numbers]
    return names


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into node names, in order, without duplicates.

    ``""`` and Slurm's ``(null)`` give ``[]``. Malformed input raises SlurmParseError.
    """
    expr = expr.strip()
    if expr in _EMPTY:
        return []
    if any(ch.isspace() for ch in expr):
        raise SlurmParseError(_ARGV, f"whitespace in hostlist {expr!r}")
    seen: dict[str, None] = {}
    for word in _split_top_level(expr):
        for name in _expand_one(word, expr):
            seen.setdefault(name, None)
            if len(seen) > MAX_HOSTS:
                raise SlurmParseError(_ARGV, f"{expr!r} has more than {MAX_HOSTS} hosts")
    return list(seen)


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    return spans


def compress_hostlist(names: Iterable[str]) -> str:
    """Compress node names into a Slurm hostlist: ``node1,node2,node3,node5`` -> ``node[1-3,5]``.

    Names are sorted and de-duplicated, as Slurm does; ``expand_hostlist`` gives them back.
    """
    # Group by (prefix, pad width); width 0 means "no zero padding".
    groups: dict[tuple[str, int], set[int]] = {}
    plain: set[str] = set()
    for name in names:
        name = name.strip()
        if not name:
            continue
        if any(ch in name for ch in "[],") or any(ch.isspace() for ch in name):
            raise SlurmParseError(_ARGV, f"not a node name: {name!r}")
        m = _TRAILING_DIGITS.fullmatch(name)
        if m is None:
            plain.add(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    # node10 fits a zero-padded group of width 2 as is: node08,node09,node10 -> node[08-10].
    for (prefix, width), nums in groups.items():
        natural = groups.get((prefix, 0))
        if width and natural:
            fits = {n for n in natural if len(str(n)) == width}
            nums |= fits
            natural -= fits
    words: list[tuple[str, int, str]] = [(p, 0, p) for p in plain]
    for (prefix, width), nums in groups.items():
        if not nums:
            continue
        spans = _ranges(sorted(nums))
        if len(spans) == 1 and spans[0][0] == spans[0][1]:
            words.append((prefix, spans[0][0], prefix + str(spans[0][0]).zfill(width)))
            continue
        body = ",".join(
            str(a).zfill(width) if a == b else f"{str(a).zfill(width)}-{str(b).zfill(width)}"
            for a, b in spans
        )
        words.append((prefix, spans[0][0], f"{prefix}[{body}]"))
    return ",".join(w for _, _, w in sorted(words))
