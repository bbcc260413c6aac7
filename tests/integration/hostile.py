"""Unprivileged Unix users for hostile-user drills, and running things as them.

The local cluster's nodes share this machine's /etc/passwd, so a user made here exists on
every node. The attacker and the victim are ordinary users: no sudo, no group of ours.
Everything an attack does goes through what such a user really has: ``setpriv`` drops
to their uid and gid before the program starts (Slurm's commands, ``hyperpod`` with its
MUNGE credential made by that uid, the file system).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ATTACKER = "hp-attacker"
VICTIM = "hp-victim"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as this user (their uid, gid and only their own groups)."""
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--reset-env",
            "--",
            *argv,
        ]

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        timeout: float = 60.0,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user with ``env`` (plus HOME, USER and a plain PATH)."""
        full = {
            **env,
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": env.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        }
        # --reset-env clears the environment: pass it back through env(1).
        argv = self.argv(["env", *(f"{k}={v}" for k, v in full.items()), *argv])
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.home,
            check=False,
        )


def ensure_user(name: str) -> User:
    """The user ``name``, made (with a home of its own) if missing. Needs root."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    home.mkdir(mode=0o755, exist_ok=True)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return User(name, entry.pw_uid, entry.pw_gid, home)


def attacker() -> User:
    return ensure_user(ATTACKER)


def victim() -> User:
    return ensure_user(VICTIM)


def user_env(cluster_env: Mapping[str, str], venv_bin: Path) -> dict[str, str]:
    """What a user's shell on the cluster has: Slurm pointed at the cluster's config and
    our commands on PATH. Nothing of root's environment beyond that."""
    keep = ("SLURM_CONF", "HYPERPOD_LOCAL_CLUSTER_DIR", "LANG")
    env = {k: v for k, v in cluster_env.items() if k in keep}
    env["PATH"] = f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"
    return env


USER_VENV = Path("/var/tmp/hyperpod-user-venv")


def user_venv(repo: Path, venv: Path = USER_VENV) -> Path:
    """A venv an unprivileged user can run, with our package and its dependencies, and
    its ``bin`` directory (``python``, ``hyperpod``).

    The project's own venv may sit on an interpreter under /root (pyenv), which other
    users cannot reach. This one is made with Debian's /usr/bin/python3 (the same 3.11
    ABI) and reads the project venv's site-packages and the repository through a .pth
    file, so nothing is installed twice.
    """
    site = next((repo / ".venv" / "lib").glob("python3.*/site-packages"))
    bindir = venv / "bin"
    if not (bindir / "python").exists():
        subprocess.run(
            ["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    ours = next((venv / "lib").glob("python3.*/site-packages"))
    (ours / "hyperpod-project.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n{repo}\n"
    )
    hyperpod = bindir / "hyperpod"
    hyperpod.write_text(f"#!{bindir / 'python'}\nfrom hyperpod_agent.cli import main\n\nmain()\n")
    hyperpod.chmod(0o755)
    for path in [venv, *venv.rglob("*")]:
        mode = path.stat(follow_symlinks=False).st_mode
        if not path.is_symlink():
            path.chmod(mode | 0o444 | (0o111 if path.is_dir() else 0))
    # The repository must be readable by other users (a clone under a private home is
    # not): say so plainly rather than fail every hostile drill on an import error.
    probe = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            str(bindir / "python"),
            "-c",
            "import hyperpod_agent.cli",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        import pytest

        pytest.skip(
            f"other users cannot run the package from {repo} (a private directory on the "
            f"way?): {probe.stderr.strip().splitlines()[-1:] or probe.returncode}"
        )
    return bindir
