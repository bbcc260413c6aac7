"""`nvidia-smi nvlink --status`: one ``GPU <i>: <name> (UUID: ...)`` line per GPU, then
``\t Link <n>: <speed> GB/s`` for an active link or ``\t Link <n>: <inactive>``.

A link counts as up only on positive evidence (a bandwidth figure): a status string we
have never seen is not read as healthy, nor as broken, but as UNKNOWN.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hyperpod_agent.deepcheck.model import CheckOutcome, Judgement, one_line
from hyperpod_agent.deepcheck.parsing import ParseError, and_more

_GPU = re.compile(r"^GPU (\d+): (.*)$")
_LINK = re.compile(r"^Link (\d+): (.*)$")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GB/s$")


@dataclass
class NvlinkGpu:
    index: int
    name: str
    # link -> GB/s, or None when the link is inactive
    links: dict[int, float | None] = field(default_factory=dict)
    unrecognised: dict[int, str] = field(default_factory=dict)


def parse_nvlink_status(text: str) -> list[NvlinkGpu]:
    """Every GPU with its links; ParseError when no GPU line is found."""
    gpus: list[NvlinkGpu] = []
    for raw in text.splitlines():
        line = raw.strip()
        if gpu := _GPU.match(line):
            gpus.append(NvlinkGpu(int(gpu[1]), gpu[2]))
            continue
        link = _LINK.match(line)
        if link is None or not gpus:
            continue
        number, status = int(link[1]), link[2].strip()
        if speed := _SPEED.match(status):
            gpus[-1].links[number] = float(speed[1])
        elif status == "<inactive>":
            gpus[-1].links[number] = None
        else:
            gpus[-1].unrecognised[number] = status
    if not gpus:
        raise ParseError("no GPU line")
    return gpus


def judge_nvlink(gpus: list[NvlinkGpu], expected_links_per_gpu: int | None) -> Judgement:
    """FAIL naming every inactive GPU link (or a GPU short of the expected count);
    UNKNOWN on a status we do not understand."""
    up = sum(1 for g in gpus for bw in g.links.values() if bw is not None)
    inactive = [f"GPU {g.index} link {n}" for g in gpus for n, bw in g.links.items() if bw is None]
    figures: dict[str, float] = {"gpus": len(gpus), "links_up": up, "links_inactive": len(inactive)}
    if inactive:
        return Judgement(
            CheckOutcome.FAIL, one_line("nvlink inactive: " + ", ".join(inactive)), figures
        )
    short = [
        f"GPU {g.index} has {n} links up, expected {expected_links_per_gpu}"
        for g in gpus
        if expected_links_per_gpu is not None
        and (n := sum(1 for bw in g.links.values() if bw is not None)) < expected_links_per_gpu
    ]
    if short:
        return Judgement(CheckOutcome.FAIL, one_line("nvlink: " + and_more(short)), figures)
    odd = [
        f"GPU {g.index} link {n} status not understood: {s!r}"
        for g in gpus
        for n, s in g.unrecognised.items()
    ]
    if odd:
        return Judgement(CheckOutcome.UNKNOWN, one_line("nvlink: " + and_more(odd)), figures)
    return Judgement(CheckOutcome.OK, f"{up} links up on {len(gpus)} GPUs", figures)
