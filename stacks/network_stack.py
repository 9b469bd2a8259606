"""The VPC and the training nodes' security group."""

from __future__ import annotations

from aws_cdk import CfnOutput, CrossStackReferences, ReferenceStrength, Stack, aws_ec2 as ec2
from constructs import Construct

from moe_cdk.constructs.efa_security_group import EfaSecurityGroup, EfaSecurityGroupProps
from moe_cdk.constructs.training_network import TrainingNetwork, TrainingNetworkProps
from moe_cdk.schema.config import Config


class NetworkStack(Stack):
    """TrainingNetwork plus EfaSecurityGroup, from ``config.network`` and the zones the deployment uses."""

    def __init__(self, scope: Construct, id: str, *, config: Config, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        network = config.network
        existing = network.existing_vpc
        existing_vpc = None
        if existing is not None:
            existing_vpc = ec2.Vpc.from_vpc_attributes(
                self,
                "ExistingVpc",
                vpc_id=existing.vpc_id,
                vpc_cidr_block=existing.vpc_cidr_block,
                availability_zones=[s.availability_zone for s in existing.private_subnets],
                private_subnet_ids=[s.subnet_id for s in existing.private_subnets],
                private_subnet_route_table_ids=[s.route_table_id for s in existing.private_subnets]
                if all(s.route_table_id for s in existing.private_subnets)
                else None,
            )
        self.network = TrainingNetwork(
            self,
            "Network",
            TrainingNetworkProps(
                availability_zones=config.availability_zones,
                vpc_cidr=network.vpc_cidr,
                private_subnet_cidr_mask=network.private_subnet_cidr_mask,
                public_subnet_cidr_mask=network.public_subnet_cidr_mask,
                existing_vpc=existing_vpc,
                interface_endpoints=network.interface_endpoints and existing is None,
                flow_log_retention_days=network.flow_log_retention_days,
            ),
        )
        self.node_security_group = EfaSecurityGroup(
            self, "NodeSecurityGroup", EfaSecurityGroupProps(vpc=self.network.vpc)
        )
        # The app's references are weak (cdk.json), but a subnet or security group that the file
        # system and the nodes still use must not be replaced under them: the other stacks import
        # these (Fn::ImportValue), so CloudFormation refuses a network update that would replace
        # one while they are in use, instead of leaving the file system and cluster on a deleted subnet.
        for resource in (*self.network.private_subnets, self.node_security_group.security_group, self.network.vpc):
            if resource.node.default_child is not None:  # created here, not adopted
                CrossStackReferences.of(resource.node.default_child).produce(ReferenceStrength.STRONG)

        CfnOutput(self, "VpcId", value=self.network.vpc.vpc_id)
        CfnOutput(self, "PrivateSubnetIds", value=",".join(s.subnet_id for s in self.network.private_subnets))
        CfnOutput(self, "NodeSecurityGroupId", value=self.node_security_group.security_group_id)
