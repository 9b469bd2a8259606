"""LustreVolume: the static FSx PersistentVolume and its claim, wired from LustreStorage."""

from __future__ import annotations

import dataclasses
import json

import aws_cdk as cdk
import kubernetes_validate
import pytest
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks
from aws_cdk.assertions import Template
from conftest import resources_of_type

from moe_cdk.constructs.lustre_storage import LustreStorage, LustreStorageProps
from moe_cdk.constructs.lustre_volume import LustreVolume, LustreVolumeProps, volume_manifests
from moe_cdk.core.problems import ConfigError


def _props(cluster=None, **overrides) -> LustreVolumeProps:
    values = (
        dict(
            cluster=cluster,
            file_system_id="fs-0123456789abcdef0",
            dns_name="fs-0123456789abcdef0.fsx.us-east-2.amazonaws.com",
            mount_name="abcdefgh",
            storage_capacity_gib=4800,
        )
        | overrides
    )
    return LustreVolumeProps(**values)


def _synthesize(**overrides) -> tuple[dict, str]:
    """A LustreStorage and a volume of it (``_props`` with ``overrides``) in one stack: the volume's manifest and
    the file system's logical id, which the manifest must reference."""
    app = cdk.App()
    stack = cdk.Stack(app, "T", env=cdk.Environment(region="us-east-2"))
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["us-east-2a", "us-east-2b"], nat_gateways=1)
    clients = ec2.SecurityGroup(stack, "Clients", vpc=vpc)
    lustre = LustreStorage(
        stack, "Lustre", LustreStorageProps(vpc=vpc, client_security_group=clients, availability_zone="us-east-2a")
    )
    cluster = eks.Cluster.from_cluster_attributes(
        stack,
        "Eks",
        cluster_name="t",
        kubectl_provider=eks.KubectlProvider.from_kubectl_provider_attributes(
            stack, "Kubectl", service_token="arn:aws:lambda:us-east-2:123456789012:function:kubectl"
        ),
    )
    props = _props(cluster, file_system_id=lustre.file_system_id, dns_name=lustre.dns_name, **overrides)
    LustreVolume(stack, "Volume", dataclasses.replace(props, mount_name=lustre.mount_name))
    template = Template.from_stack(stack).to_json()
    (resource,) = resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
    fsx_id = next(iter(resources_of_type(template, "AWS::FSx::FileSystem")))
    return resource["Properties"]["Manifest"], fsx_id


@pytest.fixture(scope="module")
def synthesized():
    return _synthesize()


def test_volume_names_the_file_system_by_reference(synthesized):
    manifest, fsx_id = synthesized
    parts = manifest["Fn::Join"][1]
    references = [p for p in parts if isinstance(p, dict)]
    assert references == [
        {"Ref": fsx_id},
        {"Fn::GetAtt": [fsx_id, "DNSName"]},
        {"Fn::GetAtt": [fsx_id, "LustreMountName"]},
    ]


def test_volume_uses_the_fsx_csi_driver_read_write_many(synthesized):
    text = "".join(p if isinstance(p, str) else "X" for p in synthesized[0]["Fn::Join"][1])
    volume = next(o for o in json.loads(text) if o["kind"] == "PersistentVolume")
    assert volume["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]
    assert set(volume["spec"]["csi"]["volumeAttributes"]) == {"dnsname", "mountname"}


def test_claim_binds_to_exactly_this_volume():
    namespace, volume, claim = volume_manifests(_props(), "moe-fsx-lustre")
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == volume["spec"]["storageClassName"] == ""
    assert volume["spec"]["claimRef"] == {"namespace": namespace["metadata"]["name"], "name": claim["metadata"]["name"]}


@pytest.mark.parametrize("version", ["1.32.0", "1.33.0"])
def test_manifests_validate_against_the_kubernetes_schemas(version):
    for document in volume_manifests(_props(), "moe-fsx-lustre"):
        kubernetes_validate.validate(document, version, strict=True)


def test_bad_names_are_reported():
    app = cdk.App()
    stack = cdk.Stack(app, "T")
    with pytest.raises(ConfigError) as error:
        LustreVolume(stack, "V", _props(namespace="Bad_NS", claim_name="-x", storage_capacity_gib=0))
    assert [p.split(":")[0] for p in error.value.errors] == ["namespace", "claim_name", "storage_capacity_gib"]


# A team's claim: its own folder of the file system, in a namespace that enforces Pod Security "baseline".

TEAM = dict(team="research", namespace="hyperpod-ns-research")


def test_a_team_volume_mounts_only_the_teams_folder():
    namespace, volume, claim = volume_manifests(_props(**TEAM), "hyperpod-ns-research-fsx-lustre")
    # The driver mounts <dnsname>@tcp:/<mountname>: a Lustre subdirectory mount of teams/research.
    assert volume["spec"]["csi"]["volumeAttributes"]["mountname"] == "abcdefgh/teams/research"
    assert volume["spec"]["claimRef"] == {"namespace": "hyperpod-ns-research", "name": "fsx-lustre"}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]


def test_a_team_namespace_enforces_pod_security_baseline():
    namespace, _, _ = volume_manifests(_props(**TEAM), "v")
    assert namespace["metadata"]["labels"] == {
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }


def test_the_shared_volume_mounts_the_whole_file_system_and_labels_nothing():
    namespace, volume, _ = volume_manifests(_props(), "moe-fsx-lustre")
    assert volume["spec"]["csi"]["volumeAttributes"]["mountname"] == "abcdefgh"
    assert "labels" not in namespace["metadata"]


def test_a_team_folder_follows_the_mount_name_reference():
    manifest, fsx_id = _synthesize(**TEAM)
    parts = manifest["Fn::Join"][1]
    at = parts.index({"Fn::GetAtt": [fsx_id, "LustreMountName"]})
    assert parts[at + 1].startswith("/teams/research")


@pytest.mark.parametrize("version", ["1.32.0", "1.33.0"])
def test_team_manifests_validate_against_the_kubernetes_schemas(version):
    for document in volume_manifests(_props(**TEAM), "hyperpod-ns-research-fsx-lustre"):
        kubernetes_validate.validate(document, version, strict=True)


def test_a_team_claim_outside_the_teams_namespace_or_a_bad_team_name_is_refused():
    stack = cdk.Stack(cdk.App(), "T")
    with pytest.raises(ConfigError) as error:
        LustreVolume(stack, "A", _props(team="research", namespace="moe"))
    (found,) = error.value.problems
    assert found.key == "namespace" and "hyperpod-ns-research" in str(found)
    with pytest.raises(ConfigError) as error:
        LustreVolume(stack, "B", _props(team="../x", namespace="hyperpod-ns-x"))
    assert [p.key for p in error.value.problems] == ["team"]
