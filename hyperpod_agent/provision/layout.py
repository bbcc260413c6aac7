"""Where provisioning puts things, optionally relocated under a prefix.

With a prefix every path hyperpod owns (its config, venv, logs, state, the plugin and
Slurm's config directory) moves under it, *and* the files written refer to the moved
paths, so a prefix is a self-contained install that tests can run. Paths the parameters
name for things outside hyperpod (mount points, checkpoint roots, the reboot program)
are used as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hyperpod_agent.provision.models import ProvisioningParameters


@dataclass(frozen=True)
class Layout:
    """Every path of a provisioned node."""

    prefix: Path | None
    slurm_conf_dir: Path
    plugin_dir: Path
    statedir: Path

    @classmethod
    def for_params(cls, params: ProvisioningParameters, prefix: Path | None) -> Layout:
        """The layout the parameters ask for, relocated under ``prefix``."""

        def rel(path: str) -> Path:
            return relocate(prefix, path)

        return cls(
            prefix=prefix,
            slurm_conf_dir=rel(params.slurm.conf_dir),
            plugin_dir=rel(params.slurm.plugin_dir),
            statedir=rel(params.slurm.auto_resume.statedir),
        )

    def path(self, absolute: str) -> Path:
        """``absolute`` under the prefix (itself without one)."""
        return relocate(self.prefix, absolute)

    @property
    def etc(self) -> Path:
        return self.path("/etc/hyperpod")

    @property
    def venv(self) -> Path:
        return self.path("/opt/hyperpod/venv")

    @property
    def libexec(self) -> Path:
        return self.path("/opt/hyperpod/libexec")

    @property
    def log_dir(self) -> Path:
        return self.path("/var/log/hyperpod")

    @property
    def state_dir(self) -> Path:
        return self.path("/var/lib/hyperpod")

    @property
    def run_dir(self) -> Path:
        return self.path("/run/hyperpod")

    @property
    def systemd_dir(self) -> Path:
        return self.path("/etc/systemd/system")

    @property
    def fstab(self) -> Path:
        return self.path("/etc/fstab")

    @property
    def hyperpod_bin(self) -> Path:
        return self.venv / "bin" / "hyperpod"

    @property
    def plugin(self) -> Path:
        return self.plugin_dir / "auto_resume.so"


def relocate(prefix: Path | None, absolute: str) -> Path:
    """Join an absolute path under ``prefix``: ``(/p, /etc/x)`` -> ``/p/etc/x``."""
    pure = PurePosixPath(absolute)
    if not pure.is_absolute():
        raise ValueError(f"{absolute!r} is not an absolute path")
    if prefix is None:
        return Path(pure)
    return prefix.joinpath(*pure.parts[1:])
