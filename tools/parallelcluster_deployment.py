"""A synthesized ParallelCluster deployment read as deployed: its ``ClusterConfiguration`` with every CloudFormation
intrinsic resolved, and the facts AWS would give ParallelCluster's validators about the resources it names, both
taken from the synthesized templates and the configuration (``moe-cdk parallelcluster-check``).

Ids that exist only once deployed are made up, deterministically, of their resource's kind (``subnet-`` and 17 hex
digits); the account is ``123456789012``. The facts: each subnet of the network stack with its zone and whether it
is public (its ``aws-cdk:subnet-type`` tag), each file system of the storage stack with its deployment type and its
subnet's zone, and each capacity reservation a compute group names, as the configuration describes it (its instance
type and count in the cluster's zone: what only AWS can confirm).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from moe_cdk.rules.hyperpod_capacity import CapacityType
from moe_cdk.rules.parallelcluster import RESOURCE_TYPE
from moe_cdk.schema.config import Config

ACCOUNT = "123456789012"
_PREFIXES = {"AWS::EC2::Subnet": "subnet", "AWS::EC2::SecurityGroup": "sg", "AWS::FSx::FileSystem": "fs"}


class ParallelClusterDeployment:
    """``templates`` (stack name -> template, as ``make synth`` writes them) of ``config``'s deployment."""

    def __init__(self, templates: dict[str, dict], config: Config):
        self.templates, self.config = templates, config
        self.cluster_stack = templates[f"{config.name}-cluster"]
        (self.resource,) = [r for r in self.cluster_stack["Resources"].values() if r["Type"] == RESOURCE_TYPE]

    @property
    def cluster_name(self) -> str:
        return self.resource["Properties"]["ClusterName"]

    def cluster_configuration(self) -> dict:
        """The resource's ``ClusterConfiguration``, every intrinsic resolved."""
        return self.resolve(self.resource["Properties"]["ClusterConfiguration"])

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if not isinstance(value, dict):
            return value
        if "Fn::ImportValue" in value:
            return self._physical_id(*self._imported(value["Fn::ImportValue"]))
        if "Fn::GetStackOutput" in value:
            reference = value["Fn::GetStackOutput"]
            stack = reference["StackName"]
            return self._physical_id(*self._output(stack, self.templates[stack]["Outputs"][reference["OutputName"]]))
        if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
            return self._substitute(value["Fn::Sub"])
        if "Ref" in value:
            referenced = self.cluster_stack["Resources"][value["Ref"]]
            if referenced["Type"] == "AWS::IAM::ManagedPolicy":
                return f"arn:aws:iam::{ACCOUNT}:policy/{referenced['Properties']['ManagedPolicyName']}"
        if any(key.startswith(("Fn::", "Ref")) for key in value):
            raise ValueError(f"an intrinsic this check cannot resolve: {value}")
        return {key: self.resolve(item) for key, item in value.items()}

    def facts(self) -> dict:
        """What ParallelCluster's validators ask AWS about the subnets, file systems and capacity reservations."""
        network, storage = f"{self.config.name}-network", f"{self.config.name}-storage"
        subnets = {
            self._physical_id(network, logical_id, subnet): {
                "availability_zone": subnet["Properties"]["AvailabilityZone"],
                "public": _tags(subnet).get("aws-cdk:subnet-type") == "Public",
            }
            for logical_id, subnet in _of_type(self.templates[network], "AWS::EC2::Subnet")
        }
        file_systems = {}
        for logical_id, fs in _of_type(self.templates[storage], "AWS::FSx::FileSystem"):
            (subnet_reference,) = fs["Properties"]["SubnetIds"]
            _, _, subnet = self._imported(subnet_reference["Fn::ImportValue"])
            file_systems[self._physical_id(storage, logical_id, fs)] = {
                "deployment_type": fs["Properties"]["LustreConfiguration"]["DeploymentType"],
                "availability_zone": subnet["Properties"]["AvailabilityZone"],
            }
        reservations = {
            g.capacity_reservation_id: {
                "instance_type": g.specs[0].ec2_name,
                "count": g.instance_count,
                "availability_zone": self.config.cluster.availability_zone,
                "type": "capacity-block" if g.capacity is CapacityType.CAPACITY_BLOCK else "default",
            }
            for g in self.config.cluster.instance_groups
            if g.capacity_reservation_id
        }
        return {"subnets": subnets, "file_systems": file_systems, "capacity_reservations": reservations}

    def _imported(self, export_name: str) -> tuple[str, str, dict]:
        for stack, template in self.templates.items():
            for output in template.get("Outputs", {}).values():
                if output.get("Export", {}).get("Name") == export_name:
                    return self._output(stack, output)
        raise ValueError(f"no stack exports {export_name}")

    def _output(self, stack: str, output: dict) -> tuple[str, str, dict]:
        """(stack, logical id, resource) of an output whose value is a ``Ref`` or a ``Fn::GetAtt``."""
        value = output["Value"]
        logical_id = value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]
        return stack, logical_id, self.templates[stack]["Resources"][logical_id]

    @staticmethod
    def _physical_id(stack: str, logical_id: str, resource: dict) -> str:
        digest = hashlib.sha1(f"{stack}/{logical_id}".encode()).hexdigest()[:17]
        return f"{_PREFIXES[resource['Type']]}-{digest}"

    def _substitute(self, text: str) -> str:
        pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": self.config.region, "AWS::URLSuffix": "amazonaws.com",
                  "AWS::Partition": "aws"}  # fmt: skip
        return re.sub(r"\$\{([^}]+)\}", lambda match: pseudo[match.group(1)], text)


def _of_type(template: dict, resource_type: str) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in template.get("Resources", {}).items() if v["Type"] == resource_type]


def _tags(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}
