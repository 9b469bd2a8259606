"""LustreStorage: PERSISTENT_2 in the compute zone, encrypted, compressed, open to the cluster only."""

from __future__ import annotations

import pytest
from aws_cdk import Token, aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from conftest import stack_for_test

from moe_cdk.constructs.lustre_storage import LustreStorage, LustreStorageProps
from moe_cdk.core.problems import ConfigError


def _build(stack, **overrides) -> LustreStorage:
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["us-east-2a", "us-east-2b"], nat_gateways=1)
    clients = ec2.SecurityGroup(stack, "Clients", vpc=vpc)
    props = dict(vpc=vpc, availability_zone="us-east-2b", client_security_group=clients) | overrides
    return LustreStorage(stack, "Lustre", LustreStorageProps(**props))


@pytest.fixture(scope="module")
def built() -> tuple[LustreStorage, Template]:
    stack = stack_for_test()
    lustre = _build(stack, storage_capacity_gib=4800, per_unit_storage_throughput_mb_s_tib=500)
    return lustre, Template.from_stack(stack)


def test_persistent_2_with_lz4_and_chosen_tier(built):
    built[1].has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "FileSystemTypeVersion": "2.15",
            "StorageCapacity": 4800,
            "LustreConfiguration": Match.object_like(
                {
                    "DeploymentType": "PERSISTENT_2",
                    "PerUnitStorageThroughput": 500,
                    "DataCompressionType": "LZ4",
                }
            ),
        },
    )


def test_encrypted_with_a_rotating_customer_key(built):
    built[1].has_resource_properties(
        "AWS::FSx::FileSystem", {"KmsKeyId": {"Ref": Match.string_like_regexp("LustreKey")}}
    )
    built[1].has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_single_subnet_in_the_requested_zone(built):
    template = built[1]
    fs = next(iter(template.find_resources("AWS::FSx::FileSystem").values()))
    (subnet_ref,) = fs["Properties"]["SubnetIds"]
    subnet = template.to_json()["Resources"][subnet_ref["Ref"]]
    assert subnet["Properties"]["AvailabilityZone"] == "us-east-2b"


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_lustre_ports_open_to_the_client_group_only(built, port):
    built[1].has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "tcp",
            "FromPort": port[0],
            "ToPort": port[1],
            "SourceSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("^Clients"), "GroupId"]},
        },
    )


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_client_group_lets_the_file_servers_in_on_the_lustre_ports(built, port):
    # FSx for Lustre User Guide, "Lustre client VPC security group rules".
    built[1].has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "tcp",
            "FromPort": port[0],
            "ToPort": port[1],
            "GroupId": {"Fn::GetAtt": [Match.string_like_regexp("^Clients"), "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("^LustreSecurityGroup"), "GroupId"]},
        },
    )


def test_no_cidr_ingress_on_the_file_system_group(built):
    groups = built[1].find_resources(
        "AWS::EC2::SecurityGroup", {"Properties": {"GroupDescription": Match.string_like_regexp("FSx")}}
    )
    (group,) = groups.values()
    assert "SecurityGroupIngress" not in group["Properties"]


def test_exposes_what_clients_mount_with(built):
    lustre = built[0]
    for value in (lustre.file_system_id, lustre.dns_name, lustre.mount_name):
        assert Token.is_unresolved(value)
    assert lustre.connections.security_groups == [lustre.security_group]


def test_efa_enabled_opens_all_traffic_both_ways():
    stack = stack_for_test()
    _build(stack, efa_enabled=True, storage_capacity_gib=19200)
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "LustreConfiguration": Match.object_like(
                {"EfaEnabled": True, "MetadataConfiguration": {"Mode": "AUTOMATIC"}}
            ),
        },
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "SourceSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("^Clients"), "GroupId"]},
        },
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "GroupId": {"Fn::GetAtt": [Match.string_like_regexp("^Clients"), "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [Match.string_like_regexp("^LustreSecurityGroup"), "GroupId"]},
        },
    )


@pytest.mark.parametrize("capacity", [1200, 2400, 4800, 24000])
def test_valid_ssd_capacities_are_accepted(capacity):
    assert _build(stack_for_test(), storage_capacity_gib=capacity) is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            dict(storage_capacity_gib=1000),
            r"storage_capacity_gib: not a PERSISTENT_2 SSD capacity \(got 1000; allowed 1200 or a multiple of 2400 "
            r"GiB\)",
        ),
        (dict(storage_capacity_gib=3600), r"storage_capacity_gib: not a PERSISTENT_2 SSD capacity \(got 3600"),
        (
            dict(per_unit_storage_throughput_mb_s_tib=300),
            r"per_unit_storage_throughput_mb_s_tib: not a PERSISTENT_2 throughput tier \(got 300",
        ),
        (dict(efa_enabled=True, storage_capacity_gib=2400), r"storage_capacity_gib: must be a multiple of 19200 GiB"),
        (
            dict(availability_zone="us-east-2c"),
            r"availability_zone: the VPC has no private subnet in this zone \(got 'us-east-2c'",
        ),
    ],
)
def test_invalid_props_are_rejected_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _build(stack_for_test(), **overrides)


def test_all_prop_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        _build(stack_for_test(), storage_capacity_gib=1000, per_unit_storage_throughput_mb_s_tib=300)
    assert [p.split(":")[0] for p in caught.value.errors] == [
        "per_unit_storage_throughput_mb_s_tib",
        "storage_capacity_gib",
    ]
