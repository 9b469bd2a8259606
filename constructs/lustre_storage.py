"""FSx for Lustre PERSISTENT_2 file system in the compute's availability zone."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, aws_ec2 as ec2, aws_fsx as fsx, aws_kms as kms
from constructs import Construct

from moe_cdk.constructs.validation import Problem, is_unresolved, problem, raise_if_any
from moe_cdk.rules.fsx import capacity_problem, throughput_problem

# FSx for Lustre User Guide, "File system access control with Amazon VPC": LNET uses
# TCP 988 and 1018-1023.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


@dataclass(frozen=True, kw_only=True)
class LustreStorageProps:
    vpc: ec2.IVpc
    """The VPC whose private subnet in ``availability_zone`` holds the file system. Required."""
    availability_zone: str
    """The compute's availability zone; the file system's single subnet is chosen there. Required."""
    client_security_group: ec2.ISecurityGroup
    """The cluster nodes' security group, the only one let in on the Lustre ports. Required."""
    storage_capacity_gib: int = 1200
    """Storage capacity in GiB: 1200 or a multiple of 2400 (EFA: a multiple of the tier's step). Default: 1200."""
    per_unit_storage_throughput_mb_s_tib: int = 250
    """Per-unit throughput in MB/s/TiB: 125, 250, 500 or 1000. Default: 250."""
    efa_enabled: bool = False
    """Serve clients over EFA. Needs clients in the same zone. Default: False."""
    kms_key: kms.IKey | None = None
    """Key for encryption at rest. Default: a new customer-managed key with rotation."""
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    """What happens to the file system, its KMS key and its security group when they leave the stack. Default:
    RETAIN."""


class LustreStorage(Construct):
    """An FSx for Lustre PERSISTENT_2 file system with LZ4 compression and KMS encryption.

    The file system sits in one private subnet in the compute's availability zone and
    has its own security group, which opens the Lustre ports (all traffic when EFA is
    on) only to ``client_security_group``; that group is opened to the file system's on the
    same ports, as the FSx guide requires of Lustre clients. Wire clients through ``connections``, mount
    with ``dns_name`` and ``mount_name``.
    """

    def __init__(self, scope: Construct, id: str, props: LustreStorageProps) -> None:
        super().__init__(scope, id)
        raise_if_any("LustreStorage", self._problems(props))
        self.props = props

        subnets = props.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[props.availability_zone]
        ).subnets
        if not subnets:
            raise_if_any(
                "LustreStorage",
                [
                    problem(
                        "the VPC has no private subnet in this zone",
                        got=props.availability_zone,
                        allowed=", ".join(sorted({s.availability_zone for s in props.vpc.private_subnets})) or "none",
                    ).at("availability_zone")
                ],
            )

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=props.vpc,
            allow_all_outbound=True,
            description="FSx for Lustre servers: Lustre traffic from the cluster nodes only",
        )
        # Retained with the file system, whose network interfaces keep using it: a security group
        # deleted under them fails the stack deletion (DependencyViolation).
        self.security_group.apply_removal_policy(props.removal_policy)
        self.connections = ec2.Connections(security_groups=[self.security_group])
        sg, clients = self.security_group, props.client_security_group
        if props.efa_enabled:
            # FSx for Lustre User Guide, "Creating an FSx for Lustre file system fails": an
            # EFA-enabled file system needs all traffic in and out to and from its own
            # security group and the clients' security group. Outbound is already open.
            sg.add_ingress_rule(sg, ec2.Port.all_traffic(), "EFA between file servers")
            self.connections.allow_from(clients, ec2.Port.all_traffic(), "EFA from cluster nodes")
            clients.add_ingress_rule(sg, ec2.Port.all_traffic(), "EFA from Lustre servers", remote_rule=True)
        else:
            # FSx for Lustre User Guide, "Lustre client VPC security group rules": besides the
            # servers' inbound rules, the clients' group must let the file system's group in on
            # the same ports, because Lustre servers open connections to clients too (lock
            # callbacks, recovery). Without them those calls are dropped: evictions or hangs.
            for port in LUSTRE_PORTS:
                sg.add_ingress_rule(sg, port, "Lustre between file servers")
                self.connections.allow_from(clients, port, "Lustre from cluster nodes")
                clients.add_ingress_rule(sg, port, "Lustre from file servers", remote_rule=True)

        self.kms_key = props.kms_key or kms.Key(
            self,
            "Key",
            enable_key_rotation=True,
            removal_policy=props.removal_policy,
            description="Encrypts the MoE training FSx for Lustre file system",
        )

        lustre = fsx.CfnFileSystem.LustreConfigurationProperty(
            deployment_type="PERSISTENT_2",
            per_unit_storage_throughput=props.per_unit_storage_throughput_mb_s_tib,
            data_compression_type="LZ4",
            efa_enabled=props.efa_enabled or None,
            # A metadata configuration selects Lustre 2.15 and is required for EFA
            # (FSx API reference, CreateFileSystemLustreConfiguration.EfaEnabled).
            metadata_configuration=fsx.CfnFileSystem.MetadataConfigurationProperty(mode="AUTOMATIC"),
        )
        self._resource = fsx.CfnFileSystem(
            self,
            "Resource",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_type="SSD",
            storage_capacity=props.storage_capacity_gib,
            subnet_ids=[subnets[0].subnet_id],
            security_group_ids=[self.security_group.security_group_id],
            kms_key_id=self.kms_key.key_id,
            lustre_configuration=lustre,
        )
        self._resource.apply_removal_policy(props.removal_policy)

        self.file_system_id: str = self._resource.ref
        self.dns_name: str = self._resource.attr_dns_name
        self.mount_name: str = self._resource.attr_lustre_mount_name
        self.availability_zone = props.availability_zone

    @staticmethod
    def _problems(props: LustreStorageProps) -> list[Problem]:
        problems = []
        if not is_unresolved(props.per_unit_storage_throughput_mb_s_tib):
            if p := throughput_problem(props.per_unit_storage_throughput_mb_s_tib):
                problems.append(p.at("per_unit_storage_throughput_mb_s_tib"))
        if not is_unresolved(props.storage_capacity_gib):
            if p := capacity_problem(
                props.storage_capacity_gib,
                per_unit_storage_throughput_mb_s_tib=props.per_unit_storage_throughput_mb_s_tib,
                efa_enabled=props.efa_enabled,
            ):
                problems.append(p.at("storage_capacity_gib"))
        return problems
