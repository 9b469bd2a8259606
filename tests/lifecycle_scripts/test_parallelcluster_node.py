"""The lifecycle scripts on a ParallelCluster node: parallelcluster_entry.sh, run as the node's OnNodeConfigured action
with the bundle's URI, the Region and the node's instance group, fetches the bundle and runs ``on_create.sh --group``.
There is no resource_config.json, and ParallelCluster has mounted the file system."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lifecycle_scripts import PARAMS, Sandbox, succeeded  # noqa: E402

BUNDLE = "s3://sagemaker-123456789012-us-east-2-moe-pc/lifecycle/0123456789abcdef/bundle.zip"
PARAMETER = "/moe-cdk/moe-pc/lifecycle/bundle"


def aws_stub(parameters: dict[str, str]) -> str:
    """s3 cp answered from the sandbox's state folder, as the node's role would read the object; ssm get-parameter
    from ``parameters`` (name -> value); ECR's token."""
    names = "".join(f'      *" --name {name} "*) echo "{value}" ;;\n' for name, value in parameters.items())
    return rf"""#!/usr/bin/env bash
echo "aws $*" >>"${{MOE_STUB_CALLS}}"
args=("$@")
case "${{args[0]}} ${{args[1]}}" in
  "s3 cp") cp -- "${{MOE_STUB_STATE}}/s3/${{args[-2]#s3://}}" "${{args[-1]}}" ;;
  "ssm get-parameter")
    case " $* " in
{names}      *) echo "An error occurred (ParameterNotFound)" >&2; exit 254 ;;
    esac ;;
  "ecr get-login-password") echo ecr-token ;;
  *) exit 254 ;;
esac
"""


def parallelcluster_node(base: Path) -> Sandbox:
    """A ParallelCluster node: its parameters say so, and HyperPod's resource_config.json is absent."""
    params = copy.deepcopy(PARAMS) | {"cluster_manager": "parallelcluster"}
    params["container_runtime"]["enroot_data_dir"] = "/scratch/enroot"  # provisioning_parameters(parallelcluster)
    box = Sandbox(base, params=params)
    (box.root / "opt/ml/config/resource_config.json").unlink()
    return box


def publish(box: Sandbox, parameters: dict[str, str] | None = None) -> None:
    """The sandbox's lifecycle folder as the bundle in the stub S3, and the stub aws that reads it; the bundle's
    parameter holds BUNDLE, and ``parameters`` are the other SSM parameters."""
    (box.bin / "aws").write_text(aws_stub({PARAMETER: BUNDLE, **(parameters or {})}))
    published = box.state / "s3" / BUNDLE.removeprefix("s3://")
    published.parent.mkdir(parents=True)
    shutil.make_archive(str(published.with_suffix("")), "zip", box.lc)


@pytest.fixture(scope="module")
def compute(tmp_path_factory) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """The entry script run once on a compute node of queue gpu, with the bundle published to the stub S3."""
    box = parallelcluster_node(tmp_path_factory.mktemp("pcluster"))
    publish(box)
    run = box.run(
        "bash", str(box.lc / "parallelcluster_entry.sh"), BUNDLE, "us-east-2", "gpu",
        MOE_LC_TARGET=str(box.base / "opt/moe-cdk/lifecycle"),
    )  # fmt: skip
    return box, succeeded(run)


def test_the_entry_script_fetches_the_bundle_with_the_nodes_role_in_the_region(compute):
    box, _ = compute
    (call,) = box.calls("aws s3")
    assert call.startswith(f"aws s3 cp --only-show-errors --region us-east-2 {BUNDLE} ")


def test_the_node_is_told_its_group_and_role(compute):
    _, run = compute
    assert "in group gpu: role compute" in run.stdout


def test_the_file_system_parallelcluster_mounted_is_left_alone(compute):
    box, run = compute
    assert "skipping mount_fsx on ParallelCluster" in run.stdout
    assert box.calls("mount -t") == [] and box.read("etc/fstab").count("lustre") == 0


def test_the_other_slurm_steps_run_and_parallelcluster_keeps_the_features_it_sets(compute):
    box, run = compute
    steps = [r["step"] for r in box.records(run) if r["outcome"] == "ok"]
    assert steps == ["validate", "node_info", "efa_env", "setup_enroot", "setup_pyxis", "teams", "observability"]
    assert "skipping slurm_features on ParallelCluster: it sets the nodes' features itself" in run.stdout


def test_enroot_keeps_its_data_on_the_instance_store_parallelcluster_mounted(compute):
    box, _ = compute
    assert "ENROOT_DATA_PATH /scratch/enroot/data/user-$(id -u)" in box.read("etc/enroot/enroot.conf").splitlines()


@pytest.mark.parametrize("group, role", [("controller", "controller"), ("login", "login")])
def test_head_and_login_nodes_read_the_bundle_from_its_ssm_parameter(tmp_path, group, role):
    box = parallelcluster_node(tmp_path)
    publish(box)
    run = box.run("bash", str(box.lc / "parallelcluster_entry.sh"), PARAMETER, "us-east-2", group,
                  MOE_LC_TARGET=str(box.base / "lifecycle"))  # fmt: skip
    assert succeeded(run) and f"in group {group}: role {role}" in run.stdout
    get, copy_ = box.calls("aws")
    assert get == f"aws ssm get-parameter --region us-east-2 --name {PARAMETER} --query Parameter.Value --output text"
    assert copy_.startswith(f"aws s3 cp --only-show-errors --region us-east-2 {BUNDLE} ")


def test_the_entry_script_refuses_missing_arguments_in_one_line(tmp_path):
    box = parallelcluster_node(tmp_path)
    run = box.run("bash", str(box.lc / "parallelcluster_entry.sh"), BUNDLE, "us-east-2")
    assert run.returncode == 2
    assert run.stdout.strip().endswith(
        "ERROR: usage: parallelcluster_entry.sh BUNDLE_S3_URI_OR_SSM_PARAMETER REGION INSTANCE_GROUP (got: "
        + BUNDLE
        + " us-east-2)"
    )


def test_a_group_the_parameters_do_not_name_stops_the_node_with_the_groups_they_do(tmp_path):
    box = parallelcluster_node(tmp_path)
    run = box.run("bash", str(box.lc / "on_create.sh"), "--group", "cpu")
    assert run.returncode != 0
    assert "instance group: not in provisioning_parameters.json (got 'cpu'; allowed controller, login, gpu)" in (
        run.stdout + run.stderr
    )


def test_node_info_tells_the_head_nodes_facts_without_resource_config(tmp_path):
    box = parallelcluster_node(tmp_path)
    run = box.node_info("--group", "controller", str(box.lc / "provisioning_parameters.json"))
    assert run.returncode == 0, run.stderr
    facts = dict(line.split("=", 1) for line in run.stdout.splitlines())
    assert (facts["NODE_ROLE"], facts["INSTANCE_ID"], facts["PARTITION"]) == ("controller", "i-0456", "")


def test_parallelcluster_parameters_with_eks_are_refused(tmp_path):
    params = copy.deepcopy(PARAMS) | {"cluster_manager": "parallelcluster", "workload_manager": "eks"}
    box = Sandbox(tmp_path, params=params)
    run = box.node_info("--check", str(box.lc / "provisioning_parameters.json"))
    assert run.returncode == 2
    assert "cluster_manager: unsupported (got 'parallelcluster'; allowed 'hyperpod', or 'parallelcluster' with" in (
        run.stderr
    )
