"""EfaSecurityGroup: all traffic within the group both ways, narrow internet egress."""

from __future__ import annotations

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from conftest import stack_for_test

from moe_cdk.constructs.efa_security_group import EfaSecurityGroup, EfaSecurityGroupProps
from moe_cdk.core.problems import ConfigError


def _vpc(stack):
    return ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["us-east-2a"])


@pytest.fixture(scope="module")
def template() -> Template:
    stack = stack_for_test()
    EfaSecurityGroup(stack, "Efa", EfaSecurityGroupProps(vpc=_vpc(stack)))
    return Template.from_stack(stack)


def test_self_referencing_all_traffic_ingress(template):
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "SourceSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("Efa"), "GroupId"]},
            "GroupId": {"Fn::GetAtt": [Match.string_like_regexp("Efa"), "GroupId"]},
        },
    )


def test_self_referencing_all_traffic_egress(template):
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress",
        {
            "IpProtocol": "-1",
            "DestinationSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("Efa"), "GroupId"]},
        },
    )


def test_internet_egress_is_limited_to_the_listed_ports(template):
    egress = template.find_resources("AWS::EC2::SecurityGroup")
    rules = next(iter(egress.values()))["Properties"]["SecurityGroupEgress"]
    assert sorted((r["CidrIp"], r["FromPort"]) for r in rules) == [("0.0.0.0/0", 80), ("0.0.0.0/0", 443)]


def test_no_ingress_from_outside_the_group(template):
    groups = template.find_resources("AWS::EC2::SecurityGroup")
    assert all("SecurityGroupIngress" not in g["Properties"] for g in groups.values())


def test_invalid_port_is_rejected_by_name():
    stack = stack_for_test()
    with pytest.raises(ConfigError, match=r"internet_egress_ports: not a TCP port \(got 70000"):
        EfaSecurityGroup(stack, "Efa", EfaSecurityGroupProps(vpc=_vpc(stack), internet_egress_ports=(443, 70000)))
