"""The security group of EFA-connected training nodes."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from moe_cdk.constructs.validation import problem, raise_if_any


@dataclass(frozen=True, kw_only=True)
class EfaSecurityGroupProps:
    vpc: ec2.IVpc
    """The VPC of the training nodes. Required."""
    internet_egress_ports: tuple[int, ...] = (443, 80)
    """TCP ports the nodes may reach anywhere through the NAT gateway: 443 for AWS APIs,
    ECR and container registries, 80 for the OS package mirrors. Default: (443, 80)."""
    description: str = "EFA training nodes: all traffic within the group, HTTPS/HTTP out"
    """Security group description. Default: as shown."""


class EfaSecurityGroup(Construct):
    """A security group that lets EFA work between its members.

    EFA needs a rule that allows all traffic from the group itself *and* one that allows
    all traffic to it; a group with only the inbound rule fails the EFA self-test (Amazon
    EC2 User Guide, "Get started with EFA and NCCL", step 1: "allows all inbound and
    outbound traffic to and from the security group itself"). SageMaker HyperPod uses the
    same group for every node (SageMaker Developer Guide, "Setting up SageMaker HyperPod
    with a custom Amazon VPC"). Everything else outbound is closed except the listed
    internet ports; further peers (FSx, EKS) open what they need through ``connections``.
    """

    def __init__(self, scope: Construct, id: str, props: EfaSecurityGroupProps) -> None:
        super().__init__(scope, id)
        raise_if_any(
            "EfaSecurityGroup",
            [
                problem("not a TCP port", got=port, allowed="1 to 65535").at("internet_egress_ports")
                for port in props.internet_egress_ports
                if not 1 <= port <= 65535
            ],
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "Resource",
            vpc=props.vpc,
            allow_all_outbound=False,
            description=props.description,
        )
        self.security_group.add_ingress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA and NCCL within the group"
        )
        self.security_group.add_egress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA and NCCL within the group"
        )
        for port in props.internet_egress_ports:
            self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(port), f"TCP {port} out through NAT")
        self.connections = self.security_group.connections
        self.security_group_id: str = self.security_group.security_group_id
