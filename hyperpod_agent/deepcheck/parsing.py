"""Helpers shared by the tool parsers."""

from __future__ import annotations

import math


class ParseError(ValueError):
    """A tool printed something we do not understand. The check becomes UNKNOWN:
    output we cannot read says nothing about the node."""


def number(token: str, what: str) -> float:
    """``token`` as a finite float; ParseError naming ``what`` otherwise."""
    try:
        value = float(token)
    except ValueError:
        raise ParseError(f"{what}: not a number: {token[:40]!r}") from None
    if not math.isfinite(value):
        raise ParseError(f"{what}: not a finite number: {token[:40]!r}")
    return value


def integer(token: str, what: str) -> int:
    """``token`` as a non-negative int; ParseError naming ``what`` otherwise."""
    if not token.isdigit():
        raise ParseError(f"{what}: not a count: {token[:40]!r}")
    return int(token)


def and_more(items: list[str], sep: str = ", ", shown: int = 1) -> str:
    """The first ``shown`` items, then "(+N more)" for the rest."""
    head = sep.join(items[:shown])
    rest = len(items) - shown
    return f"{head} (+{rest} more)" if rest > 0 else head
