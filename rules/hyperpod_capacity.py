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
  checkpointing on EKS clusters only;
- "Spot instances in SageMaker HyperPod", "Create HyperpodNodeClass" and "Managing Node Interruption":
  a node class lists several groups, Karpenter takes its Spot groups first and falls back to its
  On-Demand groups when they cannot grow (``fallback_group_problems``);
- ``MinInstanceCount`` (botocore's ``ClusterInstanceGroupSpecification`` and the registry schema: 0 to
  6758, at most ``InstanceCount``), which AWS's announcement of 2026-05-27 ("SageMaker HyperPod Slurm
  clusters now support specifying minimum capacity requirements with continuous provisioning")
  documents for Slurm clusters in continuous mode (``min_instance_count_problems``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

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
    CAPACITY_BLOCK = "capacity-block"
    """An EC2 Capacity Block for ML (ParallelCluster only, with ``capacity_reservation_id``; HyperPod reserves
    capacity through training plans)."""


@functools.cache
def max_instance_types() -> int:
    """The longest ``InstanceRequirements.InstanceTypes`` list CreateCluster takes (botocore: 20)."""
    import botocore.session

    group = botocore.session.get_session().get_service_model("sagemaker").shape_for("ClusterInstanceGroupSpecification")
    return group.members["InstanceRequirements"].members["InstanceTypes"].metadata["max"]


@functools.cache
def min_instance_count_range() -> tuple[int, int]:
    """The ``MinInstanceCount`` CreateCluster takes (botocore: 0 to 6758, as the registry schema)."""
    import botocore.session

    group = botocore.session.get_session().get_service_model("sagemaker").shape_for("ClusterInstanceGroupSpecification")
    metadata = group.members["MinInstanceCount"].metadata
    return metadata["min"], metadata["max"]


# "Autoscaling on SageMaker HyperPod EKS", node class page: "You can specify up to 10 instance groups in a
# NodeClass": an autoscaled group and its fallback_groups together (fallback_group_problems), and the
# objects' own check (jobs/node_pools.py).
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


def min_instance_count_problems(
    min_instance_count: int | None, *, instance_count: int, eks: bool, continuous: bool
) -> list[Problem]:
    """Problems with one group's ``min_instance_count`` (``MinInstanceCount``), keyed below the group."""
    if min_instance_count is None:
        return []
    key = "min_instance_count"
    if eks:
        # AWS announced the minimum for Slurm clusters in continuous mode (2026-05-27) and documents it for
        # no other; the API reference names no orchestrator. moe-cdk takes the safe side: a property
        # HyperPod might refuse on an EKS cluster would fail the deployment.
        return [
            problem(
                "AWS documents a minimum count for Slurm clusters only",
                got=min_instance_count,
                allowed="unset on an EKS cluster",
            ).at(key)
        ]
    if not continuous:
        # Standard provisioning creates every node or fails, so there is no partial count to wait for.
        return [
            problem(
                "needs continuous node provisioning",
                got=min_instance_count,
                allowed="node_provisioning_mode continuous",
            ).at(key)
        ]
    low, high = min_instance_count_range()
    # Registry schema: "MinInstanceCount must be less than or equal to InstanceCount."
    if not low <= min_instance_count <= min(high, instance_count):
        return [
            problem(
                "out of range",
                got=min_instance_count,
                allowed=f"{low} to {min(high, instance_count)} (at most instance_count)",
            ).at(key)
        ]
    return []


class _Taint(Protocol):
    key: str
    value: str | None
    effect: enum.Enum


def _taint_text(taint: _Taint) -> str:
    return f"{taint.key}{'' if taint.value is None else '=' + taint.value}:{taint.effect.value}"


class NodeClassGroup(Protocol):
    """What ``fallback_group_problems`` reads of an instance group (``schema.config.InstanceGroupConfig``)."""

    name: str
    instance_type: str
    fallback_instance_types: Sequence[str]
    instance_count: int
    capacity: CapacityType
    autoscale: bool
    empty_node_timeout_s: int
    fallback_groups: Sequence[str]
    labels: Mapping[str, str]
    taints: Sequence[_Taint]


def _types(group: NodeClassGroup) -> list[str]:
    return [
        (s.sagemaker_name if (s := catalog.lookup(t)) else t)
        for t in (group.instance_type, *group.fallback_instance_types)
    ]


def fallback_group_problems(groups: Sequence[NodeClassGroup], *, eks: bool) -> list[Problem]:
    """Problems with the groups' ``fallback_groups``, keyed ``instance_groups[i].fallback_groups``.

    A group with fallback groups shares its HyperpodNodeClass with them, and its NodePool
    (jobs/node_pools.py). AWS's Spot page: "Karpenter prioritizes Spot instance groups over On-Demand
    instances, using On-Demand as a fallback", and Karpenter "implements a fallback mechanism to other
    instance groups configured in the Node class when the primary group cannot accommodate the demand".
    The list's order says nothing to Karpenter: it takes Spot groups first (sorted by Spot placement
    score), whatever the order. So the group is a Spot group, and its fallbacks are On-Demand groups
    that Karpenter scales too. moe-cdk puts every group in the cluster's one subnet, so a second Spot
    group would draw on the same Spot capacity as the first and add nothing.

    moe-cdk's rules besides, because the training pods of the group (``eks render``) must fit a node of
    any group of the class: the fallback's instance types are among the group's, its labels, taints and
    empty-node timeout are the group's (the NodePool gives them to every node), and it has no more nodes
    than the group, whose instance_count limits the pool. Each group is in at most one node class.
    """
    found: list[Problem] = []
    by_name = {g.name: g for g in groups}
    owner: dict[str, str] = {}
    for i, g in enumerate(groups):
        if not g.fallback_groups:
            continue
        key = f"instance_groups[{i}].fallback_groups"
        names = list(g.fallback_groups)
        if not eks:
            found.append(problem("only HyperPod EKS clusters have this", got=names, allowed="orchestrator eks").at(key))
            continue
        if not g.autoscale:
            found.append(
                problem("only an autoscaled group has a node class to share", got=names, allowed="autoscale: true").at(
                    key
                )
            )
        if g.capacity is not CapacityType.SPOT:
            found.append(
                problem(
                    "Karpenter takes Spot groups first, so only a Spot group falls back to others",
                    got=f"capacity {g.capacity.value}",
                    allowed="capacity: spot on this group",
                ).at(key)
            )
        if 1 + len(names) > MAX_NODE_CLASS_GROUPS:
            found.append(
                problem(
                    "more groups than one node class takes",
                    got=1 + len(names),
                    allowed=f"at most {MAX_NODE_CLASS_GROUPS} with this group",
                ).at(key)
            )
        types = _types(g)
        for j, name in enumerate(names):
            at = f"{key}[{j}]"
            fallback = by_name.get(name)
            if name == g.name:
                found.append(problem("names its own group", got=name, allowed="another instance group").at(at))
                continue
            if name in names[:j]:
                found.append(problem("listed twice", got=name, allowed="each group once").at(at))
                continue
            if fallback is None:
                others = [n for n in by_name if n != g.name]
                found.append(problem("no such instance group", got=name, allowed=others).at(at))
                continue
            found += [p.at(at) for p in _fallback_problems(g, fallback, types, owner.get(name))]
            owner.setdefault(name, g.name)
    return found


def _fallback_problems(
    group: NodeClassGroup, fallback: NodeClassGroup, types: list[str], other_owner: str | None
) -> list[Problem]:
    """Problems with ``fallback`` as a fallback group of ``group``, whose types are ``types``."""
    found = []
    name = fallback.name
    if not fallback.autoscale:
        # Karpenter adds the fallback's nodes too, so it starts at 0 like any scaled group.
        found.append(
            problem("not autoscaled: Karpenter adds its nodes", got=name, allowed=f"autoscale: true on {name}")
        )
    if fallback.fallback_groups:
        found.append(
            problem(
                "has fallback groups of its own; a group is in one node class",
                got=list(fallback.fallback_groups),
                allowed=f"no fallback_groups on {name}",
            )
        )
    if other_owner is not None:
        found.append(
            problem(
                "already a fallback of another group; a group is in one node class",
                got=name,
                allowed=f"only {other_owner}'s",
            )
        )
    if fallback.capacity is CapacityType.SPOT:
        found.append(
            problem(
                "a Spot fallback draws on the same Spot capacity in the cluster's one zone",
                got=f"{name}: capacity spot",
                allowed="an on-demand group",
            )
        )
    if extra := [t for t in _types(fallback) if t not in types]:
        found.append(
            problem(
                f"has instance types {group.name} lacks, which its training pods do not select",
                got=extra,
                allowed=types,
            )
        )
    if dict(fallback.labels) != dict(group.labels):
        found.append(
            problem(
                "other labels than its group; the shared NodePool gives every node the group's",
                got=dict(fallback.labels) or "no labels",
                allowed=dict(group.labels) or "no labels",
            )
        )
    if set(fallback.taints) != set(group.taints):
        found.append(
            problem(
                "other taints than its group; the shared NodePool gives every node the group's",
                got=[_taint_text(t) for t in fallback.taints] or "no taints",
                allowed=[_taint_text(t) for t in group.taints] or "no taints",
            )
        )
    if fallback.empty_node_timeout_s != group.empty_node_timeout_s:
        found.append(
            problem(
                "another empty_node_timeout_s than its group; the shared NodePool has the group's",
                got=fallback.empty_node_timeout_s,
                allowed=group.empty_node_timeout_s,
            )
        )
    if fallback.instance_count > group.instance_count:
        found.append(
            problem(
                "more nodes than the shared NodePool runs; its limit is the group's instance_count, for all its groups",
                got=fallback.instance_count,
                allowed=f"at most {group.instance_count}",
            )
        )
    return found
