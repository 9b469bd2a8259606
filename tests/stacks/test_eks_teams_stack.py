"""config/eks-teams.yaml with every task-governance setting, as `make synth` builds it: cdk-nag and cfn-lint clean,
the settings in the scheduler configuration and the quotas, and each team's FSx claim after its quota, in AWS's
order."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, assert_cfn_lint_clean, resources_of_type, with_staged_chart

from moe_cdk.schema.config import parse_config
from moe_cdk.stacks.deployment import build_app

MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"


def _every_setting() -> dict:
    data = yaml.safe_load((ROOT / "config/eks-teams.yaml").read_text())
    data["teams"]["idle_resource_sharing"] = True
    data["teams"]["teams"][0]["borrow_limits"] = [{"instance_type": "ml.p5en.48xlarge", "accelerators": 8, "vcpus": 96}]
    return data


@pytest.fixture(scope="module")
def assembly(tmp_path_factory):
    config = with_staged_chart(parse_config(_every_setting()))
    # build_app adds cdk-nag: an unacknowledged finding fails this synth.
    return build_app(config, outdir=str(tmp_path_factory.mktemp("cdk.out")), cloudformation_validation=False).synth()


@pytest.fixture(scope="module")
def cluster(assembly) -> dict:
    return assembly.get_stack_by_name("moe-teams-cluster").template


def test_every_setting_synthesizes_cfn_lint_clean(assembly):
    paths = [f"{assembly.directory}/{s.template_file}" for s in assembly.stacks]
    assert_cfn_lint_clean("us-east-1", *paths)


def test_idle_resource_sharing_reaches_the_scheduler_configuration(cluster):
    (scheduler,) = resources_of_type(cluster, "AWS::SageMaker::ClusterSchedulerConfig").values()
    assert scheduler["Properties"]["SchedulerConfig"]["IdleResourceSharing"] == "Enabled"


def test_borrow_limits_reach_the_teams_quota(cluster):
    sharing = {
        q["Properties"]["ComputeQuotaTarget"]["TeamName"]: q["Properties"]["ComputeQuotaConfig"][
            "ResourceSharingConfig"
        ]
        for q in resources_of_type(cluster, "AWS::SageMaker::ComputeQuota").values()
    }
    assert sharing["research"]["AbsoluteBorrowLimits"] == [
        {"InstanceType": "ml.p5en.48xlarge", "Accelerators": 8, "VCpu": 96}
    ]
    assert "AbsoluteBorrowLimits" not in sharing["production"]


def test_each_teams_claim_follows_its_quota_which_creates_the_namespace(cluster):
    quotas = {
        q["Properties"]["ComputeQuotaTarget"]["TeamName"]: logical
        for logical, q in resources_of_type(cluster, "AWS::SageMaker::ComputeQuota").items()
    }
    manifests = resources_of_type(cluster, MANIFEST).values()
    for team, quota in quotas.items():
        (claim,) = [m for m in manifests if f"hyperpod-ns-{team}" in json.dumps(m)]
        assert quota in claim["DependsOn"]
        # The namespace exists by then: the manifest is applied, not created.
        assert claim["Properties"]["Overwrite"] is True


def test_the_eks_stack_keeps_only_the_administrators_claim(assembly):
    eks = assembly.get_stack_by_name("moe-teams-eks").template
    (claim,) = resources_of_type(eks, MANIFEST).values()
    assert "hyperpod-ns-" not in json.dumps(claim)
