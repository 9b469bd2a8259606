"""The typed moe-cdk configuration: one frozen dataclass per YAML section.

``load_config(path)`` returns a ``Config`` or raises ``ConfigError`` carrying every
problem, one ``path.to.key: what (got X; allowed Y)`` line each. Rules that a construct
also enforces are imported from the construct's module, so both word them the same way.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import field
from pathlib import Path

import yaml
from pydantic.dataclasses import dataclass

from moe_cdk.core import catalog
from moe_cdk.core.loader import SECTION, json_schema, parse, render_docs
from moe_cdk.core.names import project_root
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.rules import eks as eks_rules, parallelcluster as pcluster_rules, serving as serving_rules
from moe_cdk.rules.ec2 import availability_zone_problem, cidr_problems, subnet_capacity_problem
from moe_cdk.rules.eks import (
    KUBERNETES_NAME,
    EndpointAccess,
    addon_version_problems,
    endpoint_problems,
    kubernetes_version_problem,
)
from moe_cdk.rules.fsx import (
    DEFAULT_ASSOCIATIONS,
    DataRepositoryAssociation,
    association_problems,
    capacity_problem,
    efa_client_problems,
    throughput_problem,
)
from moe_cdk.rules.hyperpod_capacity import CapacityType, TieredStorage, fallback_group_problems
from moe_cdk.rules.hyperpod_updates import AutoPatch, ScheduledUpdate
from moe_cdk.rules.logs import retention_problem
from moe_cdk.rules.neuron import TrainingStack, resolve, stack_problem
from moe_cdk.rules.parallelcluster import DeletionPolicy, OperatingSystem, QueueUpdateStrategy
from moe_cdk.rules.sagemaker import (
    AccountingDatabase,
    EksInstanceGroup,
    EksNodeRole,
    NodeProvisioningMode,
    NodeType,
    SlurmConfigStrategy,
    SlurmInstanceGroup,
    Taint,
    eks_group_problems,
    group_problems,
    slurm_provisioning_problems,
    subnet_nodes,
)
from moe_cdk.rules.teams import TeamsConfig, eks_team_problems

Problems = Iterator[Problem]

# At most 24 characters: the lifecycle bucket `sagemaker-<account>-<region>-<name>` must fit S3's 63.
_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9-]{0,22}[A-Za-z0-9])?$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
# SageMaker API reference, ClusterInstanceGroupSpecification.InstanceGroupName.
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8}([0-9a-f]{9})?$")


def _bucket_name_problem(name: str) -> Problem | None:
    """Amazon S3 User Guide, "General purpose bucket naming rules"."""
    if re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", name):
        return None
    return problem("not a valid S3 bucket name", got=name, allowed="3 to 63 lowercase letters, digits, '.' and '-'")


class Orchestrator(enum.Enum):
    """Who schedules the training."""

    SLURM = "slurm"
    EKS = "eks"
    TRAINING_JOB = "training-job"
    PARALLELCLUSTER = "parallelcluster"


class NodeRole(enum.Enum):
    """What an instance group does in the cluster."""

    CONTROLLER = "controller"
    LOGIN = "login"
    COMPUTE = "compute"
    SYSTEM = "system"


_NODE_TYPES = {
    NodeRole.CONTROLLER: NodeType.CONTROLLER,
    NodeRole.LOGIN: NodeType.LOGIN,
    NodeRole.COMPUTE: NodeType.COMPUTE,
}
_EKS_ROLES = {NodeRole.COMPUTE: EksNodeRole.COMPUTE, NodeRole.SYSTEM: EksNodeRole.SYSTEM}


class SlurmStrategy(enum.Enum):
    """Who owns slurm.conf on the cluster."""

    MANAGED = "managed"
    OVERWRITE = "overwrite"
    MERGE = "merge"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class InstanceGroupConfig:
    """One group of identical nodes."""

    name: str
    """Group name, as HyperPod shows it: letters, digits and inner hyphens, at most 63 characters."""
    role: NodeRole
    """controller (the Slurm head node), login, compute, or system (EKS: nodes for operators and CoreDNS)."""
    instance_type: str
    """An instance type from the catalog, by its `ml.` or EC2 name, e.g. `ml.p5en.48xlarge`."""
    instance_count: int
    """Number of nodes in the group, at least 1."""
    partition: str | None = None
    """Slurm partition of a compute group. Default: the group name."""
    ebs_volume_size_gib: int = 500
    """Extra EBS volume per node in GiB (HyperPod mounts it at /opt/sagemaker), 1 to 16384."""
    training_plan_arn: str | None = None
    """A SageMaker training plan that reserves this group's capacity. Default: on-demand."""
    deep_health_checks: bool = True
    """Run HyperPod's deep health checks (stress and NCCL connectivity tests) when a node starts; GPU and Trainium types
    only, skipped on others. EKS: a group with them cannot carry taints."""
    labels: dict[str, str] = field(default_factory=dict)
    """EKS only: Kubernetes labels on every node of the group."""
    # The construct's own Taint dataclass: the same keys, defaults and checks.
    taints: tuple[Taint, ...] = ()
    """EKS only: Kubernetes taints on every node of the group; `moe-cdk eks render` adds the matching tolerations."""
    image_id: str | None = None
    """The AMI the nodes boot: a custom AMI's id (`ami-...`: unencrypted, owned by this account, one volume).
    Default: unset, HyperPod's latest AMI. docs/capacity.md."""
    scheduled_update: ScheduledUpdate | None = None
    """A recurring update of the nodes to HyperPod's newest AMI (on EKS, batch by batch). Default: none.
    docs/capacity.md."""
    auto_patch: AutoPatch | None = None
    """HyperPod's automatic security patching of the AMI, applied as nodes fall idle. Default: none.
    docs/capacity.md."""
    fallback_instance_types: tuple[str, ...] = ()
    """EKS, continuous provisioning: types HyperPod tries in order when `instance_type` has no capacity (at most 19;
    compute groups: as many accelerators as `instance_type`). Default: none. docs/capacity.md."""
    capacity: CapacityType = CapacityType.ON_DEMAND
    """EKS, continuous provisioning: on-demand or spot. Spot nodes can be taken back with 2 minutes' notice; the
    trainer resumes from its last checkpoint. ParallelCluster compute groups: on-demand, spot or capacity-block (with
    `capacity_reservation_id`). Default: on-demand. docs/capacity.md."""
    autoscale: bool = False
    """EKS, continuous provisioning, compute groups: Karpenter starts the group at 0 nodes and adds nodes, up to
    `instance_count`, while training pods wait for them (`moe-cdk eks node-pools` writes its objects). Default:
    false. docs/capacity.md."""
    empty_node_timeout_s: int = 600
    """With `autoscale`: seconds a node may sit without training pods before Karpenter removes it."""
    fallback_groups: tuple[str, ...] = ()
    """EKS, on an autoscaled Spot group: autoscaled On-Demand groups Karpenter adds nodes to when this group gets no
    Spot capacity. They share its HyperpodNodeClass and NodePool, so they have its labels, taints and empty-node
    timeout, some of its instance types and at most its `instance_count`. Default: none. docs/capacity.md."""
    min_instance_count: int | None = None
    """Slurm, continuous provisioning: the nodes the group must have before HyperPod puts it in service; not reached
    within 3 hours, the group rolls back. 0 to `instance_count`. Default: unset, in service from the first node.
    ParallelCluster compute groups: the nodes kept running (MinCount); the rest, up to `instance_count`, start when
    jobs wait for them. Default there: `instance_count`. docs/capacity.md."""
    capacity_reservation_id: str | None = None
    """ParallelCluster compute groups: the EC2 capacity reservation the nodes launch into (`cr-...`): a Capacity Block
    with `capacity: capacity-block`, or an On-Demand Capacity Reservation with `capacity: on-demand`. Default: none.
    docs/parallelcluster.md."""

    @property
    def specs(self) -> list[catalog.InstanceSpec]:
        """The catalog's figures for `instance_type` and each fallback, first choice first (a loaded
        configuration names only types the catalog knows)."""
        return [catalog.lookup(t) for t in (self.instance_type, *self.fallback_instance_types)]

    def to_eks_props(self) -> EksInstanceGroup:
        # A Slurm-only role is reported on its own (ClusterConfig._eks_problems); as a system
        # group it draws no second, EFA-related error.
        return EksInstanceGroup(
            name=self.name,
            role=_EKS_ROLES.get(self.role, EksNodeRole.SYSTEM),
            instance_type=self.instance_type,
            instance_count=self.instance_count,
            ebs_volume_size_gib=self.ebs_volume_size_gib,
            training_plan_arn=self.training_plan_arn,
            deep_health_checks=self.deep_health_checks,
            **self._hyperpod_props(),
            labels=dict(self.labels),
            taints=self.taints,
            autoscale=self.autoscale,
            empty_node_timeout_s=self.empty_node_timeout_s,
        )

    def to_props(self) -> SlurmInstanceGroup:
        return SlurmInstanceGroup(
            name=self.name,
            node_type=_NODE_TYPES.get(self.role, NodeType.COMPUTE),
            instance_type=self.instance_type,
            instance_count=self.instance_count,
            partition=self.partition,
            ebs_volume_size_gib=self.ebs_volume_size_gib,
            training_plan_arn=self.training_plan_arn,
            deep_health_checks=self.deep_health_checks,
            **self._hyperpod_props(),
        )

    def _hyperpod_props(self) -> dict:
        return {
            "image_id": self.image_id,
            "scheduled_update": self.scheduled_update,
            "auto_patch": self.auto_patch,
            "fallback_instance_types": self.fallback_instance_types,
            "capacity": self.capacity,
            "min_instance_count": self.min_instance_count,
        }


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ClusterConfig:
    """The training capacity and who orchestrates it."""

    orchestrator: Orchestrator = Orchestrator.SLURM
    """slurm (HyperPod Slurm), eks (HyperPod EKS), training-job (SageMaker Training Jobs) or parallelcluster (AWS
    ParallelCluster's Slurm: docs/parallelcluster.md)."""
    availability_zone: str
    """The zone the capacity is in, e.g. `us-east-2a`. Subnets and the file system follow it."""
    require_efa: bool = True
    """Reject compute groups whose instance type has no EFA."""
    instance_groups: tuple[InstanceGroupConfig, ...]
    """The node groups. Slurm: exactly one controller group of one node, at most one login group, one or more compute
    groups. Training jobs: one compute group."""
    # The construct's own enum and dataclass: the same values, defaults and checks.
    node_provisioning_mode: NodeProvisioningMode = NodeProvisioningMode.STANDARD
    """HyperPod: standard (every node at creation, or creation fails) or continuous (partial capacity accepted, failed
    launches retried; needed for `accounting_database`, and on EKS for `autoscale`, `capacity: spot` and
    `fallback_instance_types`)."""
    slurm_config_strategy: SlurmStrategy | None = None
    """Who owns slurm.conf: managed (HyperPod), overwrite or merge. Default: managed; leave unset with continuous
    provisioning, which rejects it."""
    accounting_database: AccountingDatabase | None = None
    """External Slurm accounting database (MySQL-compatible; credentials in Secrets Manager). HyperPod: needs
    `node_provisioning_mode: continuous`; ParallelCluster: needs `user_name`, and is needed for `teams`. Default: none
    (HyperPod's database on the controller; no accounting on ParallelCluster)."""
    tiered_storage: TieredStorage | None = None
    """EKS: HyperPod's managed tiered checkpointing, `memory_percent` (1 to 100) of each node's host memory kept for
    checkpoints. Default: off. docs/capacity.md."""

    def problems(self) -> Problems:
        if self.orchestrator is Orchestrator.PARALLELCLUSTER:
            yield from self._parallelcluster_problems()
            return
        for i, g in enumerate(self.instance_groups):
            for key, value in (("capacity", g.capacity is CapacityType.CAPACITY_BLOCK),
                               ("capacity_reservation_id", g.capacity_reservation_id is not None)):  # fmt: skip
                if value:
                    yield problem(
                        "only ParallelCluster groups launch into an EC2 capacity reservation; HyperPod reserves "
                        "capacity through training plans (training_plan_arn)",
                        got=getattr(g, key) if key == "capacity_reservation_id" else g.capacity.value,
                        allowed="orchestrator parallelcluster",
                    ).at(f"instance_groups[{i}].{key}")
        if self.orchestrator is not Orchestrator.SLURM:
            for key, default in (("slurm_config_strategy", None), ("accounting_database", None)):
                if getattr(self, key) != default:
                    yield problem(
                        "only Slurm clusters have this setting",
                        got=getattr(self, key),
                        allowed=f"unset with orchestrator {self.orchestrator.value}",
                    ).at(key)
        if (
            self.orchestrator is Orchestrator.TRAINING_JOB
            and self.node_provisioning_mode is not NodeProvisioningMode.STANDARD
        ):
            yield problem(
                "only HyperPod clusters have this setting",
                got=self.node_provisioning_mode.value,
                allowed="unset with orchestrator training-job",
            ).at("node_provisioning_mode")
        if self.orchestrator is not Orchestrator.EKS:
            # SageMaker Developer Guide, "Managed tiered checkpointing": EKS-orchestrated clusters only.
            if self.tiered_storage is not None:
                yield problem(
                    "only HyperPod EKS clusters have managed tiered checkpointing",
                    got=f"memory_percent {self.tiered_storage.memory_percent}",
                    allowed="no tiered_storage with this orchestrator",
                ).at("tiered_storage")
            for i, g in enumerate(self.instance_groups):
                if g.autoscale:
                    yield problem(
                        "only HyperPod EKS clusters have Karpenter autoscaling",
                        got=True,
                        allowed="false with this orchestrator",
                    ).at(f"instance_groups[{i}].autoscale")
        yield from fallback_group_problems(self.instance_groups, eks=self.orchestrator is Orchestrator.EKS)
        if self.orchestrator is Orchestrator.EKS:
            yield from self._eks_problems()
            return
        yield from group_problems(
            [g.to_props() for g in self.instance_groups],
            require_efa=self.require_efa,
            slurm=self.orchestrator is Orchestrator.SLURM,
            continuous=self.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS,
        )
        if self.orchestrator is Orchestrator.SLURM:
            yield from slurm_provisioning_problems(
                mode=self.node_provisioning_mode,
                accounting_database=self.accounting_database,
                slurm_config_strategy=self.construct_slurm_config_strategy,
            )
        for i, g in enumerate(self.instance_groups):
            if g.role is NodeRole.SYSTEM:
                yield problem(
                    "system groups are for EKS clusters", got=g.role.value, allowed="controller, login or compute"
                ).at(f"instance_groups[{i}].role")
            for key in ("labels", "taints"):
                if getattr(g, key):
                    yield problem(
                        "only EKS nodes have Kubernetes labels and taints",
                        got=getattr(g, key),
                        allowed="none with this orchestrator",
                    ).at(f"instance_groups[{i}].{key}")
            for key in ("image_id", "scheduled_update", "auto_patch", "min_instance_count"):
                value = getattr(g, key)
                if self.orchestrator is Orchestrator.TRAINING_JOB and value is not None:
                    yield problem(
                        "only HyperPod instance groups have this setting",
                        got=value if isinstance(value, str | int) else "a mapping",
                        allowed="unset with orchestrator training-job",
                    ).at(f"instance_groups[{i}].{key}")
        if self.orchestrator is Orchestrator.TRAINING_JOB:
            other = [g.name for g in self.instance_groups if g.role is not NodeRole.COMPUTE]
            if other or len(self.instance_groups) != 1:
                yield problem(
                    "a training job runs on exactly one compute group",
                    got=[(g.name, g.role.value) for g in self.instance_groups],
                    allowed="one group with role: compute",
                ).at("instance_groups")

    def _parallelcluster_problems(self) -> Problems:
        """ParallelCluster's own Slurm: the head node is the controller group, a login group is a login node pool,
        each compute group a queue of one compute resource (docs/parallelcluster.md)."""
        hyperpod_only = "a HyperPod setting; ParallelCluster has no such setting"
        for key in ("slurm_config_strategy", "tiered_storage"):
            if getattr(self, key) is not None:
                yield problem(hyperpod_only, got="set", allowed="unset with orchestrator parallelcluster").at(key)
        if self.accounting_database is not None:
            yield from (p.at("accounting_database") for p in pcluster_rules.database_problems(self.accounting_database))
        if self.node_provisioning_mode is not NodeProvisioningMode.STANDARD:
            yield problem(
                hyperpod_only, got=self.node_provisioning_mode.value, allowed="unset with orchestrator parallelcluster"
            ).at("node_provisioning_mode")
        roles = Counter(g.role for g in self.instance_groups)
        controllers = [g for g in self.instance_groups if g.role is NodeRole.CONTROLLER]
        if len(controllers) != 1 or controllers[0].instance_count != 1:
            yield problem(
                "ParallelCluster has one head node: exactly one controller group with instance_count 1",
                got=[(g.name, g.instance_count) for g in controllers],
                allowed="one controller node",
            ).at("instance_groups")
        if roles[NodeRole.LOGIN] > 1 or roles[NodeRole.COMPUTE] == 0:
            yield problem(
                "at most one login group and at least one compute group",
                got={role.value: n for role, n in roles.items()},
                allowed="login 0 or 1, compute 1 or more",
            ).at("instance_groups")
        yield from fallback_group_problems(self.instance_groups, eks=False)
        for i, g in enumerate(self.instance_groups):
            yield from (p.at(f"instance_groups[{i}]") for p in self._parallelcluster_group_problems(g, hyperpod_only))

    def _parallelcluster_group_problems(self, g: InstanceGroupConfig, hyperpod_only: str) -> Problems:
        if g.role is NodeRole.SYSTEM:
            yield problem(
                "system groups are for EKS clusters", got=g.role.value, allowed="controller, login or compute"
            ).at("role")
        if p := pcluster_rules.name_problem(g.name):
            yield p.at("name")
        spec = catalog.lookup(g.instance_type)
        if spec is None:
            yield catalog.unknown_instance_type(g.instance_type).at("instance_type")
        elif g.role is NodeRole.COMPUTE and self.require_efa and not spec.supports_efa:
            yield problem("has no EFA, and EFA is required", got=g.instance_type, allowed="an EFA-capable type").at(
                "instance_type"
            )
        if g.partition is not None:
            yield problem(
                "ParallelCluster names each queue's partition after the queue", got=g.partition, allowed="unset"
            ).at("partition")
        for key in ("training_plan_arn", "scheduled_update", "auto_patch", "labels", "taints",
                    "fallback_instance_types"):  # fmt: skip
            if getattr(g, key):
                yield problem(hyperpod_only, got="set", allowed="unset with orchestrator parallelcluster").at(key)
        if g.role is not NodeRole.COMPUTE:
            for key, value in (("capacity", g.capacity is not CapacityType.ON_DEMAND),
                               ("capacity_reservation_id", g.capacity_reservation_id),
                               ("min_instance_count", g.min_instance_count is not None)):  # fmt: skip
                if value:
                    yield problem("only compute groups have this", got="set", allowed="unset").at(key)
            return
        if g.capacity is CapacityType.CAPACITY_BLOCK and g.capacity_reservation_id is None:
            yield problem(
                "a Capacity Block group names its reservation", got=None, allowed="cr- followed by 17 hex digits"
            ).at("capacity_reservation_id")
        if g.capacity_reservation_id is not None:
            if not re.match(r"^cr-[0-9a-f]{17}$", g.capacity_reservation_id):
                yield problem(
                    "not a capacity reservation ID",
                    got=g.capacity_reservation_id,
                    allowed="cr- followed by 17 hex digits",
                ).at("capacity_reservation_id")
            if g.capacity is CapacityType.SPOT:
                yield problem(
                    "Spot nodes do not launch into a capacity reservation",
                    got="spot",
                    allowed="capacity-block or on-demand with capacity_reservation_id",
                ).at("capacity")
        minimum = g.min_instance_count
        if minimum is not None and not 0 <= minimum <= g.instance_count:
            yield problem("out of range", got=minimum, allowed=f"0 to instance_count ({g.instance_count})").at(
                "min_instance_count"
            )
        elif minimum is not None and g.capacity is CapacityType.CAPACITY_BLOCK and minimum != g.instance_count:
            # [PC-CB] in rules/parallelcluster.py: a Capacity Block's queue has MinCount = MaxCount.
            yield problem(
                "a Capacity Block's nodes are all started with it; ParallelCluster: "
                + pcluster_rules.CAPACITY_BLOCK_COUNTS,
                got=minimum,
                allowed=f"unset or {g.instance_count}",
            ).at("min_instance_count")

    @property
    def construct_slurm_config_strategy(self) -> SlurmConfigStrategy | None:
        """``slurm_config_strategy`` as the construct's enum (its values are spelled as the API spells them)."""
        return None if self.slurm_config_strategy is None else SlurmConfigStrategy[self.slurm_config_strategy.name]

    @property
    def fallback_group_names(self) -> frozenset[str]:
        """The groups some autoscaled Spot group falls back to (``fallback_groups``): their nodes stand in for that
        group's, within its instance_count, and never add to them."""
        return frozenset(name for g in self.instance_groups for name in g.fallback_groups)

    def compute_group(self, name: str | None = None) -> InstanceGroupConfig:
        """The compute group called ``name`` (the first one when None), for the job commands;
        raises ``ConfigError`` on the ``--group`` option when there is none such."""
        compute = [g for g in self.instance_groups if g.role is NodeRole.COMPUTE]
        chosen = next((g for g in compute if g.name == name), None) if name else compute[0]
        if chosen is None:
            raise ConfigError(
                [problem("unknown compute group", got=name, allowed=", ".join(g.name for g in compute)).at("--group")]
            )
        return chosen

    def _eks_problems(self) -> Problems:
        for i, g in enumerate(self.instance_groups):
            if g.role not in _EKS_ROLES:
                yield problem(
                    "EKS clusters have no Slurm head or login nodes", got=g.role.value, allowed="compute or system"
                ).at(f"instance_groups[{i}].role")
            if g.partition is not None:
                yield problem("Slurm partitions do not apply to EKS", got=g.partition, allowed="no partition").at(
                    f"instance_groups[{i}].partition"
                )
        yield from eks_group_problems(
            [g.to_eks_props() for g in self.instance_groups],
            require_efa=self.require_efa,
            continuous=self.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS,
        )


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ObservabilityConfig:
    """Metrics, dashboards and alerts of a HyperPod cluster (orchestrator `slurm` or `eks`)."""

    enabled: bool = False
    """Create the Managed Prometheus workspace with the alert rules (observability/alerts), the Managed Grafana
    workspace with the dashboards (the MoE dashboard and observability/dashboards), and what feeds Prometheus: on EKS a
    managed scraper, on Slurm the exporters and the agent that the lifecycle scripts start on the nodes. Default:
    false, because Grafana needs IAM Identity Center in the account (`identity_center_enabled`)."""
    identity_center_enabled: bool = False
    """Whether IAM Identity Center is enabled for the account. Managed Grafana signs users in through it (`AWS_SSO`), so
    `enabled` needs it: enable it first (IAM Identity Center console), then set this to true."""
    scrape_interval_s: int = 30
    """How often every exporter and the trainer are scraped, in seconds (30 to 300; the managed scraper's minimum is
    30)."""

    def problems(self) -> Problems:
        if not 30 <= self.scrape_interval_s <= 300:
            yield problem("out of range", got=self.scrape_interval_s, allowed="30 to 300").at("scrape_interval_s")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class EksConfig:
    """The EKS control plane and cluster software (orchestrator `eks` only)."""

    kubernetes_version: str = eks_rules.DEFAULT_KUBERNETES_VERSION
    """Kubernetes version, one HyperPod supports: see docs/eks-software.md."""
    second_availability_zone: str | None = None
    """EKS needs subnets in two zones: the zone besides `cluster.availability_zone` for the control plane. Required with
    orchestrator eks."""
    endpoint_access: EndpointAccess = EndpointAccess.PRIVATE
    """private (from the VPC only) or public-and-private (public endpoint limited to `public_access_cidrs`)."""
    public_access_cidrs: tuple[str, ...] = ()
    """IPv4 ranges allowed to the public endpoint; required with public-and-private, `0.0.0.0/0` refused."""
    admin_role_arns: tuple[str, ...] = ()
    """IAM roles given cluster-admin access (for kubectl)."""
    addon_versions: dict[str, str] = field(default_factory=dict)
    """Pinned EKS add-on versions by name, e.g. `vpc-cni: v1.19.2-eksbuild.1`. Default: EKS's default for the Kubernetes
    version."""
    container_insights: bool = False
    """Install CloudWatch Container Insights (the amazon-cloudwatch-observability add-on)."""
    training_operator: bool = True
    """Install the HyperPod training operator add-on, which runs HyperPodPyTorchJob (`moe-cdk eks render
    --hyperpod`)."""
    namespace: str = "moe"
    """Kubernetes namespace for training jobs and the FSx volume claim."""
    hyperpod_chart_directory: str = ".cache/hyperpod-helm-chart"
    """AWS's HyperPod dependencies chart as `make hyperpod-chart` stages it, relative to the repository root. Synth
    fails while it is missing: HyperPod needs it on every cluster created through the APIs."""

    def problems(self) -> Problems:
        if p := kubernetes_version_problem(self.kubernetes_version):
            yield p.at("kubernetes_version")
        yield from endpoint_problems(self.endpoint_access, self.public_access_cidrs)
        yield from addon_version_problems(self.addon_versions)
        for i, arn in enumerate(self.admin_role_arns):
            if not re.match(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$", arn):
                yield problem("not an IAM role ARN", got=arn, allowed="arn:aws:iam::<account>:role/<name>").at(
                    f"admin_role_arns[{i}]"
                )
        if not KUBERNETES_NAME.match(self.namespace):
            yield problem(
                "not a Kubernetes namespace name",
                got=self.namespace,
                allowed="lowercase letters, digits and inner hyphens",
            ).at("namespace")

    @property
    def hyperpod_chart_path(self) -> Path:
        """Where the staged chart is (or should be)."""
        return project_root() / self.hyperpod_chart_directory


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ParallelClusterConfig:
    """AWS ParallelCluster's cluster (orchestrator `parallelcluster` only): docs/parallelcluster.md."""

    version: str = pcluster_rules.VERSION
    """The ParallelCluster release that creates and updates the cluster. moe-cdk pins one (it validates the cluster's
    configuration with that release's own code); a cluster is updated only by the release that created it."""
    service_token: str | None = None
    """The ServiceToken (a Lambda function ARN) of a ParallelCluster provider stack already in the account, at
    `version`. Default: the deployment adds AWS's provider stack for `version` as a nested stack."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """What happens to the cluster when it leaves the stack (`cdk destroy`): Retain keeps it running, Delete deletes
    it. Default: Retain, as for the file system."""
    os: OperatingSystem = OperatingSystem.UBUNTU_2204
    """The operating system of ParallelCluster's official AMI: ubuntu2204 or ubuntu2404 (the lifecycle scripts use
    apt). A group's `image_id` replaces the AMI (built from ParallelCluster's for this system)."""
    queue_update_strategy: QueueUpdateStrategy = QueueUpdateStrategy.DRAIN
    """What an update does to the running nodes of a changed queue: DRAIN (jobs finish first) or TERMINATE (jobs are
    requeued and resume from their last checkpoint). CloudFormation never stops the compute fleet, so
    ParallelCluster's COMPUTE_FLEET_STOP is not offered."""
    ssh_key_name: str | None = None
    """An EC2 key pair for SSH to the head node. Default: none; reach it through Session Manager."""
    log_retention_days: int = 365
    """Days CloudWatch Logs keeps the cluster's node logs, a CloudWatch Logs retention value."""

    def problems(self) -> Problems:
        if p := pcluster_rules.version_problem(self.version):
            yield p.at("version")
        if self.service_token is not None and not re.match(
            r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:function:[A-Za-z0-9_-]+$", self.service_token
        ):
            yield problem(
                "not a Lambda function ARN",
                got=self.service_token,
                allowed="the ServiceToken output of a ParallelCluster provider stack",
            ).at("service_token")
        if p := retention_problem(self.log_retention_days):
            yield p.at("log_retention_days")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ExistingSubnetConfig:
    """A private subnet of an adopted VPC."""

    subnet_id: str
    """Subnet ID, e.g. `subnet-0123456789abcdef0`."""
    availability_zone: str
    """The subnet's zone."""
    route_table_id: str | None = None
    """The subnet's route table ID, for constructs that add routes. Default: not given."""


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ExistingVpcConfig:
    """A VPC to adopt instead of creating one. moe-cdk adds no endpoints or flow logs to it."""

    vpc_id: str
    """VPC ID, e.g. `vpc-0123456789abcdef0`."""
    vpc_cidr_block: str
    """The VPC's primary IPv4 range, e.g. `10.0.0.0/16`."""
    private_subnets: tuple[ExistingSubnetConfig, ...]
    """Private subnets with NAT egress, one or more per zone the cluster and file system use."""

    def problems(self) -> Problems:
        if not _VPC_ID.match(self.vpc_id):
            yield problem("not a VPC ID", got=self.vpc_id, allowed="vpc- followed by 8 or 17 hex digits").at("vpc_id")
        if not self.private_subnets:
            yield problem("needs at least one subnet", got=[], allowed="one or more subnets").at("private_subnets")
        for i, subnet in enumerate(self.private_subnets):
            if not _SUBNET_ID.match(subnet.subnet_id):
                yield problem(
                    "not a subnet ID", got=subnet.subnet_id, allowed="subnet- followed by 8 or 17 hex digits"
                ).at(f"private_subnets[{i}].subnet_id")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class NetworkConfig:
    """The VPC. Subnets are created in the cluster's zone and the file system's zone."""

    vpc_cidr: str = "10.0.0.0/16"
    """IPv4 range of the new VPC."""
    private_subnet_cidr_mask: int = 18
    """Prefix length of each private subnet. HyperPod nodes take one address per network card on Slurm (a p5en: 16, a
    p5: 32) and 49 more on EKS (p5en: 65, p5: 81); synth checks that the cluster's subnet holds them."""
    public_subnet_cidr_mask: int = 24
    """Prefix length of each public subnet, which holds only the NAT gateway."""
    interface_endpoints: bool = True
    """Create ECR, STS, CloudWatch Logs, SageMaker API and SSM interface endpoints (new VPC only)."""
    flow_log_retention_days: int = 365
    """Days to keep VPC flow logs, a CloudWatch Logs retention value."""
    existing_vpc: ExistingVpcConfig | None = None
    """Adopt this VPC instead of creating one. Default: create a VPC."""

    def problems(self) -> Problems:
        if p := retention_problem(self.flow_log_retention_days):
            yield p.at("flow_log_retention_days")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class LustreConfig:
    """The FSx for Lustre PERSISTENT_2 file system."""

    storage_capacity_gib: int = 4800
    """Capacity in GiB: 1200 or a multiple of 2400; with EFA, a multiple of 38400/19200/9600/4800 at 125/250/500/1000
    MB/s/TiB."""
    per_unit_storage_throughput_mb_s_tib: int = 250
    """Throughput tier in MB/s per TiB: 125, 250, 500 or 1000."""
    efa_enabled: bool = False
    """Serve the clients over EFA. The file system must then be in the cluster's zone, a compute group must be of an FSx
    EFA client type (the P5 family; others mount over TCP), at most 1024 EFA connections in all (8 per P5-family
    node), and the orchestrator Slurm: its lifecycle scripts add the EFA interfaces to LNet."""
    availability_zone: str | None = None
    """Zone of the file system. Default: `cluster.availability_zone`."""
    retain_on_delete: bool = True
    """Keep the file system, its KMS key and its security group when the stack is deleted (`cdk destroy`). Data not yet
    exported to S3 survives, but the network stack cannot be deleted until they are (docs/operations.md). false:
    delete them with the stack."""

    def problems(self) -> Problems:
        if p := throughput_problem(self.per_unit_storage_throughput_mb_s_tib):
            yield p.at("per_unit_storage_throughput_mb_s_tib")
        if p := capacity_problem(
            self.storage_capacity_gib,
            per_unit_storage_throughput_mb_s_tib=self.per_unit_storage_throughput_mb_s_tib,
            efa_enabled=self.efa_enabled,
        ):
            yield p.at("storage_capacity_gib")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class DataRepositoryConfig:
    """The S3 bucket behind the file system."""

    bucket_name: str | None = None
    """Bucket name. Default: `moe-data-<account>-<region>-<name>`."""
    # The construct's own props dataclass: the same keys, defaults and checks.
    associations: tuple[DataRepositoryAssociation, ...] = DEFAULT_ASSOCIATIONS
    """At most 8 associations, created one at a time in this order. Each is named by its directory, so removing or
    reordering one leaves the others in place. Default: `/datasets` (import) and `/checkpoints` (import and export)."""

    def problems(self) -> Problems:
        if self.bucket_name is not None and (p := _bucket_name_problem(self.bucket_name)):
            yield p.at("bucket_name")
        for p in association_problems(self.associations):
            yield p.at("associations")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class StorageConfig:
    """Shared storage: the Lustre file system and its S3 data repository."""

    lustre: LustreConfig = LustreConfig()
    """The file system."""
    data_repository: DataRepositoryConfig = DataRepositoryConfig()
    """The bucket and its associations."""
    adopt_retained_buckets: bool = False
    """Use the data and lifecycle buckets that an earlier deployment of this name kept after `cdk destroy` (they are
    retained, and their names are fixed) instead of creating them, which would fail with "already exists". Set it to
    true to deploy again after a destroy."""


@dataclass(frozen=True, kw_only=True, config=SECTION)
class TrainingConfig:
    """The training run this infrastructure is for: what `moe-cdk plan` sizes and jobs launch."""

    profile: str = "training/configs/moe-8x1b.yaml"
    """Trainer configuration (a `moe-train` YAML), relative to the project folder (the one holding cdk.json). Every
    rendered job carries its text (a Slurm script, a Kubernetes ConfigMap, a SageMaker input channel), so changing it
    needs no new image; `--train-config` on those commands runs another file."""
    stack: TrainingStack = TrainingStack.AUTO
    """What trains the profile: `megatron` (moe-train, megatron-core on CUDA: NVIDIA GPUs),
    `neuronx-distributed-training` (AWS's NxD Training on Trainium, which jobs render the profile for:
    docs/trainium.md), or `auto`, the one that runs on the compute groups' accelerators. `torchtitan-neuron` is
    refused with its reason."""

    @property
    def path(self) -> Path:
        """The profile in this project."""
        return project_root() / self.profile

    def problems(self) -> Problems:
        if not self.path.is_file():
            yield problem(
                "no such trainer configuration", got=self.profile, allowed="a YAML file under training/configs/"
            ).at("profile")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ServingConfig:
    """Serving trained models on the EKS cluster through HyperPod's inference operator (docs/serving.md): the
    operator's add-on and the ones it needs, their roles, and the bucket for the endpoints' TLS certificates."""

    tls_bucket_name: str | None = None
    """The bucket the operator writes each endpoint's TLS certificate to. AWS's managed policy lets the operator write
    only to buckets named `hyperpod-tls*`. Default: `hyperpod-tls-<name>-<account>-<region>`."""
    execution_role_name: str | None = None
    """The operator's execution role. The operator's chart and the managed policy
    AmazonSageMakerHyperPodInferenceAccess accept only names starting with `SageMakerHyperPodInference`. Default:
    `SageMakerHyperPodInference-<name>-<region>`."""
    model_prefixes: tuple[str, ...] = ("checkpoints/",)
    """Prefixes of the data bucket that endpoints may load models from (`moe-cdk serve render --source s3`): the S3
    CSI driver's role reads these only. Default: the checkpoints association's export."""
    models_from: str | None = None
    """Serve what another moe-cdk deployment trained, in the same account and Region (a HyperPod Slurm cluster, say:
    config/hybrid-serve-eks.yaml): its `name`. The S3 CSI driver's role then reads `model_prefixes` of that
    deployment's data bucket (`moe-data-<account>-<region>-<name>`), where its data repository association exports
    the checkpoints. Default: this deployment's own data bucket."""

    def problems(self) -> Problems:
        if self.tls_bucket_name is not None:
            if p := serving_rules.tls_bucket_problem(self.tls_bucket_name):
                yield p.at("tls_bucket_name")
            elif p := _bucket_name_problem(self.tls_bucket_name):
                yield p.at("tls_bucket_name")
        if self.execution_role_name is not None:
            if p := serving_rules.execution_role_problem(self.execution_role_name):
                yield p.at("execution_role_name")
            elif not re.match(r"^[\w+=,.@-]{1,64}$", self.execution_role_name):
                yield problem(
                    "not a valid IAM role name",
                    got=self.execution_role_name,
                    allowed="up to 64 letters, digits and +=,.@_-",
                ).at("execution_role_name")
        if self.models_from is not None and not _NAME.match(self.models_from):
            yield problem("not a deployment name", got=self.models_from, allowed="the name of a moe-cdk deployment").at(
                "models_from"
            )
        for i, prefix in enumerate(self.model_prefixes):
            if not re.match(r"^[A-Za-z0-9!_.*'()/-]+/$", prefix) or prefix.startswith("/"):
                yield problem(
                    "not an S3 prefix ending in /", got=prefix, allowed="e.g. checkpoints/, without a leading /"
                ).at(f"model_prefixes[{i}]")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class Config:
    """A whole deployment."""

    name: str = "moe"
    """Prefix of every stack name and the HyperPod cluster name: letters, digits and hyphens, starting with a letter and
    ending with a letter or digit, at most 24 characters."""
    region: str
    """AWS Region to deploy to, e.g. `us-east-2`."""
    cluster: ClusterConfig
    """The training capacity."""
    network: NetworkConfig = NetworkConfig()
    """The VPC."""
    storage: StorageConfig = StorageConfig()
    """Shared storage."""
    training: TrainingConfig = TrainingConfig()
    """The training run."""
    eks: EksConfig = EksConfig()
    """The EKS control plane, with orchestrator `eks`."""
    parallelcluster: ParallelClusterConfig = ParallelClusterConfig()
    """AWS ParallelCluster, with orchestrator `parallelcluster`."""
    observability: ObservabilityConfig = ObservabilityConfig()
    """Managed Prometheus and Grafana for a HyperPod cluster."""
    teams: TeamsConfig | None = None
    """Teams sharing a HyperPod cluster, and the QoS tiers their jobs run at (docs/teams.md). Default: none, one team
    runs with no setup."""
    serving: ServingConfig | None = None
    """Serve trained models on the HyperPod EKS cluster (docs/serving.md); `serving: {}` takes every default. Default:
    none."""

    @property
    def execution_role_name(self) -> str:
        """The serving execution role's name (``serving`` must be set)."""
        return self.serving.execution_role_name or f"{serving_rules.EXECUTION_ROLE_PREFIX}-{self.name}-{self.region}"

    @property
    def lustre_availability_zone(self) -> str:
        return self.storage.lustre.availability_zone or self.cluster.availability_zone

    @property
    def availability_zones(self) -> list[str]:
        """The zones the network needs subnets in: the cluster's, the file system's, and with EKS the control plane's
        second zone."""
        zones = [self.cluster.availability_zone, self.lustre_availability_zone]
        if self.cluster.orchestrator is Orchestrator.EKS and self.eks.second_availability_zone:
            zones.append(self.eks.second_availability_zone)
        return list(dict.fromkeys(zones))

    def problems(self) -> Problems:
        if not _NAME.match(self.name):
            yield problem(
                "not a valid name",
                got=self.name,
                allowed="a letter, then up to 23 letters, digits or hyphens, not ending in a hyphen",
            ).at("name")
        if not _REGION.match(self.region):
            yield problem("not a Region name", got=self.region, allowed="e.g. us-east-2").at("region")
            return
        if p := availability_zone_problem(self.cluster.availability_zone, self.region):
            yield p.at("cluster.availability_zone")
        lustre_zone = self.storage.lustre.availability_zone
        if lustre_zone is not None:
            if p := availability_zone_problem(lustre_zone, self.region):
                yield p.at("storage.lustre.availability_zone")
            elif self.storage.lustre.efa_enabled and lustre_zone != self.cluster.availability_zone:
                # EFA traffic does not cross availability zones.
                yield problem(
                    "an EFA-enabled file system must be in the cluster's zone",
                    got=lustre_zone,
                    allowed=self.cluster.availability_zone,
                ).at("storage.lustre.availability_zone")
        yield from self._eks_problems()
        yield from self._parallelcluster_problems()
        yield from self._observability_problems()
        yield from self._stack_problems()
        c = self.cluster
        if (
            self.teams is not None
            and c.orchestrator is Orchestrator.SLURM
            and c.node_provisioning_mode is NodeProvisioningMode.STANDARD
            and c.slurm_config_strategy is not SlurmStrategy.MERGE
        ):
            # SageMaker Developer Guide, "SageMaker HyperPod references", Orchestrator.Slurm: Managed fails
            # UpdateCluster on a changed slurm.conf, Overwrite overwrites it, Merge "preserves manual slurm.conf
            # changes".
            yield problem(
                "teams include their priority and preemption settings in slurm.conf; HyperPod's managed strategy fails "
                "a cluster update on a changed slurm.conf and overwrite discards the change",
                got=c.slurm_config_strategy.value if c.slurm_config_strategy else "unset (managed)",
                allowed="merge",
            ).at("cluster.slurm_config_strategy")
        if self.teams is not None and self.cluster.orchestrator is Orchestrator.TRAINING_JOB:
            yield problem(
                "SageMaker Training Jobs run on their own instances: there is no cluster to share",
                got="a teams section",
                allowed="teams with orchestrator slurm or eks",
            ).at("teams")
        if self.storage.lustre.efa_enabled:
            yield from self._efa_client_problems()
        existing = self.network.existing_vpc
        hyperpod = self.cluster.orchestrator in (Orchestrator.SLURM, Orchestrator.EKS)
        if (
            existing is None
            and hyperpod
            and (
                message := subnet_capacity_problem(
                    subnet_nodes(
                        [g.to_props() for g in self.cluster.instance_groups],
                        eks=self.cluster.orchestrator is Orchestrator.EKS,
                    ),
                    prefix_length=self.network.private_subnet_cidr_mask,
                )
            )
        ):
            yield message.at("network.private_subnet_cidr_mask")
        if existing is None:
            for p in cidr_problems(
                self.network.vpc_cidr,
                public_mask=self.network.public_subnet_cidr_mask,
                private_mask=self.network.private_subnet_cidr_mask,
                zones=len(self.availability_zones),
            ):
                yield p.at("network")
        else:
            covered = {s.availability_zone for s in existing.private_subnets}
            for zone in self.availability_zones:
                if zone not in covered:
                    yield problem(
                        "no subnet in a zone the deployment uses", got=sorted(covered), allowed=f"a subnet in {zone}"
                    ).at("network.existing_vpc.private_subnets")

    @property
    def accelerator_kinds(self) -> set[catalog.AcceleratorKind]:
        """The kinds of accelerator the compute groups have."""
        return {
            spec.accelerator_kind
            for g in self.cluster.instance_groups
            if g.role is NodeRole.COMPUTE and (spec := catalog.lookup(g.instance_type)) and spec.is_accelerated
        }

    @property
    def world_size(self) -> int:
        """Training processes across the compute groups with accelerators: one per GPU, or per logical NeuronCore. A
        fallback group's nodes stand in for its Spot group's, so they are not counted again."""
        return sum(
            g.instance_count * spec.ranks_per_node
            for g in self.cluster.instance_groups
            if g.role is NodeRole.COMPUTE
            and g.name not in self.cluster.fallback_group_names
            and (spec := catalog.lookup(g.instance_type))
            and spec.is_accelerated
        )

    @property
    def training_stack(self) -> TrainingStack:
        """The stack ``training.stack`` resolves to on the compute groups: NxD Training on Trainium, else megatron."""
        kinds = self.accelerator_kinds
        return resolve(self.training.stack, next(iter(kinds)) if len(kinds) == 1 else catalog.AcceleratorKind.NONE)

    def _stack_problems(self) -> Problems:
        stack = self.training.stack
        kinds = self.accelerator_kinds
        if len(kinds) > 1:
            yield problem(
                "one configuration trains with one stack, so its compute groups have one kind of accelerator",
                got=sorted(k.value for k in kinds),
                allowed="NVIDIA GPU groups or Trainium groups: a configuration for each",
            ).at("cluster.instance_groups")
        for kind in sorted(kinds, key=lambda k: k.value):
            if reason := stack_problem(stack, kind):
                yield problem(reason, got=stack.value, allowed=f"a stack that trains on {kind.value}").at(
                    "training.stack"
                )
        if catalog.AcceleratorKind.TRAINIUM in kinds and self.cluster.orchestrator is Orchestrator.TRAINING_JOB:
            yield problem(
                "SageMaker Training Jobs here run moe-train (CUDA); the Trainium path renders Slurm and EKS jobs",
                got=self.cluster.orchestrator.value,
                allowed="slurm or eks with Trainium compute groups (docs/trainium.md)",
            ).at("cluster.orchestrator")

    def _efa_client_problems(self) -> Problems:
        if self.cluster.orchestrator is Orchestrator.EKS:
            # AWS's EKS sample runs the FSx EFA client setup in its lifecycle; these scripts do not.
            yield problem(
                "the EKS lifecycle scripts do not configure Lustre over EFA, so pods would reach the file system "
                "over TCP",
                got=True,
                allowed="false with orchestrator eks",
            ).at("storage.lustre.efa_enabled")
            return
        compute = Counter()
        for g in self.cluster.instance_groups:
            if g.role is NodeRole.COMPUTE:
                compute[g.instance_type] += g.instance_count
        for message in efa_client_problems(dict(compute)):
            yield message.at("storage.lustre.efa_enabled")

    def _observability_problems(self) -> Problems:
        if self.cluster.orchestrator is Orchestrator.TRAINING_JOB:
            if self.observability.enabled:
                yield problem(
                    "SageMaker Training Jobs report to CloudWatch, not to a HyperPod cluster's Prometheus",
                    got=True,
                    allowed="false with orchestrator training-job",
                ).at("observability.enabled")
            return
        # Amazon Managed Grafana User Guide, "Authenticate users in Amazon Managed Grafana
        # workspaces": a workspace with AWS_SSO authentication signs users in through IAM
        # Identity Center, which must be enabled in the account (its organization) first.
        if self.observability.enabled and not self.observability.identity_center_enabled:
            yield problem(
                "observability creates a Managed Grafana workspace that signs users in through IAM Identity Center; "
                "enable Identity Center in the account, then set this to true, or set observability.enabled: false",
                got=self.observability.identity_center_enabled,
                allowed="true with observability",
            ).at("observability.identity_center_enabled")

    def _eks_problems(self) -> Problems:
        second = self.eks.second_availability_zone
        if self.cluster.orchestrator is not Orchestrator.EKS:
            if self.eks != EksConfig():
                yield problem("only used with orchestrator eks", got=self.cluster.orchestrator.value, allowed="eks").at(
                    "eks"
                )
            if self.serving is not None:
                yield problem(
                    "the inference operator serves on HyperPod EKS clusters",
                    got=self.cluster.orchestrator.value,
                    allowed="orchestrator eks (an EKS cluster can serve what a Slurm one trained: docs/serving.md)",
                ).at("serving")
            return
        if second is None:
            yield problem(
                "EKS needs subnets in two availability zones",
                got=None,
                allowed=f"a zone of {self.region} other than {self.cluster.availability_zone}",
            ).at("eks.second_availability_zone")
        elif p := availability_zone_problem(second, self.region):
            yield p.at("eks.second_availability_zone")
        elif second == self.cluster.availability_zone:
            yield problem(
                "must differ from cluster.availability_zone",
                got=second,
                allowed=f"a zone of {self.region} other than {second}",
            ).at("eks.second_availability_zone")
        if self.teams is not None:  # what task governance cannot give these teams on these groups (rules/teams.py)
            groups = [g.to_eks_props() for g in self.cluster.instance_groups]
            yield from eks_team_problems(self.teams, groups, groups_key="cluster.instance_groups")
        if self.serving is not None:
            yield from self._serving_problems()

    def _parallelcluster_problems(self) -> Problems:
        if self.cluster.orchestrator is not Orchestrator.PARALLELCLUSTER:
            if self.parallelcluster != ParallelClusterConfig():
                yield problem(
                    "only used with orchestrator parallelcluster", got=self.cluster.orchestrator.value,
                    allowed="parallelcluster",
                ).at("parallelcluster")  # fmt: skip
            return
        # ParallelCluster keeps Slurm accounting only in an external database (its SlurmSettings.Database).
        if self.teams is not None and self.cluster.accounting_database is None:
            yield problem(
                "teams need Slurm accounting, which ParallelCluster keeps only in an external database: set "
                "cluster.accounting_database (docs/parallelcluster.md)",
                got="a teams section",
                allowed="teams with cluster.accounting_database",
            ).at("teams")
        if self.storage.lustre.efa_enabled:
            yield problem(
                "ParallelCluster mounts the file system itself, over TCP",
                got="set",
                allowed="unset with orchestrator parallelcluster",
            ).at("storage.lustre.efa_enabled")

    def _serving_problems(self) -> Problems:
        for p in eks_rules.serving_version_problems(self.eks.addon_versions):
            yield p.at("eks")
        if self.network.existing_vpc is not None:
            yield problem(
                "the endpoints' load balancer needs public subnets, and an adopted VPC names private subnets only",
                got="network.existing_vpc",
                allowed="a VPC moe-cdk creates (public subnets tagged for load balancers)",
            ).at("serving")
        # A bucket name has at most 63 characters, a role name 64; an account ID has 12 digits.
        bucket = len(serving_rules.default_tls_bucket_name(self.name, account="0" * 12, region=self.region))
        if self.serving.tls_bucket_name is None and bucket > 63:
            yield problem(
                f"the default bucket name would have {bucket} characters", got=None, allowed="a name of 63 at most"
            ).at("serving.tls_bucket_name")
        role = len(self.execution_role_name)
        if self.serving.execution_role_name is None and role > 64:
            yield problem(
                f"the default role name would have {role} characters", got=None, allowed="a name of 64 at most"
            ).at("serving.execution_role_name")


def parse_config(data: object) -> Config:
    """A ``Config`` from already-parsed YAML; raises ``ConfigError`` with every problem."""
    errors: list[Problem] = []
    config = parse(Config, data, errors)
    if errors or config is None:
        raise ConfigError(errors)
    return config


def load_config(path: str | Path) -> Config:
    """Read and check a YAML configuration file; raises ``ConfigError`` with every problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(
            [problem("cannot read the file", got=error.strerror, allowed="a readable YAML file").at(str(path))]
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "unknown line"
        raise ConfigError([problem("not valid YAML", got=where, allowed="a YAML mapping").at(str(path))]) from None
    return parse_config(data)


def synth_prerequisite_problems(config: Config) -> list[Problem]:
    """What synth needs of a valid configuration besides the file: the inputs ``make`` stages outside git
    (an EKS cluster's HyperPod chart). ``moe-cdk validate`` reports them, so that a file it calls valid
    synthesizes."""
    if config.cluster.orchestrator is Orchestrator.EKS:
        if p := eks_rules.hyperpod_chart_problem(config.eks.hyperpod_chart_path):
            return [p.at("eks.hyperpod_chart_directory")]
    return []


def require_orchestrator(config: Config, refusal: str, *allowed: Orchestrator) -> None:
    """Raise ``ConfigError`` with ``refusal`` at cluster.orchestrator unless ``config``'s
    orchestrator is one of ``allowed``: for the commands that act on one kind of cluster."""
    if config.cluster.orchestrator not in allowed:
        raise ConfigError(
            [
                problem(
                    refusal, got=config.cluster.orchestrator.value, allowed=" or ".join(o.value for o in allowed)
                ).at("cluster.orchestrator")
            ]
        )


HYPERPOD = (Orchestrator.SLURM, Orchestrator.EKS)
"""The orchestrators of a HyperPod cluster (``require_orchestrator(config, refusal, *HYPERPOD)``)."""
SLURM_CLUSTERS = (Orchestrator.SLURM, Orchestrator.PARALLELCLUSTER)
"""The orchestrators whose cluster runs Slurm: HyperPod's and ParallelCluster's."""


def nodes_of(group: InstanceGroupConfig, nodes: int | None) -> int:
    """How many of ``group``'s nodes a job uses: ``nodes``, or all of them when None; raises
    ``ConfigError`` on the ``--nodes`` option outside 1 to the group's instance_count."""
    if nodes is not None and not 1 <= nodes <= group.instance_count:
        raise ConfigError(
            [
                problem(
                    f"more nodes than group {group.name} has", got=nodes, allowed=f"1 to {group.instance_count}"
                ).at("--nodes")
            ]
        )
    return nodes or group.instance_count


SCHEMA_FILE = "config/moe-cdk.schema.json"
"""Where the JSON Schema of a configuration file ships, for editors (``make docs`` writes it)."""


def config_schema() -> dict:
    """The JSON Schema of a configuration file; the files under config/ name it in a
    ``yaml-language-server`` modeline."""
    return json_schema(Config, title="moe-cdk deployment configuration")


def reference_docs() -> str:
    """docs/configuration.md, generated from the dataclasses above."""
    return (
        render_docs(
            Config,
            "Configuration reference",
            "Generated from `schema/config.py` by `moe-cdk config-docs`; a test fails when the two differ. "
            f"Editors that read JSON Schema (the YAML language server) check a file against `{SCHEMA_FILE}`.\n\n"
            "A configuration is one YAML file under `config/`. Select it with `make synth CONFIG=config/x.yaml` "
            "or `cdk synth -c config=config/x.yaml`, and check it with `moe-cdk validate --config config/x.yaml`. "
            "Unknown keys are errors. Every problem is reported at once, one line each: "
            "`path.to.key: what is wrong (got X; allowed Y)`.",
        )
        + "\n"
    )
