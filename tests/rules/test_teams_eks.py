"""The teams section's EKS settings (rules/teams.py): absolute borrow limits and idle-resource sharing as task
governance takes them, each refused by its key, and teams refused on autoscaled groups."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT, config_errors

from moe_cdk.constructs.hyperpod_eks_cluster import compute_quota_properties
from moe_cdk.schema.config import parse_config

EKS = yaml.safe_load((ROOT / "config/eks-teams.yaml").read_text())


def _research(d) -> dict:
    return d["teams"]["teams"][0]  # borrow_percent: 50


def _with_limits(*limits) -> dict:
    data = yaml.safe_load((ROOT / "config/eks-teams.yaml").read_text())
    _research(data)["borrow_limits"] = list(limits)
    return data


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ([{"instance_type": "ml.p5en.48xlarge"}], "teams.teams[0].borrow_limits[0]: no amount"),
        ([{"instance_type": "ml.x9.large", "accelerators": 1}], "teams.teams[0].borrow_limits[0].instance_type: "),
        (
            [{"instance_type": "ml.p5en.48xlarge", "accelerators": -1}],
            "teams.teams[0].borrow_limits[0].accelerators: out of range",
        ),
        (
            [{"instance_type": "ml.p5en.48xlarge", "memory_gib": 2e7}],
            "teams.teams[0].borrow_limits[0].memory_gib: out of range",
        ),
        (
            [{"instance_type": "ml.p5en.48xlarge", "vcpus": 8}, {"instance_type": "p5en.48xlarge", "accelerators": 8}],
            "teams.teams[0].borrow_limits[1].instance_type: named twice",
        ),
        (
            [{"instance_type": "ml.p5.48xlarge", "accelerators": 8}],
            "teams.teams[0].borrow_limits[0].instance_type: no compute group runs this type",
        ),
    ],
)
def test_a_bad_borrow_limit_is_refused_by_its_key(limits, expected):
    found = config_errors(_with_limits(*limits), lambda d: None)
    assert any(e.startswith(expected) for e in found), found


def test_a_borrow_limit_needs_a_team_that_borrows():
    def mutate(d):
        _research(d).update(borrow_percent=0, borrow_limits=[{"instance_type": "ml.p5en.48xlarge", "accelerators": 8}])

    found = config_errors(EKS, mutate)
    assert any(e.startswith("teams.teams[0].borrow_limits: caps on borrowing for a team that does not") for e in found)


def test_borrow_limits_become_the_quotas_absolute_borrow_limits():
    config = parse_config(_with_limits({"instance_type": "p5en.48xlarge", "accelerators": 4, "memory_gib": 512.5}))
    groups = [g.to_eks_props() for g in config.cluster.instance_groups]
    quota = compute_quota_properties(config.teams.teams[0], cluster_name="moe", cluster_arn="arn", groups=groups)
    assert quota["ComputeQuotaConfig"]["ResourceSharingConfig"] == {
        "Strategy": "LendAndBorrow",
        "BorrowLimit": 50,
        "AbsoluteBorrowLimits": [{"InstanceType": "ml.p5en.48xlarge", "Accelerators": 4, "MemoryInGiB": 512.5}],
    }


def test_a_quota_without_borrow_limits_has_none():
    config = parse_config(EKS)
    groups = [g.to_eks_props() for g in config.cluster.instance_groups]
    quota = compute_quota_properties(config.teams.teams[0], cluster_name="moe", cluster_arn="arn", groups=groups)
    assert "AbsoluteBorrowLimits" not in quota["ComputeQuotaConfig"]["ResourceSharingConfig"]


def test_teams_on_an_autoscaled_group_are_refused_by_the_groups_key():
    def mutate(d):
        d["cluster"]["node_provisioning_mode"] = "continuous"
        d["cluster"]["instance_groups"][1].update(autoscale=True, deep_health_checks=False)

    found = config_errors(EKS, mutate)
    assert [e for e in found if "autoscale" in e] == [
        "cluster.instance_groups[1].autoscale: a team quota on an autoscaled group is untested either way: Karpenter's "
        "maximum may be refused against 0 nodes, and 0 admits no job (docs/teams.md) (got True; allowed autoscale: "
        "false with teams)"
    ]


def test_the_same_autoscaled_group_without_teams_is_accepted():
    data = yaml.safe_load((ROOT / "config/eks-teams.yaml").read_text())
    data.pop("teams")
    data["cluster"]["node_provisioning_mode"] = "continuous"
    data["cluster"]["instance_groups"][1].update(autoscale=True, deep_health_checks=False)
    assert parse_config(data).teams is None
