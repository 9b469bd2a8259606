"""TrainingNetwork: subnets in the given zone, egress, endpoints, flow logs, adoption."""

from __future__ import annotations

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from conftest import stack_for_test

from moe_cdk.constructs.training_network import INTERFACE_ENDPOINT_SERVICES, TrainingNetwork, TrainingNetworkProps
from moe_cdk.core.problems import ConfigError


@pytest.fixture(scope="module")
def template() -> Template:
    stack = stack_for_test()
    TrainingNetwork(stack, "Net", TrainingNetworkProps(availability_zones=["us-east-2b"]))
    return Template.from_stack(stack)


def test_private_subnet_is_in_the_given_zone(template):
    template.has_resource_properties(
        "AWS::EC2::Subnet",
        {
            "AvailabilityZone": "us-east-2b",
            "MapPublicIpOnLaunch": False,
            "CidrBlock": Match.string_like_regexp(r"/18$"),
        },
    )


def test_every_subnet_is_in_the_given_zone_only(template):
    zones = {r["Properties"]["AvailabilityZone"] for r in template.find_resources("AWS::EC2::Subnet").values()}
    assert zones == {"us-east-2b"}


def test_nat_gateway_gives_private_subnets_egress(template):
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.has_resource_properties(
        "AWS::EC2::Route",
        {
            "DestinationCidrBlock": "0.0.0.0/0",
            "NatGatewayId": Match.any_value(),
        },
    )


def test_s3_gateway_endpoint(template):
    template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Gateway",
            "ServiceName": Match.object_like({"Fn::Join": Match.array_with([Match.array_with([".s3"])])}),
        },
    )


@pytest.mark.parametrize("suffix", ["ecr.api", "ecr.dkr", "sts", "logs", "sagemaker.api", "ssm", "ssmmessages"])
def test_interface_endpoint_with_private_dns(template, suffix):
    template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Interface",
            "PrivateDnsEnabled": True,
            "ServiceName": f"com.amazonaws.us-east-2.{suffix}",
        },
    )


def test_endpoints_accept_https_from_the_vpc_only(template):
    template.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "GroupDescription": "Interface endpoints: HTTPS from inside the VPC",
            "SecurityGroupIngress": [Match.object_like({"CidrIp": "10.0.0.0/16", "FromPort": 443, "ToPort": 443})],
        },
    )


def test_flow_logs_capture_all_traffic(template):
    template.has_resource_properties(
        "AWS::EC2::FlowLog", {"TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"}
    )
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 365})


def test_adopting_a_vpc_creates_no_vpc_and_no_endpoints():
    stack = stack_for_test()
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Existing",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-east-2a"],
        private_subnet_ids=["subnet-0123456789abcdef0"],
    )
    network = TrainingNetwork(stack, "Net", TrainingNetworkProps(availability_zones=["us-east-2a"], existing_vpc=vpc))
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::EC2::VPC", 0)
    template.resource_count_is("AWS::EC2::VPCEndpoint", 0)
    assert network.subnet_in("us-east-2a").subnet_id == "subnet-0123456789abcdef0"


def test_adopted_vpc_without_a_subnet_in_the_zone_is_rejected():
    stack = stack_for_test()
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Existing",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-east-2a"],
        private_subnet_ids=["subnet-0123456789abcdef0"],
    )
    with pytest.raises(ConfigError, match=r"existing_vpc: has no private subnet in every zone .*got \['us-east-2c'\]"):
        TrainingNetwork(stack, "Net", TrainingNetworkProps(availability_zones=["us-east-2c"], existing_vpc=vpc))


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (dict(availability_zones=[]), "availability_zones: needs at least one zone"),
        (dict(availability_zones=["useast2a"]), "availability_zones: not an availability-zone name"),
        (dict(availability_zones=["us-east-2a", "us-east-2a"]), "availability_zones: lists a zone twice"),
        (dict(availability_zones=["us-east-2a"], vpc_cidr="10.0.0.0/20"), "private_subnet_cidr_mask: out of range"),
        (
            dict(availability_zones=["us-east-2a"], flow_log_retention_days=2),
            "flow_log_retention_days: not a CloudWatch Logs retention",
        ),
    ],
)
def test_invalid_props_are_rejected_by_name(props, message):
    with pytest.raises(ConfigError, match=message):
        TrainingNetwork(stack_for_test(), "Net", TrainingNetworkProps(**props))


def test_endpoint_list_matches_what_private_nodes_need():
    assert set(INTERFACE_ENDPOINT_SERVICES) == {"EcrApi", "EcrDkr", "Sts", "Logs", "SageMakerApi", "Ssm", "SsmMessages"}


def test_only_this_account_s_flow_logs_may_assume_the_flow_log_role(template):
    # VPC User Guide, "IAM role for publishing flow logs to CloudWatch Logs": aws:SourceAccount and
    # aws:SourceArn keep another account's flow logs from delivering through this role (confused deputy).
    trusts = [
        statement
        for role in template.find_resources("AWS::IAM::Role").values()
        for statement in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        if statement["Principal"].get("Service") == "vpc-flow-logs.amazonaws.com"
    ]
    (trust,) = trusts
    assert trust["Condition"] == {
        "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
        "ArnLike": {
            "aws:SourceArn": {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":ec2:us-east-2:",
                        {"Ref": "AWS::AccountId"},
                        ":vpc-flow-log/*",
                    ],
                ]
            }
        },
    }
