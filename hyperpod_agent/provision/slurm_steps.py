"""The steps that put hyperpod into a site's Slurm: the include and its hook programs
(rendered from what the site's slurm.conf already sets, read when the step runs), the
plugstack line, job_submit.lua, and the reconfigure that makes slurmctld read them.

The local cluster is configured by these same steps (localcluster/files.py), so every
drill runs on the configuration an admin gets.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

from hyperpod_agent.provision import hooks
from hyperpod_agent.provision.commands import last_line, run_command
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.models import ProvisioningParameters
from hyperpod_agent.provision.site import SiteSlurm, read_site
from hyperpod_agent.provision.steps import (
    BEGIN,
    END,
    Change,
    Context,
    File,
    ManagedBlock,
    Step,
    StepError,
)


class SiteFile(File):
    """A file rendered from the site's slurm.conf as it is when the step runs."""

    def __init__(
        self, path: Path, conf: Path, render: Callable[[SiteSlurm], str], mode: int = 0o644
    ) -> None:
        super().__init__(path, b"", mode)
        self.conf, self.render = conf, render

    def desired(self, current: bytes | None) -> bytes:
        return self.render(read_site(self.conf)).encode()


class LuaBlock(ManagedBlock):
    """A managed block in a Lua file: the markers are Lua comments."""

    begin = "--" + BEGIN.removeprefix("#")
    end = "--" + END.removeprefix("#")


class JobSubmitLua(File):
    """job_submit.lua: ours whole when there is none (or ours is there); our function
    chained in front of the site's, in a managed block, when the site has its own."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, hooks.JOB_SUBMIT, 0o644)
        self._block = LuaBlock(path, hooks.JOB_SUBMIT_CHAIN)
        self.name = f"file {path}"

    def _site_owned(self, current: bytes | None) -> bool:
        if current is None:
            return False
        ours = hooks.JOB_SUBMIT_MARKER.encode() in current
        return not ours or self._block.begin.encode() in current

    def desired(self, current: bytes | None) -> bytes:
        if self._site_owned(current):
            return self._block.desired(current)
        return hooks.JOB_SUBMIT.encode()

    def inspect(self, ctx: Context) -> Change | None:
        change = super().inspect(ctx)
        if change is not None and self._site_owned(self._current()):
            what = f"chain hyperpod in front of the site's slurm_job_submit: {change.summary}"
            return Change(what, change.diff)
        return change

    def _current(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None


class SiteConf(Step):
    """The site's slurm.conf is there to merge with (Slurm must be configured first),
    and its PlugStackConfig, if it names one, is the file our line goes to: Slurm
    reads one plugstack file, and a line elsewhere would never load."""

    def __init__(self, conf: Path, plugstack: Path) -> None:
        self.conf, self.plugstack = conf, plugstack
        self.name = f"site {conf}"

    def inspect(self, ctx: Context) -> Change | None:
        named = read_site(self.conf).get("PlugStackConfig")
        if named is not None and Path(named) != self.plugstack:
            raise StepError(
                f"slurm.conf sets PlugStackConfig={named}, but hyperpod's plugin line goes "
                f"to {self.plugstack} (slurm.conf_dir): move your plugins' lines there, or "
                "set slurm.conf_dir to that file's directory"
            )
        return None

    def apply(self, ctx: Context) -> None:  # pragma: no cover - inspect never asks
        raise StepError("nothing to apply")


class Reconfigure(Step):
    """``scontrol reconfigure`` once any of ``watched`` changed, so the running
    slurmctld (and through it every slurmd) reads the new include. A slurmctld that
    is not running yet reads it when it starts: that is logged, not a failure."""

    optional = True

    def __init__(self, conf: Path, watched: list[str], timeout: float = 60.0) -> None:
        self.conf, self.watched, self.timeout = conf, watched, timeout
        self.name = "scontrol reconfigure"
        self._done = False

    def inspect(self, ctx: Context) -> Change | None:
        if self._done or not (ctx.changed & set(self.watched)):
            return None
        return Change("Slurm's configuration changed: make the daemons read it")

    def apply(self, ctx: Context) -> None:
        env = {**(ctx.env or os.environ), "SLURM_CONF": str(self.conf)}
        proc = run_command(["scontrol", "reconfigure"], self.timeout, env=env)
        if proc.returncode != 0:
            raise StepError(
                f"scontrol reconfigure: {last_line(proc)} (slurmctld reads the new "
                "configuration when it starts; or run `scontrol reconfigure` then)"
            )
        self._done = True


def slurm_steps(params: ProvisioningParameters, lay: Layout, reconfigure: bool) -> list[Step]:
    """Everything of hyperpod in the site's Slurm configuration, in order. The include
    line is added last, once every file it names exists."""
    conf_dir = lay.slurm_conf_dir
    conf = conf_dir / "slurm.conf"
    hook = {
        "health-check": hooks.health_check_script,
        "prolog": hooks.prolog_script,
        "epilog-slurmctld": hooks.epilog_script,
    }
    files: list[Step] = [
        *(
            SiteFile(lay.libexec / name, conf, partial(render, lay), 0o755)
            for name, render in hook.items()
        ),
        JobSubmitLua(conf_dir / "job_submit.lua"),
        SiteFile(conf_dir / "hyperpod.conf", conf, lambda s: hooks.hyperpod_conf(params, lay, s)),
        ManagedBlock(conf, f"include {conf_dir / 'hyperpod.conf'}\n", must_exist=True),
    ]
    steps = [SiteConf(conf, conf_dir / "plugstack.conf"), *files]
    if reconfigure:
        steps.append(Reconfigure(conf, [s.name for s in files]))
    return steps


def node_hook_steps(lay: Layout) -> list[Step]:
    """A configless node has no slurm.conf to read the site's hooks from: its wrappers
    run ours alone, and the controller's include refuses a site hook they would drop."""
    none = SiteSlurm()
    return [
        File(lay.libexec / "health-check", hooks.health_check_script(lay, none), 0o755),
        File(lay.libexec / "prolog", hooks.prolog_script(lay, none), 0o755),
    ]
