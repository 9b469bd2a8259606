"""The launch environment detected from explicit environments, one launcher or problem per test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.launch_env import LaunchEnv, detect, expand_hostlist


@pytest.fixture
def no_resource_config(tmp_path) -> Path:
    """A SageMaker resource config path that does not exist, so a real /opt/ml cannot leak in."""
    return tmp_path / "absent" / "resourceconfig.json"


def write_resource_config(tmp_path: Path, current_host: str, hosts: list[str]) -> Path:
    path = tmp_path / "resourceconfig.json"
    path.write_text(json.dumps({"current_host": current_host, "hosts": hosts, "network_interface_name": "eth0"}))
    return path


def test_torchrun_two_nodes_of_two_processes(no_resource_config):
    environ = {
        "TORCHELASTIC_RUN_ID": "job-1",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29400",
    }
    assert detect(environ, sagemaker_resource_config=no_resource_config) == LaunchEnv(
        launcher="torchrun",
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        num_nodes=2,
        master_addr="10.0.0.5",
        master_port=29400,
    )


def test_torchrun_derives_node_rank_without_group_rank(no_resource_config):
    environ = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "head"}
    env = detect(environ, sagemaker_resource_config=no_resource_config)
    assert (env.node_rank, env.num_nodes, env.master_port) == (1, 2, 29500)


def test_slurm_two_nodes_master_is_first_host_of_node_list(no_resource_config):
    environ = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": "p5en-[07-08]",
    }
    assert detect(environ, sagemaker_resource_config=no_resource_config) == LaunchEnv(
        launcher="slurm",
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        num_nodes=2,
        master_addr="p5en-07",
        master_port=29500,
    )


def test_slurm_without_plain_tasks_per_node_divides_tasks_by_nodes(no_resource_config):
    environ = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS_PER_NODE": "4(x2)",
        "SLURM_NODELIST": "gpu-[1-2]",
    }
    env = detect(environ, sagemaker_resource_config=no_resource_config)
    assert (env.local_world_size, env.num_nodes, env.master_addr) == (4, 2, "gpu-1")


def test_slurm_master_addr_and_port_override_the_node_list(no_resource_config):
    environ = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "p5en-[07-08]",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "12345",
    }
    env = detect(environ, sagemaker_resource_config=no_resource_config)
    assert (env.master_addr, env.master_port) == ("10.1.2.3", 12345)


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("gpu-[1-2],cpu-5", ["gpu-1", "gpu-2", "cpu-5"]),
        ("p5en-[07-08]-ib", ["p5en-07-ib", "p5en-08-ib"]),
        ("a,b", ["a", "b"]),
    ],
)
def test_expand_hostlist(spec, hosts):
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["", "node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "a,,b"])
def test_expand_hostlist_rejects_malformed_lists(spec):
    with pytest.raises(ValueError):
        expand_hostlist(spec)


def test_expand_hostlist_takes_every_combination_of_several_brackets_with_several_ranges():
    # python-hostlist's documented expansion: the first bracket varies slowest.
    assert expand_hostlist("a[1-2]-b[3-4],c[01,03-04]") == ["a1-b3", "a1-b4", "a2-b3", "a2-b4", "c01", "c03", "c04"]


def test_expand_hostlist_refuses_a_list_too_large_to_be_a_cluster():
    # python-hostlist stops at 100,000 hosts (hostlist.MAX_SIZE) instead of building the list.
    with pytest.raises(ValueError, match="range too large"):
        expand_hostlist("node[1-100000000]")


def test_malformed_slurm_node_list_is_a_launch_env_error_naming_the_variable(no_resource_config):
    environ = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "p5en-[07-08",
    }
    with pytest.raises(ConfigError) as caught:
        detect(environ, sagemaker_resource_config=no_resource_config)
    assert caught.value.errors == [
        "SLURM_JOB_NODELIST: not a valid Slurm hostlist (got 'p5en-[07-08'; allowed a Slurm hostlist such as "
        "node[01-04],gpu-7)"
    ]


def test_sagemaker_from_resource_config_file(tmp_path):
    config = write_resource_config(tmp_path, "algo-2", ["algo-2", "algo-1"])
    env = detect({"SM_NUM_GPUS": "8"}, sagemaker_resource_config=config)
    assert env == LaunchEnv(
        launcher="sagemaker",
        rank=8,
        world_size=16,
        local_rank=0,
        local_world_size=8,
        node_rank=1,
        num_nodes=2,
        master_addr="algo-1",
        master_port=29500,
    )


def test_sagemaker_from_sm_hosts_environment(no_resource_config):
    environ = {
        "SM_HOSTS": '["algo-1", "algo-2", "algo-3"]',
        "SM_CURRENT_HOST": "algo-3",
        "SM_NUM_GPUS": "0",
        "SM_NUM_NEURONS": "32",
    }
    env = detect(environ, sagemaker_resource_config=no_resource_config)
    assert (env.launcher, env.node_rank, env.num_nodes, env.local_world_size, env.rank, env.world_size) == (
        "sagemaker",
        2,
        3,
        32,
        64,
        96,
    )


def test_sagemaker_current_host_not_in_hosts(tmp_path):
    config = write_resource_config(tmp_path, "algo-3", ["algo-1", "algo-2"])
    with pytest.raises(ConfigError) as caught:
        detect({}, sagemaker_resource_config=config)
    assert caught.value.errors == [
        f"{config}:current_host: not one of the hosts (got 'algo-3'; allowed algo-1, algo-2)"
    ]


def test_kubeflow_worker(no_resource_config):
    environ = {"MASTER_ADDR": "job-master-0", "WORLD_SIZE": "3", "RANK": "1"}
    assert detect(environ, sagemaker_resource_config=no_resource_config) == LaunchEnv(
        launcher="kubeflow",
        rank=1,
        world_size=3,
        local_rank=0,
        local_world_size=1,
        node_rank=1,
        num_nodes=3,
        master_addr="job-master-0",
        master_port=23456,
    )


def test_kubeflow_pod_with_nproc_per_node_is_the_node_launcher(no_resource_config):
    environ = {
        "PET_NPROC_PER_NODE": "8",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "job-master-0",
        "WORLD_SIZE": "2",
        "RANK": "1",
    }
    assert detect(environ, sagemaker_resource_config=no_resource_config) == LaunchEnv(
        launcher="kubeflow",
        rank=8,
        world_size=16,
        local_rank=0,
        local_world_size=8,
        node_rank=1,
        num_nodes=2,
        master_addr="job-master-0",
        master_port=23456,
    )


def test_kubeflow_node_rank_beyond_the_node_count_is_reported(no_resource_config):
    environ = {"PET_NPROC_PER_NODE": "8", "PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "m"}
    with pytest.raises(ConfigError) as error:
        detect(environ, sagemaker_resource_config=no_resource_config)
    assert error.value.errors == ["PET_NODE_RANK: must be less than PET_NNODES (got 2; allowed 0 to 1)"]


def test_single_process(no_resource_config):
    assert detect(
        {"PATH": "/usr/bin", "MASTER_PORT": "29511"}, sagemaker_resource_config=no_resource_config
    ) == LaunchEnv(
        launcher="single",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29511,
    )


def test_a_world_of_one_meets_in_process_and_a_larger_one_through_env(no_resource_config):
    single = detect({}, sagemaker_resource_config=no_resource_config)
    assert type(single.solo_store()).__name__ == "HashStore"
    assert dataclasses.replace(single, world_size=2).solo_store() is None


def test_torch_env_gives_env_init_variables_as_strings():
    env = LaunchEnv(
        launcher="torchrun",
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        num_nodes=2,
        master_addr="10.0.0.5",
        master_port=29400,
    )
    assert env.torch_env() == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29400",
    }


def test_invalid_rank_message(no_resource_config):
    environ = {"RANK": "x", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "head"}
    with pytest.raises(ConfigError) as caught:
        detect(environ, sagemaker_resource_config=no_resource_config)
    assert str(caught.value) == "RANK: not an integer (got 'x'; allowed 0 to WORLD_SIZE-1)"


def test_rank_not_below_world_size_message(no_resource_config):
    environ = {"MASTER_ADDR": "job-master-0", "WORLD_SIZE": "3", "RANK": "3"}
    with pytest.raises(ConfigError) as caught:
        detect(environ, sagemaker_resource_config=no_resource_config)
    assert str(caught.value) == "RANK: must be less than WORLD_SIZE (got 3; allowed 0 to 2)"


def test_every_problem_is_reported_at_once(no_resource_config):
    environ = {
        "SLURM_PROCID": "-1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "",
        "MASTER_PORT": "70000",
    }
    with pytest.raises(ConfigError) as caught:
        detect(environ, sagemaker_resource_config=no_resource_config)
    assert caught.value.errors == [
        "SLURM_PROCID: must not be negative (got '-1'; allowed 0 to SLURM_NTASKS-1)",
        "SLURM_JOB_NODELIST: empty node list (got ''; allowed a Slurm hostlist such as node[01-04],gpu-7)",
        "MASTER_PORT: must be at most 65535 (got '70000'; allowed 1 to 65535)",
    ]
    assert str(caught.value) == "\n".join(caught.value.errors)
