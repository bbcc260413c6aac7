"""What the site's own slurm.conf already sets, read so provisioning merges with it.

Provisioning appends one ``include`` of hyperpod.conf to slurm.conf; Slurm takes the
last value of a setting, so whatever the include names wins. To never silently replace
a site's hook, the include is rendered from the site's values: a setting that is a list
(``SchedulerParameters``, ``JobSubmitPlugins``) keeps the site's items and adds ours;
a program (``HealthCheckProgram``, ``Prolog``, ``EpilogSlurmctld``) becomes our
wrapper, which runs the site's program first; ``RebootProgram`` stays the site's
unless the parameters name another one, which is a conflict we refuse.

Only slurm.conf itself is read, outside hyperpod's managed block: a setting the site
keeps in another ``include`` is not seen (docs/cluster-changes.md says so).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from hyperpod_agent.provision.steps import BEGIN, END, StepError, read_if_present

# Lines with these first keys describe nodes, partitions and the like: several
# key=value pairs per line, none of them a cluster-wide setting.
_RECORD_KEYS = frozenset(
    {"nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"}
)


@dataclass(frozen=True)
class SiteSlurm:
    """The site's cluster-wide settings, keys lower-cased, the last value of each."""

    settings: dict[str, str] = field(default_factory=dict)
    # Settings given more than once (Prolog and Epilog may be on several lines in
    # newer Slurm): every value, in order.
    repeated: dict[str, list[str]] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        value = self.settings.get(key.lower())
        return value if value else None

    def all(self, key: str) -> list[str]:
        return list(self.repeated.get(key.lower(), []))


def parse_site(text: str) -> SiteSlurm:
    """The settings of a slurm.conf text, hyperpod's managed block left out."""
    settings: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if line == BEGIN:
            inside = True
            continue
        if line == END:
            inside = False
            continue
        if inside:
            continue
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().lower()
        if not key or " " in key or key in _RECORD_KEYS:
            continue
        value = _unquote(value.strip())
        settings[key] = value
        repeated.setdefault(key, []).append(value)
    return SiteSlurm(settings, repeated)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def read_site(conf: Path) -> SiteSlurm:
    """The site's settings from ``conf``; StepError if it is missing or unreadable."""
    data = read_if_present(conf)
    if data is None:
        raise StepError(f"{conf}: no such file (Slurm must be configured first)")
    try:
        return parse_site(data.decode())
    except UnicodeDecodeError:
        raise StepError(f"{conf}: not UTF-8 text") from None


def merged_list(site_value: str | None, ours: list[str], aliases: dict[str, str]) -> str:
    """A comma list: the site's items in their order, then ours that it lacks.
    ``aliases`` maps spellings of one item to one name (``job_submit/lua`` = ``lua``)."""
    items = [i.strip() for i in (site_value or "").split(",") if i.strip()]
    have = {aliases.get(i, i) for i in items}
    for item in ours:
        if aliases.get(item, item) not in have:
            items.append(item)
            have.add(aliases.get(item, item))
    return ",".join(items)


def chained(site: SiteSlurm, key: str, ours: Path) -> list[str]:
    """The site's programs for ``key`` that our wrapper must run first (never our own
    wrapper: a re-run, or a hand install that already points at it)."""
    return [p for p in site.all(key) if p and Path(p.split()[0]) != ours]


def chain_lines(programs: list[str], what: str, stop_on_failure: bool) -> str:
    """Shell lines that run the site's ``programs`` with our environment. A failing
    Prolog must still fail (``stop_on_failure``); a health check or epilog never
    stops ours."""
    lines = []
    for program in programs:
        quoted = shlex.quote(program)
        if stop_on_failure:
            lines.append(f"{quoted} || exit $?  # the site's {what}")
        else:
            lines.append(f"{quoted} || true  # the site's {what}")
    return "".join(line + "\n" for line in lines)


def reboot_program(site: SiteSlurm, ours: str, named: bool) -> str | None:
    """The ``RebootProgram`` the include sets: None keeps the site's. ``named``: the
    parameters set ``slurm.reboot_program`` explicitly."""
    theirs = site.get("RebootProgram")
    if theirs is None:
        return ours
    if named and theirs != ours:
        raise StepError(
            f"slurm.conf sets RebootProgram={theirs} and provisioning_parameters.json "
            f"slurm.reboot_program={ours}: keep one (remove the parameter to keep the site's)"
        )
    return None
