"""Where a HyperPod instance group's nodes come from and how the group grows: instance types tried in
order (``InstanceRequirements``), Spot (``CapacityRequirements``), Karpenter autoscaling on EKS
(``AutoScaling``, ``ClusterRole``), and the memory tier of managed tiered checkpointing
(``TieredStorageConfig``).

Sources, cited where each rule is applied:
- botocore's SageMaker model, read at run time: ``ClusterInstanceGroupSpecification.InstanceRequirements``
  ("The InstanceType and InstanceRequirements properties are mutually exclusive"; the list's order is
  the priority) and its length limits;
- SageMaker Developer Guide, "Creating a SageMaker HyperPod cluster" (EKS), flexible instance groups:
  "Flexible instance groups require continuous node provisioning mode", at most 20 types, no duplicates;
- "Spot instances in SageMaker HyperPod" (sagemaker-hyperpod-spot.html): Spot groups on EKS clusters in
  continuous mode; ``CapacityRequirements`` cannot change once the group exists;
- "Autoscaling on SageMaker HyperPod EKS" and its pages on the cluster, the IAM role and the node class
  (sagemaker-hyperpod-eks-autoscaling*.html): continuous provisioning, automatic node recovery, groups
  that start at 0 nodes, no deep health checks and no training plans on scaled groups;
- CloudFormation's registry schema for ``AWS::SageMaker::Cluster`` (cfn-lint ships it):
  ``TieredStorageConfig.InstanceMemoryAllocationPercentage`` is 0 to 100; the guide puts tiered
  checkpointing on EKS clusters only.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core import catalog
from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import Problem, problem


class CapacityType(enum.Enum):
    """Which EC2 capacity a group's nodes run on (``CapacityRequirements``)."""

    ON_DEMAND = "on-demand"
    """On-Demand capacity (the property is omitted, as for every group before Spot existed)."""
    SPOT = "spot"
    """Spot capacity: up to 90 % cheaper, taken back with at most 2 minutes' notice (``{"Spot": {}}``)."""


@functools.cache
def max_instance_types() -> int:
    """The longest ``InstanceRequirements.InstanceTypes`` list CreateCluster takes (botocore: 20)."""
    import botocore.session

    group = botocore.session.get_session().get_service_model("sagemaker").shape_for("ClusterInstanceGroupSpecification")
    return group.members["InstanceRequirements"].members["InstanceTypes"].metadata["max"]


# "Autoscaling on SageMaker HyperPod EKS", node class page: "You can specify up to 10 instance groups in a
# NodeClass". moe-cdk writes one HyperpodNodeClass per group, so the limit cannot be reached; it is kept
# for the objects' own check (jobs/node_pools.py).
MAX_NODE_CLASS_GROUPS = 10


def capacity_problems(
    *,
    instance_types: Sequence[str],
    capacity: CapacityType,
    autoscale: bool,
    trains: bool,
    deep_health_checks: bool,
    training_plan: bool,
    eks: bool,
    continuous: bool,
    require_efa: bool,
) -> list[Problem]:
    """Problems with one group's capacity settings, keyed below the group. ``instance_types`` is the
    group's first choice followed by its fallbacks; ``deep_health_checks`` whether HyperPod would run them."""
    found = []
    fallbacks = list(instance_types[1:])
    asked = [
        ("fallback_instance_types", bool(fallbacks), "a list of instance types"),
        ("capacity", capacity is CapacityType.SPOT, "spot"),
        ("autoscale", autoscale, True),
    ]
    for key, on, shown in asked:
        if on and not eks:
            # Spot and flexible groups are documented for EKS clusters alone (every example and the
            # console steps); Karpenter autoscaling is an EKS feature.
            found.append(problem("only HyperPod EKS clusters have this", got=shown, allowed="orchestrator eks").at(key))
        elif on and not continuous:
            found.append(
                problem(
                    "needs continuous node provisioning",
                    got=shown,
                    allowed="node_provisioning_mode continuous",
                ).at(key)
            )
    if len(instance_types) > max_instance_types():
        found.append(
            problem(
                "too many instance types",
                got=len(instance_types),
                allowed=f"at most {max_instance_types()} with instance_type",
            ).at("fallback_instance_types")
        )
    first = catalog.lookup(instance_types[0])
    seen = {first.sagemaker_name if first else instance_types[0]}
    for j, name in enumerate(fallbacks):
        key = f"fallback_instance_types[{j}]"
        spec = catalog.lookup(name)
        if spec is None:
            found.append(catalog.unknown_instance_type(name).at(key))
            continue
        if spec.sagemaker_name in seen:
            found.append(problem("listed twice", got=name, allowed="each instance type once").at(key))
        seen.add(spec.sagemaker_name)
        if trains and require_efa and not spec.supports_efa:
            found.append(problem("has no EFA, and EFA is required", got=name, allowed="an EFA-capable type").at(key))
        # moe-cdk's rule, not AWS's: a training job runs one process per accelerator and its parallel
        # layout is fixed, so every node that can join it must bring as many.
        if trains and first is not None and spec.accelerator_count != first.accelerator_count:
            found.append(
                problem(
                    "a different number of accelerators than instance_type",
                    got=f"{name}: {spec.accelerator_count}",
                    allowed=f"{first.accelerator_count}, as {first.sagemaker_name} has",
                ).at(key)
            )
    if capacity is CapacityType.SPOT and training_plan:
        found.append(
            problem(
                "a training plan reserves capacity, so its group cannot also run on Spot",
                got="spot",
                allowed="on-demand with training_plan_arn",
            ).at("capacity")
        )
    if autoscale:
        # Node class page: "Instance groups with DeepHealthChecks (DHC) are not supported" and "Instance
        # groups with Training plan or reserved capacity are not supported".
        if deep_health_checks:
            found.append(
                problem(
                    "Karpenter cannot scale a group with deep health checks", got=True, allowed="false with autoscale"
                ).at("deep_health_checks")
            )
        if training_plan:
            found.append(
                problem(
                    "Karpenter cannot scale a group on a training plan", got=True, allowed="no training_plan_arn"
                ).at("autoscale")
            )
        if not trains:
            # moe-cdk's rule: CoreDNS and the operators must run before any pod waits for a node.
            found.append(
                problem("system groups stay at their size", got=True, allowed="autoscale on compute groups").at(
                    "autoscale"
                )
            )
    return found


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class TieredStorage:
    """HyperPod's managed tiered checkpointing: a share of every node's host memory kept for checkpoints
    (``TieredStorageConfig``)."""

    memory_percent: int
    """The share of each node's host memory HyperPod keeps for checkpoints
    (``InstanceMemoryAllocationPercentage``), 1 to 100. Required."""

    def problems(self) -> Iterator[Problem]:
        # CloudFormation takes 0 to 100; 0 with the mode on keeps nothing.
        if not 1 <= self.memory_percent <= 100:
            yield problem("out of range", got=self.memory_percent, allowed="1 to 100").at("memory_percent")

    def to_api(self) -> dict:
        return {"Mode": "Enable", "InstanceMemoryAllocationPercentage": self.memory_percent}

    def gib_per_node(self, instance_type: str) -> float:
        """The host memory it keeps on one node of ``instance_type``, in GiB."""
        return catalog.lookup(instance_type).memory_gib * self.memory_percent / 100
