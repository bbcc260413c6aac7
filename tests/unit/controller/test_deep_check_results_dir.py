"""The check job runs ``<results_dir>/<run>/check.sh`` as root on every node checked:
a results directory someone else can write (or replace, or point elsewhere) is root
for them. Such a directory is refused at config load and again before each run, and
the run's files are made without following a symlink or reusing a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_deep_check_runner import SUITE, World
from test_orphans import ATTACKER

from hyperpod_agent.controller.config import parse_config
from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.deepcheck.outcomes import judge_node, write_script
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.errors import ConfigError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(SUITE)
    return path


def deep(tmp_path: Path, results: Path) -> DeepCheckConfig:
    return DeepCheckConfig(suite=suite(tmp_path), results_dir=results)


def refused(tmp_path: Path, results: Path) -> str:
    with pytest.raises(ValidationError) as info:
        deep(tmp_path, results)
    return str(info.value)


# --- at config load ------------------------------------------------------------------


def test_a_results_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir(mode=0o755)
    results.chmod(0o777)
    assert f"results_dir: {results} is writable by others (mode 777)" in refused(tmp_path, results)
    results.chmod(0o775)  # a group is others too
    assert "writable by others" in refused(tmp_path, results)
    results.chmod(0o755)
    assert deep(tmp_path, results).results_dir == results


def test_a_results_dir_below_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "results").mkdir(mode=0o755)
    assert f"{shared} is writable by others" in refused(tmp_path, shared / "results")


def test_sticky_directories_are_safe_only_above_one_that_exists(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    # a user could make tmp/results (or a symlink of that name) before the first run
    assert f"{tmp} is writable by others" in refused(tmp_path, tmp / "results")
    (tmp / "results").mkdir(mode=0o755)
    assert deep(tmp_path, tmp / "results").results_dir == tmp / "results"


@needs_root
def test_a_results_dir_owned_by_a_user_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir(mode=0o755)
    os.chown(results, ATTACKER, ATTACKER)
    assert f"{results} is owned by uid {ATTACKER}, not root" in refused(tmp_path, results)


@needs_root
def test_a_symlink_a_user_owns_on_the_way_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert deep(tmp_path, link / "results").results_dir == link / "results"  # root's link
    os.lchown(link, ATTACKER, ATTACKER)
    assert f"{link} is a symlink owned by uid {ATTACKER}" in refused(tmp_path, link / "results")


def test_a_symlink_is_judged_where_it_leads(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to("open")  # relative
    assert f"{open_dir} is writable by others" in refused(tmp_path, link / "results")


def test_a_file_where_the_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results").write_text("")
    assert "is not a directory" in refused(tmp_path, tmp_path / "results" / "x")


def test_a_results_dir_that_does_not_exist_yet_is_fine_below_safe_directories(
    tmp_path: Path,
) -> None:
    assert deep(tmp_path, tmp_path / "a" / "b" / "results").results_dir.name == "results"
    assert DeepCheckConfig(suite=suite(tmp_path)).results_dir_problem() is None  # /var/lib


def test_without_a_suite_deep_checks_are_off_and_the_dir_is_not_looked_at(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)
    assert DeepCheckConfig(results_dir=results).suite is None


def test_the_config_file_error_names_the_file_and_the_key(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)
    text = f'[deep_checks]\nsuite = "{suite(tmp_path)}"\nresults_dir = "{results}"\n'
    with pytest.raises(ConfigError, match=r"controller\.toml: deep_checks: .*results_dir: "):
        parse_config(text, Path("/etc/hyperpod/controller.toml"))


# --- at run time --------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path, store: Store) -> World:
    return World(tmp_path, store)


def test_a_results_dir_opened_up_after_load_stops_the_run_with_the_cause(
    world: World,
) -> None:
    world.deep.results_dir.mkdir(mode=0o755)
    world.deep.results_dir.chmod(0o777)  # after the config was loaded
    rid = world.plan(["node4"], "spare")
    world.step()
    world.step()
    run = world.run(rid)
    assert run.phase == "done" and "writable by others" in run.error
    assert "cannot write the check job" in run.error
    assert not [c for c in world.slurm.calls if c[0] == "submit"]
    assert world.slurm.nodes["node4"].reason == "hyperpod:spare"  # back where it was
    assert "deep_check_failed" in world.kinds()


def test_check_sh_planted_as_a_symlink_is_replaced_not_followed(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    name = world.run(rid).reservation
    victim = world.deep.results_dir.parent / "victim"
    victim.write_text("precious\n")
    run_dir = world.deep.results_dir / name
    run_dir.mkdir(parents=True)
    (run_dir / "check.sh").symlink_to(victim)
    world.step()
    assert victim.read_text() == "precious\n"
    script = run_dir / "check.sh"
    assert not script.is_symlink() and script.read_text().startswith("#!/bin/sh")
    assert script.stat().st_mode & 0o777 == 0o755


def test_a_run_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    cfg = deep(tmp_path, tmp_path / "results")
    run_dir = tmp_path / "results" / "hyperpod-check-1-1"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o777)
    with pytest.raises(ConfigError, match=r"hyperpod-check-1-1 \(uid 0, mode 777\) must be root's"):
        write_script(cfg, "hyperpod-check-1-1", "#!/bin/sh\n")
    assert not (run_dir / "check.sh").exists()


def test_a_run_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    cfg = deep(tmp_path, tmp_path / "results")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "hyperpod-check-1-1").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_script(cfg, "hyperpod-check-1-1", "#!/bin/sh\n")
    assert list(elsewhere.iterdir()) == []


def test_a_result_that_is_a_symlink_is_unknown(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    run = world.run(rid)
    out = world.deep.results_dir / run.reservation
    world.result(rid, "node1", CheckOutcome.OK)
    (out / "node4.json").symlink_to(out / "node1.json")
    outcome = judge_node(run, "node4", world.deep.results_dir, None, world.now)
    assert outcome.outcome == "UNKNOWN" and "unreadable" in outcome.cause
