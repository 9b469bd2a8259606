"""config/parallelcluster.yaml's synthesized cluster through AWS ParallelCluster 3.16.1's own schema and validators,
offline (moe-cdk parallelcluster-check, which make synth runs): it passes, and ParallelCluster refuses what it should.

The templates are the CDK CLI's, as ``make synth`` writes them; tools/parallelcluster_deployment.py resolves the
ClusterConfiguration as deployed and takes the facts ParallelCluster asks AWS for from the same templates and
configuration; cli/parallelcluster_validate.py runs ParallelCluster's code in .venv-pcluster."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, cdk_cli_synth_once, synth
from test_parallelcluster_stack import TEAMS_CONFIG

from moe_cdk.cli import main as cli
from moe_cdk.rules import parallelcluster
from moe_cdk.schema.config import load_config
from moe_cdk.tools.parallelcluster_deployment import ParallelClusterDeployment
from moe_cdk.tools.synth_diff import PARALLELCLUSTER_PYTHON, read_templates

PCLUSTER_PYTHON = ROOT / PARALLELCLUSTER_PYTHON
VALIDATE = ROOT / "cli/parallelcluster_validate.py"
CONFIG = ROOT / "config/parallelcluster.yaml"

if not PCLUSTER_PYTHON.exists():
    pytest.skip("no .venv-pcluster (AWS ParallelCluster 3.16.1); `make test` builds it", allow_module_level=True)


@pytest.fixture(scope="module")
def cdk_out(tmp_path_factory) -> Path:
    """config/parallelcluster.yaml synthesized through the CDK CLI, as ``make synth`` does (once per run: the
    shipped configurations' synth test reads the same)."""
    returncode, output, outdir = cdk_cli_synth_once(CONFIG)
    assert returncode == 0, output
    return outdir


@pytest.fixture(scope="module")
def deployment(cdk_out) -> ParallelClusterDeployment:
    return ParallelClusterDeployment(read_templates(cdk_out), load_config(CONFIG))


@pytest.fixture(scope="module")
def resolved(deployment) -> dict:
    """The cluster's ClusterConfiguration with its intrinsics resolved."""
    return deployment.cluster_configuration()


def run_check(tmp_path: Path, deployment, config: dict, facts: dict | None = None) -> tuple[int, str]:
    """cli/parallelcluster_validate.py on ``config`` and ``facts`` (default: our stacks'): (exit code, output)."""
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "facts.json").write_text(json.dumps(deployment.facts() if facts is None else facts))
    result = subprocess.run(
        [str(PCLUSTER_PYTHON), str(VALIDATE), "cluster.yaml", "--facts", "facts.json",
         "--cluster-name", deployment.cluster_name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def gpu_compute_resource(config: dict) -> dict:
    (queue,) = config["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    return resource


def test_the_resolved_configuration_has_no_intrinsics_left(resolved):
    text = json.dumps(resolved)
    assert "Fn::" not in text and '"Ref"' not in text and "${" not in text, text


def test_the_synthesized_configuration_passes_parallelclusters_schema_and_validators(tmp_path, deployment, resolved):
    code, output = run_check(tmp_path, deployment, resolved)
    assert code == 0, output
    assert "UNHANDLED" not in output, output


def test_a_capacity_block_whose_min_count_is_below_its_max_count_is_refused(tmp_path, deployment, resolved):
    config = copy.deepcopy(resolved)
    gpu_compute_resource(config).update(MinCount=1, MaxCount=2)
    code, output = run_check(tmp_path, deployment, config)
    assert code == 1, output
    # The configuration's own refusal quotes this message (schema/config.py).
    assert f"ERROR ComputeResourceSizeValidator: {parallelcluster.CAPACITY_BLOCK_COUNTS}" in output, output


def test_an_unknown_head_node_key_fails_the_schema_and_is_named(tmp_path, deployment, resolved):
    config = copy.deepcopy(resolved)
    config["HeadNode"]["NotAParallelClusterKey"] = True
    code, output = run_check(tmp_path, deployment, config)
    assert code == 2, output
    assert "HeadNode.NotAParallelClusterKey: Unknown field." in output.splitlines(), output


def test_a_capacity_block_of_another_instance_type_is_refused(tmp_path, deployment, resolved):
    facts = deployment.facts()
    (reservation_id,) = facts["capacity_reservations"]
    facts["capacity_reservations"][reservation_id]["instance_type"] = "p5.48xlarge"
    code, output = run_check(tmp_path, deployment, resolved, facts)
    assert code == 1, output
    assert (
        f"ERROR CapacityReservationValidator: Capacity reservation {reservation_id} must have the same instance type "
        "as p5en.48xlarge." in output
    ), output


def test_the_checkers_instance_types_are_the_catalogs():
    # The checker runs without moe_cdk, so it carries the catalog's figures: they must agree.
    spec_of = importlib.util.spec_from_file_location("parallelcluster_validate", VALIDATE)
    checker = importlib.util.module_from_spec(spec_of)
    sys.modules[spec_of.name] = checker  # its dataclasses look their module up
    spec_of.loader.exec_module(checker)

    from moe_cdk.core import catalog

    for name, figures in checker.CATALOG.items():
        spec = catalog.lookup(name)
        gpus = (spec.accelerator_model, spec.accelerator_count, spec.accelerator_memory_gb)
        if spec.accelerator_kind is not catalog.AcceleratorKind.NVIDIA_GPU:
            gpus = ("", 0, 0)  # EC2 reports GpuInfo for GPUs only
        assert figures == (spec.vcpus, spec.memory_gib, spec.efa_interfaces, *gpus), name


def test_the_command_passes_the_synthesized_cluster_and_prints_parallelclusters_findings(cdk_out, capsys):
    assert cli.main(["parallelcluster-check", "--config", str(CONFIG), "--cdk-out", str(cdk_out)]) == 0
    out = capsys.readouterr().out
    assert "# 76 validators ran" in out and "0 ERROR" in out, out


def test_the_command_refuses_another_orchestrators_configuration(cdk_out, capsys):
    code = cli.main(["parallelcluster-check", "--config", str(ROOT / "config/default.yaml"), "--cdk-out", str(cdk_out)])
    assert code == 2
    assert (
        "cluster.orchestrator: parallelcluster-check needs a ParallelCluster configuration" in capsys.readouterr().err
    )


def test_the_command_says_which_folder_lacks_the_templates(tmp_path, capsys):
    assert cli.main(["parallelcluster-check", "--config", str(CONFIG), "--cdk-out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--cdk-out: holds no template of stack moe-pc-cluster (got '{tmp_path}';" in err, err


def test_slurm_accounting_for_teams_passes_parallelclusters_validators(tmp_path):
    outdir = tmp_path / "cdk.out"
    synth(TEAMS_CONFIG, outdir)
    deployment = ParallelClusterDeployment(read_templates(outdir), TEAMS_CONFIG)
    code, output = run_check(tmp_path, deployment, deployment.cluster_configuration())
    assert code == 0, output
    assert "UNHANDLED" not in output, output
    # The secret cannot be looked up offline; the report says it was assumed.
    assert "# NOT VERIFIED OFFLINE (assumed): Secrets Manager secret exists" in output, output
