"""provisioning_parameters.json validation: every rule, and the exact message it gives."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from provision_support import base_params, problems

from hyperpod_agent.errors import ConfigError
from hyperpod_agent.provision.load import load_parameters, load_resource_config, parse_parameters
from hyperpod_agent.provision.models import ProvisionError, ResourceConfig

SRC = "params.json"


def with_(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(base_params())
    data.update(changes)
    return data


def test_base_parameters_are_valid() -> None:
    params = parse_parameters(base_params(), SRC)
    assert params.controller.name == "controller"
    assert params.worker_groups[0].nodes == ["node1", "node2", "node3", "node4", "node5"]
    assert params.login_groups[0].nodes == ["login1", "login2"]
    assert params.worker_groups[1].partitions == ["dev"]
    assert params.spare_nodes() == {"node5"}
    assert params.slurm.conf_dir == "/etc/slurm"


def test_provision_error_is_a_config_error_with_one_line() -> None:
    data = with_(bogus=1, other=2)
    with pytest.raises(ConfigError) as info:
        parse_parameters(data, SRC)
    assert str(info.value) == "params.json: bogus: unknown key (and 1 more)"


def test_unknown_top_level_key_is_named() -> None:
    assert problems(with_(bogus=1)) == ["params.json: bogus: unknown key"]


def test_unknown_nested_key_names_the_path() -> None:
    data = base_params()
    data["worker_groups"][1]["gpu_count"] = 8
    assert problems(data) == ["params.json: worker_groups[1].gpu_count: unknown key"]


def test_unknown_key_in_slurm_settings() -> None:
    data = with_(slurm={"auto_resume": {"maximum": 3}})
    assert problems(data) == ["params.json: slurm.auto_resume.maximum: unknown key"]


def test_missing_controller() -> None:
    data = base_params()
    del data["controller"]
    assert problems(data) == [
        'params.json: no controller group: add "controller": {"nodes": [...]}'
    ]


def test_node_in_two_groups_names_node_and_both_groups() -> None:
    data = base_params()
    data["login_groups"][0]["nodes"] = ["login1", "node3"]
    assert problems(data) == [
        "params.json: node node3 is in two groups: login group 'login' and worker group 'gpu'"
    ]


def test_controller_node_also_a_worker() -> None:
    data = base_params()
    data["worker_groups"][1]["nodes"] = ["cpu1", "head"]
    assert problems(data) == [
        "params.json: node head is in two groups: controller group 'controller' and "
        "worker group 'cpu'"
    ]


def test_node_listed_twice_in_one_group() -> None:
    data = base_params()
    data["worker_groups"][1]["nodes"] = ["cpu1", "cpu1"]
    assert problems(data) == ["params.json: worker_groups[1].nodes: node cpu1 is listed twice"]


def test_bad_hostlist() -> None:
    data = base_params()
    data["worker_groups"][0]["nodes"] = "node[1-"
    (line,) = problems(data)
    assert line.startswith("params.json: worker_groups[0].nodes: bad hostlist 'node[1-': ")
    assert "unbalanced '['" in line


def test_bad_node_name() -> None:
    data = base_params()
    data["worker_groups"][1]["nodes"] = ["cpu 1"]
    assert problems(data) == [
        "params.json: worker_groups[1].nodes: 'cpu 1' is not a valid node name"
    ]


def test_list_items_may_be_hostlists() -> None:
    data = base_params()
    data["worker_groups"][1]["nodes"] = ["cpu[1-2]", "cpu9"]
    params = parse_parameters(data, SRC)
    assert params.worker_groups[1].nodes == ["cpu1", "cpu2", "cpu9"]


def test_same_group_name_twice() -> None:
    data = base_params()
    data["worker_groups"][1]["name"] = "gpu"
    assert problems(data) == ["params.json: group name 'gpu' is used twice"]


def test_undeclared_partition_of_worker_group() -> None:
    data = base_params()
    data["worker_groups"][1]["partitions"] = ["debug"]
    assert problems(data) == [
        "params.json: worker group 'cpu': partition 'debug' is not declared in partitions "
        "(dev, main)"
    ]


def test_two_default_partitions() -> None:
    data = with_(partitions=[{"name": "main", "default": True}, {"name": "dev", "default": True}])
    assert problems(data) == ["params.json: more than one partition has default = true"]


def test_partition_declared_twice() -> None:
    data = with_(partitions=[{"name": "main"}, {"name": "dev"}, {"name": "main"}])
    assert problems(data) == ["params.json: a partition name is declared twice"]


def test_spare_not_in_a_worker_group_of_its_partition() -> None:
    data = with_(spare_pool={"nodes": ["cpu1"], "partition": "main"})
    assert problems(data) == [
        "params.json: spare node cpu1 is not in a worker group of partition 'main'"
    ]


def test_spare_unknown_node() -> None:
    data = with_(spare_pool={"nodes": "spare[1-2]", "partition": "main"})
    assert problems(data) == [
        "params.json: spare node spare1 is not in a worker group of partition 'main'"
    ]


def test_spare_pool_partition_undeclared() -> None:
    data = with_(spare_pool={"nodes": ["node5"], "partition": "gpu"})
    assert problems(data) == ["params.json: spare_pool: partition 'gpu' is not declared"]


def test_no_worker_groups() -> None:
    data = with_(worker_groups=[], spare_pool=None)
    assert problems(data) == [
        "params.json: worker_groups: List should have at least 1 item after validation, not 0"
    ]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://head:8787", "expected http://HOST:PORT, got 'ftp://head:8787'"),
        ("http://head", "'http://head' needs an explicit port, e.g. http://head:8787"),
        ("http://head:99999", "bad port in 'http://head:99999'"),
        ("http://head:8787/api", "'http://head:8787/api' must be scheme://host:port only"),
    ],
)
def test_controller_url(url: str, why: str) -> None:
    assert problems(with_(controller_url=url)) == [f"params.json: controller_url: {why}"]


def test_controller_url_trailing_slash_removed() -> None:
    params = parse_parameters(with_(controller_url="https://head:8787/"), SRC)
    assert params.controller_url == "https://head:8787"


def test_mount_other_needs_fstype() -> None:
    data = with_(mounts=[{"path": "/data", "type": "other", "source": "x:/y"}])
    assert problems(data) == ["params.json: mounts[0]: mount /data: type 'other' needs fstype"]


def test_mount_relative_path() -> None:
    data = with_(mounts=[{"path": "data", "type": "nfs", "source": "x:/y"}])
    (line,) = problems(data)
    assert line.startswith("params.json: mounts[0].path: String should match pattern")
    assert line.endswith(', got "data"')


def test_mount_bad_type() -> None:
    data = with_(mounts=[{"path": "/data", "type": "ceph", "source": "x:/y"}])
    assert problems(data) == [
        "params.json: mounts[0].type: Input should be 'nfs', 'lustre' or 'other', got \"ceph\""
    ]


def test_mount_listed_twice() -> None:
    mount = {"path": "/data", "type": "nfs", "source": "x:/y"}
    assert problems(with_(mounts=[mount, mount])) == [
        "params.json: mount path /data is listed twice"
    ]


def test_auto_resume_default_above_max() -> None:
    data = with_(slurm={"auto_resume": {"max": 3, "default": 5}})
    assert problems(data) == [
        "params.json: slurm.auto_resume: default must not exceed max (1000 when unset)"
    ]


def test_cred_expire_bounds() -> None:
    assert problems(with_(slurm={"cred_expire": 2})) == [
        "params.json: slurm.cred_expire: Input should be greater than or equal to 5, got 2"
    ]


def test_wrong_type_shows_value() -> None:
    data = base_params()
    data["worker_groups"][0]["gpus"] = "eight"
    assert problems(data) == [
        "params.json: worker_groups[0].gpus: Input should be a valid integer, unable to parse "
        'string as an integer, got "eight"'
    ]


def test_agent_override_validated_by_agent_config() -> None:
    data = with_(agent_overrides={"probes": {"gpu": {"expected_count": "eight"}}})
    (line,) = problems(data)
    assert line.startswith("params.json: agent_overrides.probes.gpu.expected_count: ")
    assert "valid integer" in line


def test_agent_override_unknown_key() -> None:
    data = with_(agent_overrides={"probes": {"gpus": {}}})
    assert problems(data) == ["params.json: agent_overrides.probes.gpus: unknown key"]


def test_controller_override_validated_by_controller_config() -> None:
    data = with_(controller_overrides={"policy": {"max_unhealthy_fraction": 2}})
    (line,) = problems(data)
    assert line.startswith(
        "params.json: controller_overrides.policy.max_unhealthy_fraction: Input should be less"
    )


def test_override_null_has_no_toml_form() -> None:
    data = with_(agent_overrides={"cycle_s": None})
    assert problems(data) == [
        "params.json: agent_overrides.cycle_s: null has no TOML form; leave the key out instead"
    ]


def test_every_problem_is_listed() -> None:
    data = with_(bogus=1, cluster_name="bad name!")
    lines = problems(data)
    assert len(lines) == 2
    assert "params.json: bogus: unknown key" in lines
    assert any(line.startswith("params.json: cluster_name: String should match") for line in lines)


def test_schema_key_is_accepted() -> None:
    parse_parameters(with_(**{"$schema": "./provisioning_parameters.schema.json"}), SRC)


def test_expected_gpus_default_to_gpus() -> None:
    data = base_params()
    data["worker_groups"][0]["expected_gpus"] = 7
    params = parse_parameters(data, SRC)
    assert params.worker_groups[0].expected_gpu_count() == 7
    assert params.worker_groups[1].expected_gpu_count() == 0


def test_load_parameters_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    with pytest.raises(ProvisionError, match=f"^{path}: no such file$"):
        load_parameters(path)
    path.write_text("{\n  'cluster_name': 1\n}")
    with pytest.raises(ProvisionError) as info:
        load_parameters(path)
    assert str(info.value) == (
        f"{path}: not valid JSON: Expecting property name enclosed in double quotes "
        "at line 2 column 3"
    )


def test_example_parameters_are_valid() -> None:
    root = Path(__file__).resolve().parents[3] / "lifecycle_scripts" / "examples"
    params = load_parameters(root / "provisioning_parameters.json")
    assert params.spare_nodes() == {"gpu-015", "gpu-016"}
    config = load_resource_config(root / "resource_config.json")
    assert config.resolve(instance_id="i-0a1b2c3d4e5f60101", hostname=None, addresses=set()) == (
        "gpu-001"
    )


def test_resource_config_resolution_order() -> None:
    config = ResourceConfig.model_validate(
        {
            "instances": [
                {"node_name": "node1", "instance_id": "i-1", "address": "10.0.0.1"},
                {"node_name": "node2", "hostname": "ip-10-0-0-2", "address": "10.0.0.2"},
            ]
        }
    )
    assert config.resolve(instance_id="i-1", hostname="ip-10-0-0-2", addresses=set()) == "node1"
    assert config.resolve(instance_id="i-9", hostname="ip-10-0-0-2", addresses=set()) == "node2"
    assert config.resolve(instance_id=None, hostname="node1", addresses=set()) == "node1"
    assert config.resolve(instance_id=None, hostname="x", addresses={"10.0.0.2"}) == "node2"
    with pytest.raises(ProvisionError, match="no instance matches this machine"):
        config.resolve(instance_id="i-9", hostname="x", addresses={"10.9.9.9"})


def test_resource_config_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"instances": [{"node_name": "a", "id": "i-1"}]}')
    with pytest.raises(ProvisionError, match=r"instances\[0\]\.id: unknown key$"):
        load_resource_config(path)
