"""File contents provisioning writes (pure renderers)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from provision_support import base_params

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.provision import render
from hyperpod_agent.provision.layout import Layout, relocate
from hyperpod_agent.provision.load import parse_parameters

PREFIX = Path("/p")


def params(**changes: object) -> object:
    data = base_params()
    data.update(changes)
    return parse_parameters(data, "params.json")


def layout(prefix: Path | None = PREFIX) -> Layout:
    return Layout.for_params(params(), prefix)  # type: ignore[arg-type]


def test_relocate() -> None:
    assert relocate(None, "/etc/x") == Path("/etc/x")
    assert relocate(Path("/p"), "/etc/x") == Path("/p/etc/x")
    assert relocate(Path("/p"), "/") == Path("/p")
    with pytest.raises(ValueError, match="not an absolute path"):
        relocate(Path("/p"), "etc/x")


def test_layout_moves_every_owned_path_under_the_prefix() -> None:
    lay = layout()
    for path in (
        lay.etc,
        lay.venv,
        lay.log_dir,
        lay.state_dir,
        lay.run_dir,
        lay.plugin,
        lay.slurm_conf_dir,
        lay.statedir,
        lay.systemd_dir,
        lay.fstab,
        lay.libexec,
    ):
        assert path.is_relative_to(PREFIX), path
    assert layout(None).plugin == Path("/opt/hyperpod/lib/auto_resume.so")
    assert layout(None).slurm_conf_dir == Path("/etc/slurm")


def test_toml_round_trip() -> None:
    data = {
        "a": 1,
        "b": 'x "quoted" \\ é\n',
        "c": [1, 2],
        "d": True,
        "e": 1.5,
        "t": {"k": "v", "sub": {"z": False}},
        "empty": {},
        "weird key": 3,
    }
    text = render.to_toml(data)
    assert tomllib.loads(text) == data
    assert text.splitlines()[0].startswith("# Written by `hyperpod provision`")


def test_toml_refuses_null() -> None:
    with pytest.raises(ValueError, match=r"^x\.y: null has no TOML form"):
        render.to_toml({"x": {"y": None}})


def test_deep_merge() -> None:
    assert render.deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": 3}, "e": 4}) == {
        "a": {"b": 1, "c": 3},
        "d": 1,
        "e": 4,
    }


def test_deep_merge_shares_nothing_with_its_inputs() -> None:
    """A caller that edits one node's rendered config must not edit every node's: the
    parameters are parsed once and rendered for many nodes."""
    base = {"probes": {"nic": {"interfaces": ["eth0"]}}}
    over = {"probes": {"disk": {"mounts": [{"path": "/scratch"}]}}, "extra": {"k": [1]}}
    out = render.deep_merge(base, over)
    out["probes"]["nic"]["interfaces"].append("roce0")
    out["probes"]["disk"]["mounts"][0]["path"] = "/elsewhere"
    out["extra"]["k"].append(2)
    assert base == {"probes": {"nic": {"interfaces": ["eth0"]}}}
    assert over == {"probes": {"disk": {"mounts": [{"path": "/scratch"}]}}, "extra": {"k": [1]}}


def test_a_rendered_agent_config_is_a_copy_of_the_parameters() -> None:
    p = params(agent_overrides={"probes": {"nic": {"interfaces": ["eth0"]}}})
    group = p.worker_groups[0]  # type: ignore[attr-defined]
    first = render.agent_config_data(p, "node2", group, layout())  # type: ignore[arg-type]
    first["probes"]["nic"]["interfaces"].append("roce0")
    again = render.agent_config_data(p, "node2", group, layout())  # type: ignore[arg-type]
    assert again["probes"]["nic"]["interfaces"] == ["eth0"]


def test_agent_config_for_a_gpu_worker_validates() -> None:
    p = params(agent_overrides={"controller": {"heartbeat_interval_s": 15}})
    group = p.worker_groups[0]  # type: ignore[attr-defined]
    data = render.agent_config_data(p, "node2", group, layout())  # type: ignore[arg-type]
    text = render.render_config("agent", data, "agent.toml", "agent_overrides")
    config = AgentConfig.model_validate(tomllib.loads(text))
    assert config.node_name == "node2"
    assert config.cache_path == Path("/p/run/hyperpod/health.json")
    assert config.probes.gpu.expected_count == 8
    assert config.controller.url == "http://127.0.0.1:28899"
    assert config.controller.heartbeat_interval_s == 15


def test_agent_config_without_gpus_disables_the_gpu_probe() -> None:
    p = params()
    group = p.worker_groups[1]  # type: ignore[attr-defined]
    data = render.agent_config_data(p, "cpu1", group, layout())  # type: ignore[arg-type]
    assert data["probes"] == {"gpu": {"enabled": False}}


def test_controller_config_listens_where_the_url_points() -> None:
    data = render.controller_config_data(params(), layout(), "head")  # type: ignore[arg-type]
    config = ControllerConfig.model_validate(data)
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 28899)
    assert config.state_db == Path("/p/var/lib/hyperpod/controller.db")
    assert config.slurm_conf == Path("/p/etc/slurm/slurm.conf")
    public = render.controller_config_data(
        params(controller_url="http://head:8787"),
        layout(),  # type: ignore[arg-type]
        "head",
    )
    assert (public["listen_host"], public["listen_port"]) == ("0.0.0.0", 8787)


def test_plugstack_line_names_the_plugin_explicitly() -> None:
    line = render.plugstack_line(
        params(slurm={"auto_resume": {"max": 5, "default": 2}}),
        layout(),  # type: ignore[arg-type]
    )
    assert line == (
        "required /p/opt/hyperpod/lib/auto_resume.so "
        "statedir=/p/var/lib/hyperpod/autoresume step_helper=/p/opt/hyperpod/venv/bin/hyperpod "
        "progress_root=/dev/shm/hyperpod-progress memory_root=/dev/shm/hyperpod-ckpt "
        "max=5 default=2\n"
    )
    assert "*" not in line


def test_fstab_block() -> None:
    p = params(
        mounts=[
            {"path": "/fsx", "type": "lustre", "source": "fs@tcp:/x"},
            {
                "path": "/data",
                "type": "other",
                "fstype": "xfs",
                "source": "/dev/sdb",
                "options": "ro",
            },
        ]
    )
    assert render.fstab_block(p) == (  # type: ignore[arg-type]
        "fs@tcp:/x /fsx lustre defaults,_netdev 0 0\n/dev/sdb /data xfs ro 0 0\n"
    )


def test_admin_config_carries_the_auth_mode() -> None:
    p = params(controller_overrides={"auth": {"mode": "none"}})
    assert render.admin_config_data(p) == {  # type: ignore[arg-type]
        "controller": {"url": "http://127.0.0.1:28899"},
        "auth": {"mode": "none"},
    }


def test_node_overrides_apply_to_their_node_only() -> None:
    data = base_params()
    data["agent_overrides"] = {"cycle_s": 5.0}
    data["node_overrides"] = {"node1": {"probes": {"gpu": {"expected_count": 4}}}}
    p = parse_parameters(data, "params.json")
    group = p.worker_groups[0]
    one = render.agent_config_data(p, "node1", group, layout())
    two = render.agent_config_data(p, "node2", group, layout())
    assert one["probes"]["gpu"]["expected_count"] == 4 and one["cycle_s"] == 5.0
    assert two["probes"]["gpu"]["expected_count"] == 8 and two["cycle_s"] == 5.0


def test_node_overrides_name_a_worker_and_are_validated() -> None:
    data = base_params()
    data["node_overrides"] = {"nosuch": {}}
    with pytest.raises(Exception, match="node_overrides: nosuch is not a node of a worker"):
        parse_parameters(data, "params.json")
    data["node_overrides"] = {"node1": {"cycle_s": "soon"}}
    with pytest.raises(Exception, match=r"node_overrides\.node1\.cycle_s"):
        parse_parameters(data, "params.json")
