"""Memory and persistent directories another user controls are never used (real second users:
``nobody`` and uid 65533, through setpriv)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, CheckpointStorageError, layout
from hyperpod_agent.shared_root import prepare_shared_root

pytestmark = pytest.mark.root

NOBODY = 65534
OTHER = 65533  # a second unprivileged user, the victim where root could not be one
REPO = Path(__file__).parents[3]


@pytest.fixture
def base(shared_tmp: Path) -> Path:
    """A directory every user can reach."""
    return shared_tmp


@pytest.fixture
def devshm(base: Path) -> Path:
    """Like /dev/shm: every user may create entries, nobody may remove another's."""
    d = base / "devshm"
    d.mkdir()
    d.chmod(0o1777)
    return d


def as_user(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as ``uid`` (its group too, no supplementary groups)."""
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-c",
            textwrap.dedent(code),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")},
        cwd="/",
    )


def make_dir_as(uid: int, path: Path, mode: int) -> None:
    out = as_user(
        uid,
        "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], int(sys.argv[2]))",
        str(path),
        str(mode),
    )
    assert out.returncode == 0, out.stderr
    assert path.stat().st_uid == uid


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_job_directory_another_user_made_first_is_not_used(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prepare_shared_root(base / "shm")
    make_dir_as(NOBODY, base / "shm" / "555", 0o777)  # waiting for job 555 of someone else
    with caplog.at_level(logging.ERROR):
        ckpt = Checkpointer(base / "p", memory_dir=base / "shm" / "555")
    try:
        assert ckpt.memory_dir is None
        assert "555: belongs to uid 65534, not to this user (uid 0)" in caplog.text
        assert ckpt.save(1, {"w": np.ones(4)}).wait() == {"persistent": "ok"}
        assert list((base / "shm" / "555").iterdir()) == [], "nothing of ours went there"
    finally:
        ckpt.close()


def test_job_and_run_directories_are_private(base: Path) -> None:
    prepare_shared_root(base / "shm")
    ckpt = Checkpointer(base / "p", memory_dir=base / "shm" / "556")
    try:
        ckpt.save(1, {"w": np.ones(4)}).wait()
        assert ckpt.memory_dir is not None
        assert mode(base / "shm" / "556") == 0o700 and mode(ckpt.memory_dir) == 0o700
    finally:
        ckpt.close()
    out = as_user(NOBODY, "import os, sys; os.listdir(sys.argv[1])", str(base / "shm" / "556"))
    assert out.returncode != 0 and "PermissionError" in out.stderr


VICTIM = """
    import sys
    from hyperpod_agent.checkpoint import Checkpointer
    import numpy as np
    c = Checkpointer(sys.argv[1], memory_dir=sys.argv[2])
    print("memory tier:", "none" if c.memory_dir is None else "yes")
    print("saved:", sorted(c.save(1, {"w": np.ones(4)}).wait()))
    c.close()
"""


def test_another_users_memory_root_costs_the_memory_tier_not_the_job(
    base: Path, devshm: Path
) -> None:
    # The first user to save on the node made the root with their umask (0755).
    root = devshm / "hyperpod-ckpt"
    make_dir_as(NOBODY, root, 0o755)
    (base / "p").mkdir()
    os.chown(base / "p", OTHER, OTHER)
    out = as_user(OTHER, VICTIM, str(base / "p"), str(root / "700"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["memory tier: none", "saved: ['persistent']"]
    assert "hyperpod-ckpt belongs to uid 65534" in out.stderr
    # The node agent, at start, takes the root over: now every user gets a memory tier.
    prepare_shared_root(root)
    assert (os.stat(root).st_uid, mode(root)) == (0, 0o1777)
    out = as_user(OTHER, VICTIM, str(base / "p"), str(root / "700"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["memory tier: yes", "saved: ['memory', 'persistent']"]


def test_the_agent_replaces_whatever_was_planted_as_the_root(base: Path, devshm: Path) -> None:
    target = base / "target"
    target.mkdir()
    out = as_user(
        NOBODY,
        "import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
        str(target),
        str(devshm / "link"),
    )
    assert out.returncode == 0, out.stderr
    (devshm / "file").write_text("x")
    for planted in ("link", "file", "missing"):
        prepare_shared_root(devshm / planted)
        st = os.lstat(devshm / planted)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and mode(devshm / planted) == 0o1777
    assert mode(target) == 0o755, "the link's target is untouched"


def test_a_memory_root_others_may_replace_is_refused(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (base / "shm").mkdir()
    (base / "shm").chmod(0o777)  # world-writable, no sticky bit
    ckpt = Checkpointer(base / "p", memory_dir=base / "shm" / "9")
    try:
        assert ckpt.memory_dir is None
        assert "is writable by others (mode 0777) without the sticky bit" in caplog.text
    finally:
        ckpt.close()


def test_a_symbolic_link_as_job_directory_is_refused(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prepare_shared_root(base / "shm")
    (base / "elsewhere").mkdir(mode=0o700)
    (base / "shm" / "10").symlink_to(base / "elsewhere")
    ckpt = Checkpointer(base / "p", memory_dir=base / "shm" / "10")
    try:
        assert ckpt.memory_dir is None and "is a symbolic link" in caplog.text
        assert list((base / "elsewhere").iterdir()) == []
    finally:
        ckpt.close()


def test_a_world_writable_checkpoint_root(base: Path) -> None:
    root = base / "checkpoints"
    root.mkdir()
    root.chmod(0o1777)
    make_dir_as(NOBODY, root / "123", 0o777)  # a future job's directory, made in advance
    with pytest.raises(CheckpointStorageError, match=r"123: belongs to uid 65534"):
        Checkpointer(root / "123", memory_dir=base / "m")
    ckpt = Checkpointer(root / "124", memory_dir=base / "m")
    try:
        assert mode(root / "124") == 0o700 and os.stat(root / "124").st_uid == 0
        ckpt.save(1, {"w": np.ones(2)}).wait()
        assert layout.scan(root / "124")[1].committed
    finally:
        ckpt.close()
    root.chmod(0o777)  # no sticky bit: anyone could rename ours away and put theirs
    with pytest.raises(CheckpointStorageError, match=r"world-writable without the sticky bit"):
        Checkpointer(root / "124", memory_dir=base / "m")


def handed_over(path: Path, uid: int) -> Path:
    """A job's directory as the SPANK plugin makes it: root's mkdir (0700), then given to
    the job's user."""
    path.mkdir(mode=0o700)
    os.chown(path, uid, uid)
    return path


@pytest.mark.parametrize("root_mode", [0o1777, 0o755])
def test_the_directories_slurmstepd_made_for_the_job_are_its_tiers(
    base: Path, root_mode: int
) -> None:
    # A checkpoint root users may write (sticky), or one only root may (the plugin then
    # makes every job's directory): both hand the job a private directory of its own.
    prepare_shared_root(base / "shm")
    memory = handed_over(base / "shm" / "600", OTHER)
    root = base / "checkpoints"
    root.mkdir()
    root.chmod(root_mode)
    persistent = handed_over(root / "600", OTHER)
    out = as_user(OTHER, VICTIM, str(persistent), str(memory))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["memory tier: yes", "saved: ['memory', 'persistent']"]
    for d in (memory, persistent):
        assert (os.stat(d).st_uid, mode(d)) == (OTHER, 0o700), "used as made, never reopened"
    assert layout.scan(persistent)[1].committed


def test_a_checkpoint_root_only_root_may_write_needs_the_plugins_directory(base: Path) -> None:
    root = base / "checkpoints"
    root.mkdir(mode=0o755)
    out = as_user(OTHER, VICTIM, str(root / "601"), str(base / "m"))
    assert out.returncode != 0
    assert "persistent tier" in out.stderr and "Permission denied" in out.stderr
    assert list(root.iterdir()) == []
