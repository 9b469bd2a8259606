"""The VPC that training capacity, storage and endpoints live in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack, aws_ec2 as ec2, aws_iam as iam, aws_logs as logs
from constructs import Construct

from moe_cdk.constructs.validation import Problem, is_unresolved, problem, raise_if_any
from moe_cdk.rules.ec2 import AVAILABILITY_ZONE, cidr_problems
from moe_cdk.rules.logs import retention_problem

# What private training nodes call without leaving the VPC: ECR (api and dkr) for images,
# STS for credentials, CloudWatch Logs, the SageMaker API (HyperPod agents), and Systems
# Manager with ssmmessages for Session Manager access to the nodes (Systems Manager User
# Guide, "Improve the security of EC2 instances by using VPC endpoints for Systems Manager").
INTERFACE_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
}


# The VPC's one flow log (all traffic), a child of the VPC under this id.
FLOW_LOG_ID = "All"

_R = logs.RetentionDays
# rules.logs.RETENTION_DAYS as the CDK's enum (a test checks that the two hold the same days).
RETENTION_BY_DAYS: dict[int, logs.RetentionDays] = {
    1: _R.ONE_DAY,
    3: _R.THREE_DAYS,
    5: _R.FIVE_DAYS,
    7: _R.ONE_WEEK,
    14: _R.TWO_WEEKS,
    30: _R.ONE_MONTH,
    60: _R.TWO_MONTHS,
    90: _R.THREE_MONTHS,
    120: _R.FOUR_MONTHS,
    150: _R.FIVE_MONTHS,
    180: _R.SIX_MONTHS,
    365: _R.ONE_YEAR,
    400: _R.THIRTEEN_MONTHS,
    545: _R.EIGHTEEN_MONTHS,
    731: _R.TWO_YEARS,
    1096: _R.THREE_YEARS,
    1827: _R.FIVE_YEARS,
    2192: _R.SIX_YEARS,
    2557: _R.SEVEN_YEARS,
    2922: _R.EIGHT_YEARS,
    3288: _R.NINE_YEARS,
    3653: _R.TEN_YEARS,
}


@dataclass(frozen=True, kw_only=True)
class TrainingNetworkProps:
    availability_zones: Sequence[str]
    """Zones to place private subnets in, given explicitly so that synth looks nothing up. Required."""
    vpc_cidr: str = "10.0.0.0/16"
    """IPv4 range of a new VPC. Default: 10.0.0.0/16."""
    private_subnet_cidr_mask: int = 18
    """Prefix length of each private subnet; every EFA interface takes an address. Default: 18 (16,384 addresses)."""
    public_subnet_cidr_mask: int = 24
    """Prefix length of each public (NAT) subnet. Default: 24."""
    existing_vpc: ec2.IVpc | None = None
    """Adopt this VPC and its private subnets instead of creating one. Default: create a VPC."""
    interface_endpoints: bool | None = None
    """Create the ECR, STS, Logs, SageMaker API and SSM endpoints. Default: True for a new VPC, False for an adopted
    one."""
    flow_log_retention_days: int = 365
    """Days to keep VPC flow logs (new VPCs only), a CloudWatch Logs retention value. Default: 365."""


class TrainingNetwork(Construct):
    """A VPC for training: private subnets in the given zones, NAT egress, an S3 gateway
    endpoint, the interface endpoints private nodes need, and flow logs.

    ``subnet_in(zone)`` returns the private subnet of a zone; ``vpc`` is what other
    constructs take.
    """

    def __init__(self, scope: Construct, id: str, props: TrainingNetworkProps) -> None:
        super().__init__(scope, id)
        raise_if_any("TrainingNetwork", self._problems(props))
        self.props = props
        self.availability_zones = list(props.availability_zones)

        if props.existing_vpc is not None:
            self.vpc = props.existing_vpc
        else:
            flow_log_group = logs.LogGroup(
                self,
                "FlowLogs",
                retention=RETENTION_BY_DAYS[props.flow_log_retention_days],
                removal_policy=RemovalPolicy.RETAIN,
            )
            self.vpc = ec2.Vpc(
                self,
                "Vpc",
                ip_addresses=ec2.IpAddresses.cidr(props.vpc_cidr),
                availability_zones=self.availability_zones,
                nat_gateways=len(self.availability_zones),
                subnet_configuration=[
                    ec2.SubnetConfiguration(
                        name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=props.public_subnet_cidr_mask
                    ),
                    ec2.SubnetConfiguration(
                        name="Private",
                        subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                        cidr_mask=props.private_subnet_cidr_mask,
                    ),
                ],
                gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
                flow_logs={
                    FLOW_LOG_ID: ec2.FlowLogOptions(
                        destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                        traffic_type=ec2.FlowLogTrafficType.ALL,
                    )
                },
                restrict_default_security_group=True,
            )
            self._guard_flow_log_role(self.vpc.node.find_child(FLOW_LOG_ID))

        missing = [zone for zone in self.availability_zones if self._private_subnets_in(zone) == []]
        if missing:
            raise_if_any(
                "TrainingNetwork",
                [
                    problem(
                        "has no private subnet in every zone of availability_zones",
                        got=missing,
                        allowed=", ".join(sorted({s.availability_zone for s in self.vpc.private_subnets})) or "none",
                    ).at("existing_vpc")
                ],
            )

        endpoints = props.interface_endpoints if props.interface_endpoints is not None else props.existing_vpc is None
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        if endpoints:
            # One group for every endpoint, open on HTTPS to the VPC's own range.
            cidr = props.vpc_cidr if props.existing_vpc is None else self.vpc.vpc_cidr_block
            self.endpoint_security_group = ec2.SecurityGroup(
                self,
                "EndpointSecurityGroup",
                vpc=self.vpc,
                allow_all_outbound=False,
                description="Interface endpoints: HTTPS from inside the VPC",
            )
            self.endpoint_security_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.HTTPS, "HTTPS from the VPC")
            selection = ec2.SubnetSelection(subnets=self.private_subnets)
            for name, service in INTERFACE_ENDPOINT_SERVICES.items():
                self.interface_endpoints[name] = self.vpc.add_interface_endpoint(
                    name,
                    service=service,
                    subnets=selection,
                    private_dns_enabled=True,
                    open=False,
                    security_groups=[self.endpoint_security_group],
                )

    def _guard_flow_log_role(self, flow_log: ec2.FlowLog) -> None:
        """Trust the flow-log role to this account's flow logs only (VPC User Guide, "IAM role for publishing
        flow logs to CloudWatch Logs": aws:SourceAccount and aws:SourceArn prevent the confused deputy).
        The role stays the one CDK made for the flow log: a new role would replace the flow log itself
        (DeliverLogsPermissionArn is create-only), so only its trust policy is written here."""
        stack = Stack.of(self)
        trust = iam.PolicyDocument(
            statements=[
                iam.PolicyStatement(
                    actions=["sts:AssumeRole"],
                    principals=[iam.ServicePrincipal("vpc-flow-logs.amazonaws.com")],
                    conditions={
                        "StringEquals": {"aws:SourceAccount": stack.account},
                        "ArnLike": {
                            "aws:SourceArn": stack.format_arn(service="ec2", resource="vpc-flow-log", resource_name="*")
                        },
                    },
                )
            ]
        )
        role = flow_log.iam_role.node.default_child
        role.assume_role_policy_document = trust

    @property
    def private_subnets(self) -> list[ec2.ISubnet]:
        """The private subnets in this network's zones, in zone order."""
        return [subnet for zone in self.availability_zones for subnet in self._private_subnets_in(zone)]

    def subnet_in(self, availability_zone: str) -> ec2.ISubnet:
        """The private subnet in ``availability_zone``."""
        subnets = self._private_subnets_in(availability_zone)
        if not subnets:
            raise ValueError(
                problem(
                    "not a zone of this network", got=availability_zone, allowed=", ".join(self.availability_zones)
                ).at("availability_zone")
            )
        return subnets[0]

    def _private_subnets_in(self, zone: str) -> list[ec2.ISubnet]:
        return [s for s in self.vpc.private_subnets if s.availability_zone == zone]

    @staticmethod
    def _problems(props: TrainingNetworkProps) -> list[Problem]:
        found = []
        zones = list(props.availability_zones)
        if not zones:
            found.append(
                problem("needs at least one zone", got=zones, allowed="e.g. ['us-east-2a']").at("availability_zones")
            )
        for zone in zones:
            if not is_unresolved(zone) and not AVAILABILITY_ZONE.match(zone):
                found.append(
                    problem("not an availability-zone name", got=zone, allowed="e.g. us-east-2a").at(
                        "availability_zones"
                    )
                )
        if len(set(zones)) != len(zones):
            found.append(problem("lists a zone twice", got=zones, allowed="distinct zones").at("availability_zones"))
        if p := retention_problem(props.flow_log_retention_days):
            found.append(p.at("flow_log_retention_days"))
        if props.existing_vpc is None:
            found += cidr_problems(
                props.vpc_cidr,
                public_mask=props.public_subnet_cidr_mask,
                private_mask=props.private_subnet_cidr_mask,
                zones=max(len(zones), 1),
            )
        return found
