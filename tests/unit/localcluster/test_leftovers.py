"""What a stopped cluster left behind, looked for without its pid files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hyperpod_agent.localcluster import leftovers


def test_a_process_naming_the_directory_is_found_until_it_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    root.mkdir()
    conf = str(root / "etc" / "slurm.conf")
    nap = [sys.executable, "-c", "import time; time.sleep(30)"]
    by_arg = subprocess.Popen([*nap, conf])
    by_env = subprocess.Popen(["sleep", "31"], env={**os.environ, "SLURM_CONF": conf})
    other = subprocess.Popen([*nap, str(tmp_path / "cluster-2")])  # a prefix only
    try:
        found = leftovers.processes(root)
        assert any(f"process {by_arg.pid}: " in x and x.endswith(conf) for x in found), found
        assert any(line.startswith(f"process {by_env.pid}: sleep 31") for line in found), found
        assert not any(f"process {other.pid}:" in line for line in found), found
        # the asking process names the directory too: it is never its own leftover
        assert not any(f"process {os.getpid()}:" in line for line in found)
    finally:
        for p in (by_arg, by_env, other):
            p.kill()
            p.wait()
    assert leftovers.processes(root) == []


def test_nothing_of_an_unused_directory_and_a_prefix_that_matches_no_namespace(
    tmp_path: Path,
) -> None:
    assert leftovers.mounts(tmp_path / "never-mounted") == []
    assert leftovers.network_namespaces("hp-no-such-prefix-") == []
    assert leftovers.leftovers(tmp_path / "nothing", "hp-no-such-prefix-") == []


def test_a_mount_under_the_directory_is_found(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        return  # mounting needs root; CI runs as root
    point = tmp_path / "c" / "mnt" / "node1"
    point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", str(point)], check=True)
    try:
        assert leftovers.mounts(tmp_path / "c") == [f"mount {point.resolve()}"]
    finally:
        subprocess.run(["umount", str(point)], check=True)
    assert leftovers.mounts(tmp_path / "c") == []
