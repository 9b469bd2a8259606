"""config/eks-p5en.yaml as `make synth` builds it: the EKS and HyperPod stacks wired to the
network and storage stacks, with nothing copied between them."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from conftest import ROOT, resources_of_type, with_staged_chart

from moe_cdk.rules.eks import TASK_GOVERNANCE
from moe_cdk.schema.config import load_config
from moe_cdk.stacks.deployment import build_app, summary_lines


@pytest.fixture(scope="module")
def assembly(tmp_path_factory):
    return build_app(
        with_staged_chart(load_config(ROOT / "config/eks-p5en.yaml")),
        outdir=str(tmp_path_factory.mktemp("cdk.out")),
        cloudformation_validation=False,
    ).synth()


@pytest.fixture(scope="module")
def templates(assembly):
    return {stack.stack_name: stack.template for stack in assembly.stacks}


def test_eks_and_hyperpod_stacks_join_network_and_storage(templates):
    assert sorted(templates) == ["moe-eks-cluster", "moe-eks-eks", "moe-eks-network", "moe-eks-storage"]


def test_fsx_volume_is_the_storage_stack_file_system(templates):
    (manifest,) = resources_of_type(templates["moe-eks-eks"], "Custom::AWSCDK-EKS-KubernetesResource").values()
    outputs = [
        p["Fn::GetStackOutput"] for p in manifest["Properties"]["Manifest"]["Fn::Join"][1] if isinstance(p, dict)
    ]
    assert [o["StackName"] for o in outputs] == ["moe-eks-storage"] * 3
    assert "fsx.csi.aws.com" in json.dumps(manifest)


def test_hyperpod_cluster_is_orchestrated_by_the_eks_stack_cluster(templates):
    (cluster,) = resources_of_type(templates["moe-eks-cluster"], "AWS::SageMaker::Cluster").values()
    arn = cluster["Properties"]["Orchestrator"]["Eks"]["ClusterArn"]
    assert arn["Fn::GetStackOutput"]["StackName"] == "moe-eks-eks"


def test_efa_plugin_selects_the_configured_efa_type_only(templates):
    charts = resources_of_type(templates["moe-eks-eks"], "Custom::AWSCDK-EKS-HelmChart").values()
    efa = next(c["Properties"] for c in charts if c["Properties"]["Chart"] == "aws-efa-k8s-device-plugin")
    assert json.loads(efa["Values"])["supportedInstanceLabels"]["values"] == ["ml.p5en.48xlarge"]


def test_control_plane_subnets_span_the_two_configured_zones(templates):
    (eks,) = resources_of_type(templates["moe-eks-eks"], "AWS::EKS::Cluster").values()
    assert len(eks["Properties"]["ResourcesVpcConfig"]["SubnetIds"]) == 2


def test_docs_show_the_synth_summary(assembly):
    text = (ROOT / "docs/hyperpod-eks.md").read_text()
    shown = re.findall(r"^moe-eks-\S+: \d+ resources -> \S+$", text, re.MULTILINE)
    outdir = f"{assembly.directory.rsplit('/', 1)[-1]}/"
    assert shown == [line.replace(outdir, "cdk.out/") for line in summary_lines(assembly)]


def test_the_task_governance_add_on_takes_its_pinned_version(tmp_path):
    config = with_staged_chart(load_config(ROOT / "config/eks-teams.yaml"))
    pinned = dataclasses.replace(
        config, eks=dataclasses.replace(config.eks, addon_versions={TASK_GOVERNANCE.name: "v1.2.3-eksbuild.1"})
    )
    stacks = build_app(pinned, outdir=str(tmp_path), cloudformation_validation=False).synth().stacks
    addons = [
        r["Properties"]
        for s in stacks
        for r in s.template["Resources"].values()
        if r["Type"] == "AWS::EKS::Addon" and r["Properties"]["AddonName"] == TASK_GOVERNANCE.name
    ]
    assert [a.get("AddonVersion") for a in addons] == ["v1.2.3-eksbuild.1"]
