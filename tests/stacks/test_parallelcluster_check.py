"""config/parallelcluster.yaml's synthesized ClusterConfiguration passes AWS ParallelCluster 3.16.1's own schema and
validators (tests/parallelcluster_check.py, offline), and ParallelCluster refuses what it should.

The configuration is taken from ``make synth``'s templates; its CloudFormation intrinsics are resolved to what the
deployment would give: an import or a stack output names a resource of the network or storage stack (a fake id of its
kind), the node policy's ``Ref`` is its ARN, pseudo parameters are a fake account in the configured region. The facts
the validators ask AWS about (subnet zones, the file system, the Capacity Block) come from the same templates and
configuration."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, cdk_cli_synth, read_json, resources_of_type

PCLUSTER_PYTHON = ROOT / ".venv-pcluster/bin/python"
CHECK = ROOT / "tests/parallelcluster_check.py"
CONFIG = ROOT / "config/parallelcluster.yaml"
ACCOUNT = "123456789012"
FAKE_PREFIXES = {"AWS::EC2::Subnet": "subnet", "AWS::EC2::SecurityGroup": "sg", "AWS::FSx::FileSystem": "fs"}

if not PCLUSTER_PYTHON.exists():
    pytest.skip("no .venv-pcluster (AWS ParallelCluster 3.16.1); `make test` builds it", allow_module_level=True)


def fake_id(resource_type: str, stack: str, logical_id: str) -> str:
    """A deterministic id of the resource's kind: ``subnet-`` and 17 hex digits."""
    digest = hashlib.sha1(f"{stack}/{logical_id}".encode()).hexdigest()[:17]
    return f"{FAKE_PREFIXES[resource_type]}-{digest}"


class Deployment:
    """The synthesized templates, read as the deployed stacks: which resource each intrinsic names."""

    def __init__(self, templates: dict[str, dict], document: dict):
        self.templates, self.document = templates, document
        self.region, self.name = document["region"], document["name"]
        self.cluster = templates[f"{self.name}-cluster"]

    def resource(self, stack: str, value: dict) -> tuple[str, str, dict]:
        """(stack, logical id, resource) of an output's value, a ``Ref`` or a ``Fn::GetAtt``."""
        logical_id = value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]
        return stack, logical_id, self.templates[stack]["Resources"][logical_id]

    def imported(self, export_name: str) -> tuple[str, str, dict]:
        for stack, template in self.templates.items():
            for output in template.get("Outputs", {}).values():
                if output.get("Export", {}).get("Name") == export_name:
                    return self.resource(stack, output["Value"])
        raise AssertionError(f"no stack exports {export_name}")

    def stack_output(self, reference: dict) -> tuple[str, str, dict]:
        stack = reference["StackName"]
        return self.resource(stack, self.templates[stack]["Outputs"][reference["OutputName"]]["Value"])

    def physical_id(self, stack: str, logical_id: str, resource: dict) -> str:
        return fake_id(resource["Type"], stack, logical_id)

    def substitute(self, text: str) -> str:
        pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": self.region, "AWS::URLSuffix": "amazonaws.com",
                  "AWS::Partition": "aws"}  # fmt: skip
        return re.sub(r"\$\{([^}]+)\}", lambda m: pseudo[m.group(1)], text)

    def resolve(self, value: Any) -> Any:
        """``value`` with every intrinsic replaced by the concrete value the deployment would give it."""
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "Fn::ImportValue" in value:
            return self.physical_id(*self.imported(value["Fn::ImportValue"]))
        if "Fn::GetStackOutput" in value:
            return self.physical_id(*self.stack_output(value["Fn::GetStackOutput"]))
        if "Fn::Sub" in value:
            assert isinstance(value["Fn::Sub"], str), value
            return self.substitute(value["Fn::Sub"])
        if "Ref" in value:
            policy = self.cluster["Resources"][value["Ref"]]
            assert policy["Type"] == "AWS::IAM::ManagedPolicy", value
            return f"arn:aws:iam::{ACCOUNT}:policy/{policy['Properties']['ManagedPolicyName']}"
        assert not any(key.startswith("Fn::") for key in value), value
        return {key: self.resolve(v) for key, v in value.items()}

    def custom_resource(self) -> dict:
        (cluster,) = resources_of_type(self.cluster, "Custom::PclusterCluster").values()
        return cluster["Properties"]

    def subnet_facts(self, stack: str, logical_id: str, subnet: dict) -> tuple[str, dict]:
        tags = {t["Key"]: t["Value"] for t in subnet["Properties"].get("Tags", [])}
        facts = {
            "availability_zone": subnet["Properties"]["AvailabilityZone"],
            "public": tags["aws-cdk:subnet-type"] == "Public",
        }
        return self.physical_id(stack, logical_id, subnet), facts

    def file_system_facts(self, stack: str, logical_id: str, fs: dict) -> tuple[str, dict]:
        (subnet_reference,) = fs["Properties"]["SubnetIds"]
        _, _, subnet = self.imported(subnet_reference["Fn::ImportValue"])
        return self.physical_id(stack, logical_id, fs), {
            "deployment_type": fs["Properties"]["LustreConfiguration"]["DeploymentType"],
            "availability_zone": subnet["Properties"]["AvailabilityZone"],
        }

    def facts(self) -> dict:
        """The --facts file: the subnets and file systems of our stacks, the Capacity Block the configuration names."""
        network, storage = f"{self.name}-network", f"{self.name}-storage"
        subnets = resources_of_type(self.templates[network], "AWS::EC2::Subnet")
        file_systems = resources_of_type(self.templates[storage], "AWS::FSx::FileSystem")
        cluster = self.document["cluster"]
        reservations = {
            group["capacity_reservation_id"]: {
                "instance_type": group["instance_type"].removeprefix("ml."),
                "count": group["instance_count"],
                "availability_zone": cluster["availability_zone"],
                "type": "capacity-block",
            }
            for group in cluster["instance_groups"]
            if group.get("capacity") == "capacity-block"
        }
        return {
            "subnets": dict(self.subnet_facts(network, k, v) for k, v in subnets.items()),
            "file_systems": dict(self.file_system_facts(storage, k, v) for k, v in file_systems.items()),
            "capacity_reservations": reservations,
        }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Deployment:
    """config/parallelcluster.yaml synthesized once through the CDK CLI, as ``make synth`` does."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    result = cdk_cli_synth(CONFIG, outdir)
    assert result.returncode == 0, result.stdout + result.stderr
    templates = {p.name.removesuffix(".template.json"): read_json(p) for p in outdir.glob("*.template.json")}
    return Deployment(templates, yaml.safe_load(CONFIG.read_text()))


@pytest.fixture(scope="module")
def resolved(deployment) -> dict:
    """The cluster's ClusterConfiguration with its intrinsics resolved."""
    return deployment.resolve(deployment.custom_resource()["ClusterConfiguration"])


def run_check(tmp_path: Path, deployment: Deployment, config: dict, facts: dict | None = None) -> tuple[int, str]:
    """tests/parallelcluster_check.py on ``config`` and ``facts`` (default: our stacks'): (exit code, output)."""
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "facts.json").write_text(json.dumps(deployment.facts() if facts is None else facts))
    name = deployment.custom_resource().get("ClusterName", deployment.name)
    result = subprocess.run(
        [str(PCLUSTER_PYTHON), str(CHECK), "cluster.yaml", "--facts", "facts.json", "--cluster-name", name],
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
    assert (
        "ERROR ComputeResourceSizeValidator: Max count must be set to the same value of min count "
        "when using Capacity Block reservation." in output
    ), output


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
    # tests/parallelcluster_check.py runs without moe_cdk, so it carries the catalog's figures: they must agree.
    sys.path.insert(0, str(ROOT / "tests"))
    from parallelcluster_check import CATALOG

    from moe_cdk.core import catalog

    for name, figures in CATALOG.items():
        spec = catalog.lookup(name)
        gpus = (spec.accelerator_model, spec.accelerator_count, spec.accelerator_memory_gb)
        if spec.accelerator_kind is not catalog.AcceleratorKind.NVIDIA_GPU:
            gpus = ("", 0, 0)  # EC2 reports GpuInfo for GPUs only
        assert figures == (spec.vcpus, spec.memory_gib, spec.efa_interfaces, *gpus), name
