"""SageMaker HyperPod: what CreateCluster rejects, or what makes a cluster fail after it is created."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from moe_cdk.training.schema import problem

# SageMaker Developer Guide, "Configuring custom Kubernetes labels and taints": prefixes
# reserved for system use, which custom labels and taints may not carry.
RESERVED_PREFIXES = ("kubernetes.io/", "k8s.io/", "sagemaker.amazonaws.com/", "eks.amazonaws.com/", "k8s.aws/",
                     "karpenter.sh/")
# SageMaker API reference, ClusterKubernetesConfig: Labels and Taints hold at most 50 entries each.
MAX_LABELS = MAX_TAINTS = 50

# SageMaker Developer Guide, "Prerequisites for using SageMaker HyperPod", custom VPC: "For
# Slurm-orchestrated clusters, each P5 instance can create 32 IP addresses (one per network
# card). For EKS-orchestrated clusters, each P5 instance can create 81 IP addresses (50 from the
# primary card plus one from each of the remaining 31 cards)." The guide gives no other type;
# the rule is applied per network card (one per EFA interface: p5en 16 on Slurm, 65 on EKS), and
# a type without EFA counts one card. 50 is the primary interface's IPv4 limit of the
# accelerated types (and more than an m5's), so the EKS figure is an upper bound there.
PRIMARY_INTERFACE_IPV4 = 50


def node_ip_addresses(*, network_cards: int, eks: bool) -> int:
    """Private IPv4 addresses one HyperPod node with ``network_cards`` cards can take from its subnet."""
    cards = max(1, network_cards)
    return PRIMARY_INTERFACE_IPV4 + cards - 1 if eks else cards


def taints_with_deep_health_checks_problem(taint_keys: Sequence[str], instance_type: str) -> str | None:
    """SageMaker Developer Guide, "Amazon EKS prerequisites", resiliency considerations: "You cannot
    add custom taints to nodes in instance groups with DeepHealthChecks turned on." """
    if not taint_keys:
        return None
    return problem(f"custom taints cannot be combined with deep health checks, which HyperPod runs on this "
                   f"group's {instance_type} nodes", got=list(taint_keys),
                   allowed="no taints, or deep_health_checks: false (select the nodes with labels instead)")


def label_and_taint_key_problems(labels: Sequence[str], taints: Sequence[str]) -> list[tuple[str, str]]:
    """``("labels" | "taints", message)`` for label and taint keys HyperPod reserves, and for too many of either."""
    found = []
    for name, keys, limit in (("labels", labels, MAX_LABELS), ("taints", taints, MAX_TAINTS)):
        if len(keys) > limit:
            found.append((name, problem(f"too many {name}", got=len(keys), allowed=f"at most {limit}")))
        for key in keys:
            if key.startswith(RESERVED_PREFIXES):
                found.append((name, problem("uses a prefix reserved for system use", got=key,
                                            allowed=f"a key without the prefixes {', '.join(RESERVED_PREFIXES)}")))
    return found


def provisioning_problems(*, continuous: bool, slurm_config_strategy: str | None,
                          accounting_database: bool) -> list[tuple[str, str]]:
    """``(key, message)`` for provisioning settings CreateCluster rejects. Not in CloudFormation's
    schema (cfn-lint passes them), so checked here."""
    found: list[tuple[str, str]] = []
    # SageMaker Developer Guide, "Continuous provisioning for Slurm": "Passing any SlurmConfigStrategy
    # value results in an API error."
    if continuous and slurm_config_strategy is not None:
        found.append(("slurm_config_strategy", problem(
            "continuous provisioning rejects any SlurmConfigStrategy", got=slurm_config_strategy,
            allowed="unset with node_provisioning_mode continuous")))
    # SageMaker API reference, ClusterOrchestratorSlurmConfig.AccountingDatabase: "only supported for
    # clusters using Continuous as the NodeProvisioningMode".
    if accounting_database and not continuous:
        found.append(("accounting_database", problem(
            "an external accounting database needs continuous node provisioning", got="standard",
            allowed="node_provisioning_mode continuous (and no slurm_config_strategy)")))
    return found


@functools.cache
def _training_plan_arn_rule() -> dict:
    """``pattern``, ``min`` and ``max`` of ``TrainingPlanArn`` in botocore's SageMaker model,
    read once: the model takes about 50 ms to load, and both the configuration and the
    constructs check every group."""
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker").shape_for(
        "ClusterInstanceGroupSpecification").members["TrainingPlanArn"].metadata


def training_plan_arn_problem(arn: str) -> str | None:
    """Why CreateCluster would reject ``arn`` as a group's ``TrainingPlanArn``, or None. The
    rule is the API's own: the shape's pattern and length in botocore's SageMaker model."""
    rule = _training_plan_arn_rule()
    if rule["min"] <= len(arn) <= rule["max"] and re.fullmatch(rule["pattern"], arn):
        return None
    return problem("not a SageMaker training plan ARN", got=arn,
                   allowed=f"{rule['pattern']} ({rule['min']} to {rule['max']} characters), "
                           "e.g. arn:aws:sagemaker:us-east-2:123456789012:training-plan/my-plan")
