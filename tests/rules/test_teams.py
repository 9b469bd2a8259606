"""The teams section (rules/teams.py): every rule refused by its key, the defaults one team needs, the team and QoS a
job runs as, and the EKS objects task governance reads (AWS::SageMaker::ComputeQuota checked by cfn-lint)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, config_errors

from moe_cdk.constructs.hyperpod_eks_cluster import compute_quota_properties, resource_name
from moe_cdk.core.problems import ConfigError
from moe_cdk.rules.sagemaker import EksNodeRole
from moe_cdk.rules.teams import job_team
from moe_cdk.schema.config import load_config, parse_config

SLURM = yaml.safe_load((ROOT / "config/slurm-teams.yaml").read_text())
EKS = load_config(ROOT / "config/eks-teams.yaml")


def errors(mutate) -> list[str]:
    return config_errors(SLURM, mutate)


def _tiers(d):
    return d["teams"]["qos"]


def _teams(d):
    return d["teams"]["teams"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: _tiers(d)[0].update(preempts=["nope"]), "teams.qos[0].preempts: no such QoS tier (got 'nope'"),
        (lambda d: _tiers(d)[2].update(preempts=["urgent"]), "teams.qos[2].preempts: preempts a tier of priority 100"),
        (lambda d: _tiers(d)[1].update(preempts=["normal"]), "teams.qos[1].preempts: a tier cannot preempt itself"),
        (
            lambda d: _tiers(d)[0].update(priority=101),
            "teams.qos[0].priority: out of range (got 101; allowed 0 to 100)",
        ),
        (lambda d: _tiers(d).append(dict(_tiers(d)[0])), "teams.qos: named twice (got 'urgent'"),
        (lambda d: _tiers(d)[0].update(max_wall="two days"), "teams.qos[0].max_wall: not a Slurm time"),
        (lambda d: _teams(d)[0].update(share_percent=70), "teams.teams: the teams' shares add up to more than"),
        (lambda d: _teams(d)[1]["members"].append({"name": "alice", "uid": 2009}), "already in team research"),
        (lambda d: _teams(d)[1]["members"].append({"name": "dave", "uid": 2001}), "already alice's (got 2001"),
        (lambda d: _teams(d)[0]["members"][0].update(uid=1000), "members[0].uid: out of range (got 1000"),
        (lambda d: _teams(d)[0]["members"][0].update(name="Alice"), "members[0].name: not a login name"),
        (lambda d: _teams(d)[0].update(name="Research_1"), "teams.teams[0].name: not a team name"),
        (lambda d: _teams(d)[1].update(default_qos="low", qos=["urgent"]), "teams.teams[1].default_qos: not one of"),
        (lambda d: _teams(d)[1].update(qos=["gold"]), "teams.teams[1].qos: no such QoS tier (got 'gold'"),
        (lambda d: _teams(d)[0].update(borrow_percent=600), "teams.teams[0].borrow_percent: out of range"),
        (lambda d: _teams(d)[0].update(borrow_percent=10, lend=False), "teams.teams[0].lend: a team that borrows"),
        (lambda d: d["teams"].update(qos=[]), "teams.qos: teams need at least one QoS tier"),
        (lambda d: _teams(d)[1].update(gid=60001), "teams.teams[1].gid: already team research's (got 60001"),
        (lambda d: _teams(d)[0].update(gid=3000), "teams.teams[0].gid: out of range (got 3000; allowed 60001 to"),
        (lambda d: _teams(d)[0].update(name="r" * 33), "teams.teams[0].name: longer than a POSIX group name"),
        (lambda d: _teams(d)[0].update(name="alice"), "teams.teams[0].name: also a member's name"),
        (lambda d: d["teams"].update(operators=["alice"]), "teams.operators[0]: a member of team research"),
        (lambda d: d["cluster"].pop("slurm_config_strategy"), "cluster.slurm_config_strategy: teams include their"),
    ],
)
def test_a_bad_team_configuration_is_refused_by_its_key(mutate, expected):
    assert any(e.startswith(expected) or expected in e for e in errors(mutate)), errors(mutate)


def test_more_than_ten_tiers_are_refused():
    def mutate(d):
        d["teams"]["qos"] = [{"name": f"t{i}", "priority": i} for i in range(11)]
        d["teams"]["teams"] = [{"name": "a", "share_percent": 10}]

    assert any(e.startswith("teams.qos: too many tiers (got 11; allowed at most 10)") for e in errors(mutate))


def test_teams_on_sagemaker_training_jobs_are_refused():
    data = yaml.safe_load((ROOT / "config/training-job.yaml").read_text())
    data["teams"] = copy.deepcopy(SLURM["teams"])
    assert any(
        e.startswith("teams: SageMaker Training Jobs run on their own instances")
        for e in config_errors(data, lambda d: None)
    )


def test_no_teams_section_is_one_team_with_no_setup():
    assert load_config(ROOT / "config/default.yaml").teams is None


def test_a_team_job_gets_the_teams_default_tier():
    config = parse_config(SLURM)
    assert job_team(config.teams, "production", None) == ("production", "normal")
    assert job_team(config.teams, "research", None) == ("research", "low")  # the lowest tier it may use
    assert job_team(config.teams, None, None) == (None, None)


def test_an_unknown_team_or_a_tier_the_team_may_not_use_is_refused_by_option():
    teams = EKS.teams
    with pytest.raises(ConfigError) as error:
        job_team(teams, "marketing", "low")
    assert [p.key for p in error.value.problems] == ["--team"]
    with pytest.raises(ConfigError) as error:
        job_team(teams, "production", "low")  # production may use urgent and normal only
    assert str(error.value.problems[0]).startswith("--qos: not one of team production's tiers (got 'low'")
    with pytest.raises(ConfigError) as error:
        job_team(None, "research", None)
    assert "no teams section" in str(error.value.problems[0])


def test_quotas_are_each_teams_share_of_the_compute_groups_gpus():
    groups = [g.to_eks_props() for g in EKS.cluster.instance_groups]
    research, production = (
        compute_quota_properties(team, cluster_name="moe-teams", cluster_arn="arn", groups=groups)
        for team in EKS.teams.teams
    )
    assert research["ComputeQuotaConfig"]["ComputeQuotaResources"] == [
        {"InstanceType": "ml.p5en.48xlarge", "Accelerators": 8}  # 50 % of 2 nodes x 8 GPUs
    ]
    assert research["ComputeQuotaConfig"]["ResourceSharingConfig"] == {"Strategy": "LendAndBorrow", "BorrowLimit": 50}
    assert production["ComputeQuotaConfig"]["ResourceSharingConfig"] == {"Strategy": "Lend"}
    assert production["ComputeQuotaTarget"] == {"TeamName": "production", "FairShareWeight": 50}


def test_a_quota_covers_each_fallback_type_and_adds_up_groups_of_one_type():
    gpu = next(g for g in (g.to_eks_props() for g in EKS.cluster.instance_groups) if g.role is EksNodeRole.COMPUTE)
    flexible = dataclasses.replace(gpu, name="flex", fallback_instance_types=("ml.p5.48xlarge",))
    quota = compute_quota_properties(EKS.teams.teams[0], cluster_name="moe", cluster_arn="arn", groups=[gpu, flexible])
    # 50 % of 2 + 2 nodes x 8 GPUs on p5en; the flexible group's 2 nodes may be p5 too.
    assert quota["ComputeQuotaConfig"]["ComputeQuotaResources"] == [
        {"InstanceType": "ml.p5en.48xlarge", "Accelerators": 16},
        {"InstanceType": "ml.p5.48xlarge", "Accelerators": 8},
    ]


@pytest.mark.parametrize("team", ["a" * 60, "b" * 59 + "-x", "c" * 70])
def test_long_names_are_cut_to_the_schemas_pattern_and_stay_apart(team):
    name = resource_name("cluster", team)
    assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name), name
    assert name != resource_name("cluster", team + "z")


def test_cfn_lint_checks_the_quota_against_the_registry_schema(tmp_path):
    groups = [g.to_eks_props() for g in EKS.cluster.instance_groups]
    quota = compute_quota_properties(EKS.teams.teams[0], cluster_name="moe", cluster_arn="arn:aws:x", groups=groups)
    quota["ComputeQuotaConfig"]["ResourceSharingConfig"]["Strategy"] = "BorrowOnly"
    template = tmp_path / "t.json"
    resources = {"Quota": {"Type": "AWS::SageMaker::ComputeQuota", "Properties": quota}}
    template.write_text(json.dumps({"AWSTemplateFormatVersion": "2010-09-09", "Resources": resources}))
    done = subprocess.run(
        [str(ROOT / ".venv/bin/cfn-lint"), "--regions", "us-east-1", "--", str(template)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "BorrowOnly" in done.stdout, done.stdout
