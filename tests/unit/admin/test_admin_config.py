"""Where the admin CLI finds its controller: options, environment, files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyperpod_agent.admin.config import (
    SYSTEM_CONFIG,
    AdminConfig,
    candidate_files,
    read_config,
    resolve,
)
from hyperpod_agent.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def no_files(tmp_path: Path) -> dict[str, str]:
    return {"HYPERPOD_LOCAL_CLUSTER_DIR": str(tmp_path / "none")}


def test_option_beats_environment_beats_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "a.toml", '[controller]\nurl = "http://file:1"\n')
    env = {**no_files(tmp_path), "HYPERPOD_CONTROLLER_URL": "http://env:2"}
    got = resolve(url="http://opt:3", munge_socket=None, config_file=cfg, timeout=None, env=env)
    assert got.controller.url == "http://opt:3"
    got = resolve(url=None, munge_socket=None, config_file=cfg, timeout=None, env=env)
    assert got.controller.url == "http://env:2"
    got = resolve(
        url=None, munge_socket=None, config_file=cfg, timeout=None, env=no_files(tmp_path)
    )
    assert got.controller.url == "http://file:1"


def test_munge_socket_and_timeout_override_the_file(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "a.toml",
        '[controller]\nurl = "http://h:1"\ntimeout_s = 3\n[auth]\nmunge_socket = "/f.sock"\n',
    )
    env = no_files(tmp_path)
    got = resolve(url=None, munge_socket=None, config_file=cfg, timeout=None, env=env)
    assert (got.auth.munge_socket, got.controller.timeout_s) == (Path("/f.sock"), 3)
    env["HYPERPOD_MUNGE_SOCKET"] = "/env.sock"
    got = resolve(url=None, munge_socket=None, config_file=cfg, timeout=7, env=env)
    assert (got.auth.munge_socket, got.controller.timeout_s) == (Path("/env.sock"), 7)
    got = resolve(url=None, munge_socket=Path("/o.sock"), config_file=cfg, timeout=None, env=env)
    assert got.auth.munge_socket == Path("/o.sock")


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    cfg = write(tmp_path / "x.toml", '[controller]\nurl = "http://x:1"\n')
    env = {**no_files(tmp_path), "HYPERPOD_ADMIN_CONFIG": str(cfg)}
    got = resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=env)
    assert got.controller.url == "http://x:1"


def test_local_cluster_file_is_the_fallback(tmp_path: Path) -> None:
    (tmp_path / "lc" / "etc").mkdir(parents=True)
    write(
        tmp_path / "lc" / "etc" / "admin.toml",
        '[controller]\nurl = "http://127.0.0.1:9"\n[auth]\nmunge_socket = "/lc/munge.sock"\n',
    )
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(tmp_path / "lc")}
    got = resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=env)
    assert got.controller.url == "http://127.0.0.1:9"
    assert got.auth.munge_socket == Path("/lc/munge.sock")


def test_no_url_anywhere(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no controller URL: pass --url, set HYPERPOD_CONTROLLER"):
        resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=no_files(tmp_path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[controller\n", "not valid TOML"),
        ("[controller]\nurl = 5\n", "controller.url: Input should be a valid string"),
        ("[controller]\ncolour = 'red'\n", "controller.colour: Extra inputs are not permitted"),
        ("[auth]\nmode = 'kerberos'\n", "auth.mode: Input should be 'munge', 'token' or 'none'"),
        ("[auth]\nmode = 'token'\n", "auth: Value error, mode 'token' needs token_secret_file"),
    ],
)
def test_bad_file_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    cfg = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError, match=f"^{cfg}: .*{message}"):
        read_config(cfg)


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="absent.toml: No such file or directory"):
        resolve(
            url="http://h:1",
            munge_socket=None,
            config_file=tmp_path / "absent.toml",
            timeout=None,
            env=no_files(tmp_path),
        )


def test_defaults_use_munge() -> None:
    assert AdminConfig().auth.mode == "munge"


NOBODY = 65534


def local_cluster(tmp_path: Path) -> Path:
    etc = tmp_path / "lc" / "etc"
    etc.mkdir(parents=True)
    write(etc / "admin.toml", '[controller]\nurl = "http://127.0.0.1:9"\n')
    return tmp_path / "lc"


def test_the_local_cluster_is_read_only_when_named(tmp_path: Path) -> None:
    # No default directory that any local user could create and fill.
    assert candidate_files({}) == [SYSTEM_CONFIG]
    lc = local_cluster(tmp_path)
    assert candidate_files({"HYPERPOD_LOCAL_CLUSTER_DIR": str(lc)}) == [
        SYSTEM_CONFIG,
        lc / "etc" / "admin.toml",
    ]


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_a_file_others_may_write_is_not_trusted(tmp_path: Path, mode: int) -> None:
    lc = local_cluster(tmp_path)
    (lc / "etc" / "admin.toml").chmod(mode)
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(lc)}
    with pytest.raises(ConfigError, match=f"admin.toml: not trusted: .*mode {mode:04o}"):
        resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=env)


def test_a_file_owned_by_someone_else_is_not_trusted(tmp_path: Path) -> None:
    cfg = write(tmp_path / "a.toml", '[controller]\nurl = "http://file:1"\n')
    os.chown(cfg, NOBODY, NOBODY)
    with pytest.raises(
        ConfigError, match=f"a.toml: not trusted: it is owned by uid {NOBODY}, not by root or you"
    ):
        resolve(url=None, munge_socket=None, config_file=cfg, timeout=None, env={})


@pytest.mark.parametrize("owner", [0, NOBODY])
def test_a_directory_others_may_write_is_not_trusted(tmp_path: Path, owner: int) -> None:
    lc = local_cluster(tmp_path)
    os.chown(lc / "etc", owner, owner)
    (lc / "etc").chmod(0o777 if owner == 0 else 0o755)
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(lc)}
    with pytest.raises(ConfigError, match=f"not trusted: its directory {lc / 'etc'} "):
        resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=env)


def test_a_sticky_world_writable_directory_is_fine_for_a_trusted_file(tmp_path: Path) -> None:
    # Like /tmp or /var/tmp: others cannot rename or replace what they do not own.
    lc = local_cluster(tmp_path)
    (lc / "etc").chmod(0o1777)
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(lc)}
    got = resolve(url=None, munge_socket=None, config_file=None, timeout=None, env=env)
    assert got.controller.url == "http://127.0.0.1:9"


def test_a_symlink_is_judged_by_what_it_points_at(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    target = write(shared / "admin.toml", '[controller]\nurl = "http://x:1"\n')
    link = tmp_path / "admin.toml"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=f"not trusted: its directory {shared} "):
        resolve(url=None, munge_socket=None, config_file=link, timeout=None, env={})


def test_several_controllers_from_a_list_or_the_environment(tmp_path: Path) -> None:
    cfg = write(tmp_path / "a.toml", '[controller]\nurls = ["http://h1:1", "http://h2:2"]\n')
    env = no_files(tmp_path)
    got = resolve(url=None, munge_socket=None, config_file=cfg, timeout=None, env=env)
    assert got.controller.url == "http://h1:1,http://h2:2"
    env["HYPERPOD_CONTROLLER_URL"] = "http://e1:1,http://e2:2"
    got = resolve(url=None, munge_socket=None, config_file=cfg, timeout=None, env=env)
    assert got.controller.url == "http://e1:1,http://e2:2"


def test_url_and_urls_together_are_refused(tmp_path: Path) -> None:
    cfg = write(tmp_path / "a.toml", '[controller]\nurl = "http://a:1"\nurls = ["http://b:2"]\n')
    with pytest.raises(ConfigError, match="url or urls, not both"):
        read_config(cfg)
