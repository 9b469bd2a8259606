"""The `eks` section and the EKS rules on instance groups: what is rejected and how it reads."""

from __future__ import annotations

import copy

import yaml
from conftest import ROOT, config_errors as errors_for

from moe_cdk.schema.config import Orchestrator, load_config, parse_config

EKS = yaml.safe_load((ROOT / "config/eks-p5en.yaml").read_text())
SLURM = yaml.safe_load((ROOT / "config/default.yaml").read_text())


def test_shipped_eks_configuration_loads():
    config = load_config(ROOT / "config/eks-p5en.yaml")
    assert config.cluster.orchestrator is Orchestrator.EKS
    assert config.availability_zones == ["us-east-2a", "us-east-2b"]
    assert config.cluster.instance_groups[1].labels == {"moe-cdk/pool": "training"}


def test_second_zone_is_required_for_eks():
    errors = errors_for(EKS, lambda d: d["eks"].pop("second_availability_zone"))
    assert errors == [
        "eks.second_availability_zone: EKS needs subnets in two availability zones "
        "(got None; allowed a zone of us-east-2 other than us-east-2a)"
    ]


def test_second_zone_must_differ_from_the_cluster_zone():
    errors = errors_for(EKS, lambda d: d["eks"].update(second_availability_zone="us-east-2a"))
    assert errors[0].startswith("eks.second_availability_zone: must differ from cluster.availability_zone")


def test_public_endpoint_open_to_the_internet_is_refused():
    errors = errors_for(
        EKS, lambda d: d["eks"].update(endpoint_access="public-and-private", public_access_cidrs=["0.0.0.0/0"])
    )
    assert errors == [
        "eks.public_access_cidrs[0]: opens the API to the internet (got '0.0.0.0/0'; allowed a range narrower than /0)"
    ]


def test_unsupported_kubernetes_version_is_refused():
    errors = errors_for(EKS, lambda d: d["eks"].update(kubernetes_version="1.27"))
    assert errors == [
        "eks.kubernetes_version: not a Kubernetes version HyperPod supports with this kubectl layer "
        "(got '1.27'; allowed 1.32, 1.33)"
    ]


def test_slurm_roles_are_refused_on_eks():
    errors = errors_for(EKS, lambda d: d["cluster"]["instance_groups"][0].update(role="controller"))
    assert (
        "cluster.instance_groups[0].role: EKS clusters have no Slurm head or login nodes (got 'controller'; allowed "
        "compute or system)" in errors
    )


def test_eks_needs_a_system_group():
    errors = errors_for(EKS, lambda d: d["cluster"]["instance_groups"].pop(0))
    assert errors[0].startswith("cluster.instance_groups: needs a system group")


def test_labels_must_be_a_mapping_of_strings():
    errors = errors_for(EKS, lambda d: d["cluster"]["instance_groups"][1].update(labels=["a"]))
    assert errors == [
        "cluster.instance_groups[1].labels: must be a mapping (got ['a']; allowed a mapping of a string to a string)"
    ]


def test_eks_section_is_refused_with_slurm():
    errors = errors_for(SLURM, lambda d: d.update(eks={"container_insights": True}))
    assert errors == ["eks: only used with orchestrator eks (got 'slurm'; allowed eks)"]


def test_labels_and_system_groups_are_refused_with_slurm():
    def mutate(d):
        d["cluster"]["instance_groups"][2]["labels"] = {"a": "b"}
        d["cluster"]["instance_groups"][1]["role"] = "system"

    errors = errors_for(SLURM, mutate)
    assert (
        "cluster.instance_groups[1].role: system groups are for EKS clusters (got 'system'; allowed controller, login "
        "or compute)" in errors
    )
    assert (
        "cluster.instance_groups[2].labels: only EKS nodes have Kubernetes labels and taints (got {'a': 'b'}; allowed "
        "none with this orchestrator)" in errors
    )


def test_taints_with_deep_health_checks_are_a_config_error():
    errors = errors_for(
        EKS,
        lambda d: d["cluster"]["instance_groups"][1].update(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
    )
    assert [e.split(":")[0] for e in errors] == ["cluster.instance_groups[1].taints"]
    assert "custom taints cannot be combined with deep health checks" in errors[0]


def test_taints_are_accepted_once_deep_health_checks_are_off():
    data = copy.deepcopy(EKS)
    data["cluster"]["instance_groups"][1].update(
        deep_health_checks=False, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    )
    assert parse_config(data).cluster.instance_groups[1].taints[0].key == "nvidia.com/gpu"


def test_efa_file_system_on_eks_is_refused():
    errors = errors_for(EKS, lambda d: d["storage"]["lustre"].update(efa_enabled=True, storage_capacity_gib=19200))
    assert [e for e in errors if e.startswith("storage.lustre.efa_enabled")] == [
        "storage.lustre.efa_enabled: the EKS lifecycle scripts do not configure Lustre over EFA, so pods would reach "
        "the file system over TCP (got True; allowed false with orchestrator eks)"
    ]
