"""A job's wall time as consecutive labelled parts: every second of the window gets one
label, so the productive time, the losses and the unaccounted time add up to the wall
time by construction."""

from __future__ import annotations

from collections.abc import Collection

from hyperpod_agent.controller.goodput.model import PRODUCTIVE


class Timeline:
    """``[lo, hi]`` cut into parts, each with one label; productive to begin with."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi
        self.parts: list[tuple[float, float, str]] = [(lo, hi, PRODUCTIVE)] if hi > lo else []

    def paint(
        self, start: float, end: float, label: str, over: Collection[str] = (PRODUCTIVE,)
    ) -> float:
        """Label what in ``[start, end]`` has a label in ``over`` (what was painted first
        keeps its label); returns the seconds painted."""
        start, end = max(start, self.lo), min(end, self.hi)
        if end <= start:
            return 0.0
        painted = 0.0
        out: list[tuple[float, float, str]] = []
        for a, b, old in self.parts:
            if b <= start or a >= end or old not in over:
                out.append((a, b, old))
                continue
            lo, hi = max(a, start), min(b, end)
            if a < lo:
                out.append((a, lo, old))
            out.append((lo, hi, label))
            painted += hi - lo
            if hi < b:
                out.append((hi, b, old))
        self.parts = _merged(out)
        return painted

    def take(self, after: float, before: float, seconds: float, label: str) -> tuple[float, float]:
        """Label the first ``seconds`` of productive time in ``[after, before]``; returns
        the seconds taken (less when there is not that much) and where the last ended."""
        taken, until = 0.0, after
        for a, b, old in list(self.parts):
            if taken >= seconds or a >= before:
                break
            if old != PRODUCTIVE or b <= after:
                continue
            lo = max(a, after)
            until = min(b, before, lo + seconds - taken)
            taken += self.paint(lo, until, label)
        return taken, until

    def totals(self, lo: float, hi: float) -> dict[str, float]:
        """Seconds of each label within ``[lo, hi]``."""
        out: dict[str, float] = {}
        for a, b, label in self.parts:
            if min(b, hi) > max(a, lo):
                out[label] = out.get(label, 0.0) + min(b, hi) - max(a, lo)
        return out


def _merged(parts: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Neighbours with one label joined: the list stays as short as the story."""
    out: list[tuple[float, float, str]] = []
    for a, b, label in parts:
        if out and out[-1][2] == label and out[-1][1] == a:
            out[-1] = (out[-1][0], b, label)
        else:
            out.append((a, b, label))
    return out
