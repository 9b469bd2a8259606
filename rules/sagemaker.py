"""SageMaker HyperPod: what CreateCluster rejects, or what makes a cluster fail after it is created."""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core import catalog
from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import Problem, problem
from moe_cdk.rules.hyperpod_capacity import CapacityType, capacity_problems, min_instance_count_problems
from moe_cdk.rules.hyperpod_updates import AutoPatch, ScheduledUpdate, update_problems

# SageMaker Developer Guide, "Configuring custom Kubernetes labels and taints": prefixes
# reserved for system use, which custom labels and taints may not carry.
RESERVED_PREFIXES = (
    "kubernetes.io/",
    "k8s.io/",
    "sagemaker.amazonaws.com/",
    "eks.amazonaws.com/",
    "k8s.aws/",
    "karpenter.sh/",
)
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


def taints_with_deep_health_checks_problem(taint_keys: Sequence[str], instance_type: str) -> Problem | None:
    """SageMaker Developer Guide, "Amazon EKS prerequisites", resiliency considerations: "You cannot
    add custom taints to nodes in instance groups with DeepHealthChecks turned on." """
    if not taint_keys:
        return None
    return problem(
        f"custom taints cannot be combined with deep health checks, which HyperPod runs on this "
        f"group's {instance_type} nodes",
        got=list(taint_keys),
        allowed="no taints, or deep_health_checks: false (select the nodes with labels instead)",
    )


def label_and_taint_key_problems(labels: Sequence[str], taints: Sequence[str]) -> list[Problem]:
    """Problems under ``labels`` or ``taints`` for label and taint keys HyperPod reserves, and for too many of
    either."""
    found = []
    for name, keys, limit in (("labels", labels, MAX_LABELS), ("taints", taints, MAX_TAINTS)):
        if len(keys) > limit:
            found.append(problem(f"too many {name}", got=len(keys), allowed=f"at most {limit}").at(name))
        for key in keys:
            if key.startswith(RESERVED_PREFIXES):
                found.append(
                    problem(
                        "uses a prefix reserved for system use",
                        got=key,
                        allowed=f"a key without the prefixes {', '.join(RESERVED_PREFIXES)}",
                    ).at(name)
                )
    return found


def provisioning_problems(
    *, continuous: bool, slurm_config_strategy: str | None, accounting_database: bool
) -> list[Problem]:
    """Problems with provisioning settings CreateCluster rejects. Not in CloudFormation's
    schema (cfn-lint passes them), so checked here."""
    found: list[Problem] = []
    # SageMaker Developer Guide, "Continuous provisioning for Slurm": "Passing any SlurmConfigStrategy
    # value results in an API error."
    if continuous and slurm_config_strategy is not None:
        found.append(
            problem(
                "continuous provisioning rejects any SlurmConfigStrategy",
                got=slurm_config_strategy,
                allowed="unset with node_provisioning_mode continuous",
            ).at("slurm_config_strategy")
        )
    # SageMaker API reference, ClusterOrchestratorSlurmConfig.AccountingDatabase: "only supported for
    # clusters using Continuous as the NodeProvisioningMode".
    if accounting_database and not continuous:
        found.append(
            problem(
                "an external accounting database needs continuous node provisioning",
                got="standard",
                allowed="node_provisioning_mode continuous (and no slurm_config_strategy)",
            ).at("accounting_database")
        )
    return found


@functools.cache
def _training_plan_arn_rule() -> dict:
    """``pattern``, ``min`` and ``max`` of ``TrainingPlanArn`` in botocore's SageMaker model,
    read once: the model takes about 50 ms to load, and both the configuration and the
    constructs check every group."""
    import botocore.session

    return (
        botocore.session.get_session()
        .get_service_model("sagemaker")
        .shape_for("ClusterInstanceGroupSpecification")
        .members["TrainingPlanArn"]
        .metadata
    )


def training_plan_arn_problem(arn: str) -> Problem | None:
    """Why CreateCluster would reject ``arn`` as a group's ``TrainingPlanArn``, or None. The
    rule is the API's own: the shape's pattern and length in botocore's SageMaker model."""
    rule = _training_plan_arn_rule()
    if rule["min"] <= len(arn) <= rule["max"] and re.fullmatch(rule["pattern"], arn):
        return None
    return problem(
        "not a SageMaker training plan ARN",
        got=arn,
        allowed=f"{rule['pattern']} ({rule['min']} to {rule['max']} characters), "
        "e.g. arn:aws:sagemaker:us-east-2:123456789012:training-plan/my-plan",
    )


def _deploy_time(text: str) -> bool:
    """True for a CDK token (a string holding ``${Token[...]}``, the CDK's encoding of a value only
    known at deploy time), which is not checked here."""
    return "${Token[" in text


# SageMaker API reference, ClusterInstanceGroupSpecification.InstanceGroupName.
GROUP_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


# SageMaker API reference, ClusterEbsVolumeConfig.VolumeSizeInGB: 1 to 16384.
EBS_RANGE_GIB = (1, 16384)


@dataclass(frozen=True, kw_only=True)
class HyperPodInstanceGroup:
    """The fields every HyperPod instance group has, whoever orchestrates the cluster."""

    name: str
    """Instance group name: letters, digits and inner hyphens, at most 63 characters. Required."""
    instance_type: str
    """A catalog type, by its ``ml.`` or EC2 name. Required."""
    instance_count: int
    """Nodes in the group. Required."""
    ebs_volume_size_gib: int = 500
    """Extra EBS volume per node, mounted by HyperPod at /opt/sagemaker, in GiB. Default: 500."""
    training_plan_arn: str | None = None
    """A SageMaker training plan that reserves this group's capacity. Default: on-demand."""
    deep_health_checks: bool = True
    """Run HyperPod's deep health checks (InstanceStress, InstanceConnectivity) when a node starts.
    They only exist for GPU and Trainium types and are skipped on others. Default: True."""
    image_id: str | None = None
    """The AMI the nodes boot (``ImageId``), a custom AMI's id. Default: unset, HyperPod's latest AMI."""
    scheduled_update: ScheduledUpdate | None = None
    """A recurring AMI update (``ScheduledUpdateConfig``). Default: none."""
    auto_patch: AutoPatch | None = None
    """Automatic security patching (``AutoPatchConfig``). Default: none."""
    fallback_instance_types: Sequence[str] = ()
    """Types HyperPod tries, in order, when ``instance_type`` has no capacity (with it, the
    ``InstanceRequirements`` list). Default: none."""
    capacity: CapacityType = CapacityType.ON_DEMAND
    """On-Demand or Spot capacity (``CapacityRequirements``). Default: On-Demand."""
    min_instance_count: int | None = None
    """Continuous provisioning: the nodes the group must have before HyperPod puts it in service
    (``MinInstanceCount``). Default: unset."""

    @property
    def instance_types(self) -> list[str]:
        """The ``ml.`` names of every type the group's nodes may be, first choice first."""
        return [
            (s.sagemaker_name if (s := catalog.lookup(t)) else t)
            for t in (self.instance_type, *self.fallback_instance_types)
        ]

    @property
    def autoscaled(self) -> bool:
        """Whether Karpenter sizes the group (EKS groups only)."""
        return False

    @property
    def runs_deep_health_checks(self) -> bool:
        """Whether HyperPod runs deep health checks on this group's nodes: asked for, and a type that has them
        (SageMaker Developer Guide, "Deep health checks": GPU and Trainium instances only)."""
        return self.deep_health_checks and self.spec is not None and self.spec.is_accelerated

    @property
    def spec(self) -> catalog.InstanceSpec | None:
        return catalog.lookup(self.instance_type)

    @property
    def runs_training(self) -> bool:
        """Whether training runs on this group (then it must have EFA when EFA is required)."""
        raise NotImplementedError

    @property
    def partition_name(self) -> Problem | None:
        """The Slurm partition of the group; None outside Slurm."""
        return None

    def worker_parameters(self) -> dict:
        """This group's ``worker_groups`` entry in provisioning_parameters.json."""
        return {
            "instance_group_name": self.name,
            "partition_name": self.partition_name,
            "instance_type": self.spec.sagemaker_name if self.spec else self.instance_type,
            "features": self.features(),
        }

    def features(self) -> list[str]:
        """Node features: ``efa`` when the type has EFA, the instance family, the accelerator kind."""
        spec = self.spec
        if spec is None:
            return []
        kind = {"nvidia-gpu": "gpu", "trainium": "trainium", "none": "cpu"}[spec.accelerator_kind.value]
        return [*(["efa"] if spec.supports_efa else []), spec.ec2_name.split(".")[0], kind]


def instance_group_problems(
    groups: Sequence[HyperPodInstanceGroup], *, require_efa: bool, eks: bool = False, continuous: bool = False
) -> list[Problem]:
    """Problems with the rules every HyperPod instance group follows; ``eks`` and ``continuous`` say
    whether the cluster is orchestrated by EKS and provisions continuously."""
    found: list[Problem] = []
    names = [g.name for g in groups]
    for i, g in enumerate(groups):
        key = f"instance_groups[{i}]"
        if not GROUP_NAME.match(g.name):
            found.append(
                problem(
                    "not a valid instance group name",
                    got=g.name,
                    allowed="letters, digits and inner hyphens, 1 to 63 characters",
                ).at(f"{key}.name")
            )
        if g.name in names[:i]:
            found.append(problem("duplicate group name", got=g.name, allowed="unique names").at(f"{key}.name"))
        if g.spec is None:
            found.append(catalog.unknown_instance_type(g.instance_type).at(f"{key}.instance_type"))
        elif require_efa and g.runs_training and not g.spec.supports_efa:
            found.append(
                problem(
                    "has no EFA, and EFA is required",
                    got=g.instance_type,
                    allowed="an EFA-capable type, e.g. ml.p5en.48xlarge",
                ).at(f"{key}.instance_type")
            )
        if g.instance_count < 1:
            found.append(
                problem("must be at least 1", got=g.instance_count, allowed="1 or more").at(f"{key}.instance_count")
            )
        low, high = EBS_RANGE_GIB
        if not low <= g.ebs_volume_size_gib <= high:
            found.append(
                problem("out of range", got=g.ebs_volume_size_gib, allowed=f"{low} to {high} GiB").at(
                    f"{key}.ebs_volume_size_gib"
                )
            )
        if g.training_plan_arn is not None and (message := training_plan_arn_problem(g.training_plan_arn)):
            found.append(message.at(f"{key}.training_plan_arn"))
        found += [
            p.at(key)
            for p in update_problems(
                image_id=g.image_id,
                scheduled_update=g.scheduled_update,
                auto_patch=g.auto_patch,
                instance_count=g.instance_count,
            )
        ]
        found += [
            p.at(key)
            for p in capacity_problems(
                instance_types=[g.instance_type, *g.fallback_instance_types],
                capacity=g.capacity,
                autoscale=g.autoscaled,
                trains=g.runs_training,
                deep_health_checks=g.runs_deep_health_checks,
                training_plan=g.training_plan_arn is not None,
                eks=eks,
                continuous=continuous,
                require_efa=require_efa,
            )
        ]
        found += [
            p.at(key)
            for p in min_instance_count_problems(
                g.min_instance_count, instance_count=g.instance_count, eks=eks, continuous=continuous
            )
        ]
    return found


def subnet_nodes(groups: Sequence[HyperPodInstanceGroup], *, eks: bool) -> list[tuple[str, int, int]]:
    """``(instance type, count, addresses each)`` per group, for ``rules.ec2.subnet_capacity_problem``."""
    found = []
    for g in groups:
        # A flexible group's node may be any of its types: count the one with the most network cards.
        specs = [s for t in (g.instance_type, *g.fallback_instance_types) if (s := catalog.lookup(t))]
        if specs:
            cards = max(s.efa_interfaces for s in specs)
            found.append((g.instance_type, g.instance_count, node_ip_addresses(network_cards=cards, eks=eks)))
    return found


DATABASE_NAME = re.compile(r"^[a-zA-Z0-9$_]{1,64}$")
DATABASE_USER = re.compile(r"^[A-Za-z0-9._-]{1,32}$")


HOST_NAME = re.compile(
    r"^(?=.{1,255}$)[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$"
)


SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+$")


class NodeType(enum.Enum):
    """``SlurmConfig.NodeType`` of an instance group."""

    CONTROLLER = "Controller"
    LOGIN = "Login"
    COMPUTE = "Compute"


class SlurmConfigStrategy(enum.Enum):
    """Who owns slurm.conf (``Orchestrator.Slurm.SlurmConfigStrategy``)."""

    MANAGED = "Managed"
    OVERWRITE = "Overwrite"
    MERGE = "Merge"


@dataclass(frozen=True, kw_only=True)
class SlurmInstanceGroup(HyperPodInstanceGroup):
    """One instance group of a Slurm cluster."""

    node_type: NodeType
    """Controller, Login or Compute. Required."""
    partition: str | None = None
    """Slurm partition of a compute group. Default: the group name."""

    @property
    def runs_training(self) -> bool:
        return self.node_type is NodeType.COMPUTE

    @property
    def partition_name(self) -> str | None:
        return (self.partition or self.name) if self.node_type is NodeType.COMPUTE else None


class NodeProvisioningMode(enum.Enum):
    """How HyperPod provisions the cluster's nodes (``NodeProvisioningMode``)."""

    STANDARD = "standard"
    """All nodes at creation; creation fails when a group cannot be filled (the property is omitted)."""
    CONTINUOUS = "continuous"
    """Partial capacity is accepted and failed launches are retried (``Continuous``). SageMaker Developer
    Guide, "Continuous provisioning for Slurm": it rejects any ``SlurmConfigStrategy``, and it is the only
    mode with an external accounting database."""


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class AccountingDatabase:
    """An external MySQL-compatible database for slurmdbd (``Orchestrator.Slurm.AccountingDatabase``)."""

    endpoint: str
    """Database host name. Required."""
    secret_arn: str
    """ARN of the Secrets Manager secret with the database credentials. Required."""
    name: str = "slurm_acct_db"
    """Database name. Default: slurm_acct_db."""
    port: int = 3306
    """Database port. Default: 3306."""
    user_name: str | None = None
    """ParallelCluster only, and required there: the database user slurmdbd connects as (its
    ``SlurmSettings.Database.UserName``); the secret then holds that user's password alone, as plain text. HyperPod
    reads both from the secret. Default: none."""

    def problems(self) -> Iterator[Problem]:
        if not _deploy_time(self.secret_arn) and not SECRET_ARN.match(self.secret_arn):
            yield problem(
                "not a Secrets Manager secret ARN",
                got=self.secret_arn,
                allowed="arn:aws:secretsmanager:<region>:<account>:secret:<name>",
            ).at("secret_arn")
        if not 1 <= self.port <= 65535:
            yield problem("not a TCP port", got=self.port, allowed="1 to 65535").at("port")
        # SageMaker API reference, ClusterAccountingDatabase: Name is 1 to 64 of [a-zA-Z0-9$_], Endpoint a host name.
        if not DATABASE_NAME.match(self.name):
            yield problem("not a database name", got=self.name, allowed="1 to 64 letters, digits, '$' or '_'").at(
                "name"
            )
        # MySQL and MariaDB user names: at most 32 characters (MySQL Reference Manual, "Grant Tables").
        if self.user_name is not None and not DATABASE_USER.match(self.user_name):
            yield problem(
                "not a database user name", got=self.user_name, allowed="1 to 32 letters, digits, '.', '-' or '_'"
            ).at("user_name")
        if not _deploy_time(self.endpoint) and not HOST_NAME.match(self.endpoint):
            yield problem("not a host name", got=self.endpoint, allowed="a DNS name of up to 255 characters").at(
                "endpoint"
            )


def group_problems(
    instance_groups: Sequence[SlurmInstanceGroup], *, require_efa: bool, slurm: bool = True, continuous: bool = False
) -> list[Problem]:
    """Problems with instance groups HyperPod or the lifecycle scripts would reject.
    ``slurm=False`` drops the Slurm-only rules (controller and login groups); ``continuous`` says whether
    the cluster provisions continuously."""
    groups = list(instance_groups)
    found = instance_group_problems(groups, require_efa=require_efa, continuous=continuous)
    for i, g in enumerate(groups):
        key = f"instance_groups[{i}]"
        if g.partition is not None and g.node_type is not NodeType.COMPUTE:
            found.append(
                problem("only compute groups have a partition", got=g.partition, allowed="None").at(f"{key}.partition")
            )
        # SageMaker Developer Guide, "Update your AMI version in your SageMaker HyperPod cluster": "Updating
        # your cluster in batches is available only for HyperPod clusters integrated with Amazon EKS."
        for section_key, section in (("scheduled_update", g.scheduled_update), ("auto_patch", g.auto_patch)):
            if slurm and section is not None and section.rolling is not None:
                found.append(
                    problem(
                        "updates in batches are for EKS clusters only",
                        got=f"batch_size {section.rolling.batch_size} {section.rolling.batch_unit.value}",
                        allowed="no rolling section on a Slurm cluster",
                    ).at(f"{key}.{section_key}.rolling")
                )
        if g.partition_name is not None and not GROUP_NAME.match(g.partition_name):
            found.append(
                problem(
                    "not a valid partition name", got=g.partition_name, allowed="letters, digits and inner hyphens"
                ).at(f"{key}.partition")
            )
    types = [g.node_type for g in groups]
    controllers = [g for g in groups if g.node_type is NodeType.CONTROLLER]
    if slurm and (len(controllers) != 1 or controllers[0].instance_count != 1):
        found.append(
            problem(
                "needs exactly one controller group with instance_count 1",
                got=[(g.name, g.instance_count) for g in controllers],
                allowed="one controller node",
            ).at("instance_groups")
        )
    if slurm and types.count(NodeType.LOGIN) > 1:
        found.append(
            problem("at most one login group", got=types.count(NodeType.LOGIN), allowed="0 or 1").at("instance_groups")
        )
    if NodeType.COMPUTE not in types:
        found.append(
            problem(
                "needs at least one compute group", got=[t.value for t in types], allowed="one or more Compute groups"
            ).at("instance_groups")
        )
    return found


def slurm_provisioning_problems(
    *,
    mode: NodeProvisioningMode,
    slurm_config_strategy: SlurmConfigStrategy | None,
    accounting_database: AccountingDatabase | None,
) -> list[Problem]:
    """Problems with provisioning settings CreateCluster rejects (``provisioning_problems``), and
    for a bad accounting database."""
    found = provisioning_problems(
        continuous=mode is NodeProvisioningMode.CONTINUOUS,
        accounting_database=accounting_database is not None,
        slurm_config_strategy=None if slurm_config_strategy is None else slurm_config_strategy.value,
    )
    if accounting_database is not None:
        found += [p.at("accounting_database") for p in accounting_database.problems()]
        if accounting_database.user_name is not None:
            found.append(
                problem(
                    "ParallelCluster only: HyperPod reads the user name from the secret",
                    got=accounting_database.user_name,
                    allowed="unset on HyperPod",
                ).at("accounting_database.user_name")
            )
    return found


# Kubernetes label keys and values ("Labels and Selectors"): an optional DNS-subdomain
# prefix, then a name of at most 63 characters; values are empty or such a name.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")


LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


class EksNodeRole(enum.Enum):
    """What a group's nodes run."""

    COMPUTE = "compute"
    """Training pods."""
    SYSTEM = "system"
    """Operators, CoreDNS and other cluster services."""


class TaintEffect(enum.Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class Taint:
    """A Kubernetes taint on every node of a group."""

    key: str
    """Taint key, a Kubernetes label key. Required."""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE
    """NoSchedule, PreferNoSchedule or NoExecute. Default: NoSchedule."""
    value: str | None = None
    """Taint value. Default: none."""

    def toleration(self) -> dict:
        """The pod toleration that matches this taint."""
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect.value}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect.value}


@dataclass(frozen=True, kw_only=True)
class EksInstanceGroup(HyperPodInstanceGroup):
    """One instance group of an EKS-orchestrated cluster."""

    role: EksNodeRole = EksNodeRole.COMPUTE
    """compute (training) or system (cluster services). Default: compute."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Kubernetes labels on every node. Default: none."""
    taints: Sequence[Taint] = ()
    """Kubernetes taints on every node. Default: none."""
    autoscale: bool = False
    """Karpenter starts the group at 0 nodes and adds nodes, up to ``instance_count``, for pods that
    wait for them (needs continuous provisioning). Default: False."""
    empty_node_timeout_s: int = 600
    """With ``autoscale``: how long a node may sit without training pods before Karpenter removes
    it, in seconds. Default: 600."""

    @property
    def runs_training(self) -> bool:
        return self.role is EksNodeRole.COMPUTE

    @property
    def autoscaled(self) -> bool:
        return self.autoscale


def kubernetes_metadata_problems(groups: Sequence[EksInstanceGroup]) -> list[Problem]:
    found = []
    for i, g in enumerate(groups):
        if g.runs_deep_health_checks and (
            p := taints_with_deep_health_checks_problem([t.key for t in g.taints], g.instance_type)
        ):
            found.append(p.at(f"instance_groups[{i}].taints"))
        found += [
            p.at(f"instance_groups[{i}]")
            for p in label_and_taint_key_problems(list(g.labels), [t.key for t in g.taints])
        ]
        for key, value in g.labels.items():
            if not LABEL_KEY.match(key):
                found.append(
                    problem(
                        "not a Kubernetes label key", got=key, allowed="[prefix/]name, name at most 63 characters"
                    ).at(f"instance_groups[{i}].labels")
                )
            if not LABEL_VALUE.match(value):
                found.append(
                    problem(
                        "not a Kubernetes label value", got=value, allowed="at most 63 letters, digits, '-', '_', '.'"
                    ).at(f"instance_groups[{i}].labels.{key}")
                )
        for j, taint in enumerate(g.taints):
            if not LABEL_KEY.match(taint.key):
                found.append(
                    problem("not a Kubernetes taint key", got=taint.key, allowed="[prefix/]name").at(
                        f"instance_groups[{i}].taints[{j}].key"
                    )
                )
            if taint.value is not None and not LABEL_VALUE.match(taint.value):
                found.append(
                    problem("not a Kubernetes taint value", got=taint.value, allowed="at most 63 characters").at(
                        f"instance_groups[{i}].taints[{j}].value"
                    )
                )
    return found


def eks_group_problems(
    groups: Sequence[EksInstanceGroup], *, require_efa: bool, continuous: bool = False
) -> list[Problem]:
    """Problems with groups HyperPod, Kubernetes or the lifecycle scripts would reject; ``continuous``
    says whether the cluster provisions continuously."""
    found = instance_group_problems(groups, require_efa=require_efa, eks=True, continuous=continuous)
    found += kubernetes_metadata_problems(groups)
    for i, g in enumerate(groups):
        if g.autoscale and g.empty_node_timeout_s < 0:
            found.append(
                problem("must not be negative", got=g.empty_node_timeout_s, allowed="0 or more seconds").at(
                    f"instance_groups[{i}].empty_node_timeout_s"
                )
            )
    roles = [g.role for g in groups]
    if EksNodeRole.COMPUTE not in roles:
        found.append(
            problem(
                "needs at least one compute group",
                got=[r.value for r in roles],
                allowed="one or more groups with role compute",
            ).at("instance_groups")
        )
    if EksNodeRole.SYSTEM not in roles:
        found.append(
            problem(
                "needs a system group: HyperPod brings every node, so operators and CoreDNS need untainted nodes",
                got=[r.value for r in roles],
                allowed="a group with role system, e.g. ml.m5.2xlarge",
            ).at("instance_groups")
        )
    return found
