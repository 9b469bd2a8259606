"""The Slurm limits of the teams section (rules/teams.py): each tier's preempt exempt time and per-user GPU limit, each
team's GPU caps and job limit, refused by their key when out of range, and carried to the lifecycle scripts."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT, config_errors

from moe_cdk.constructs.hyperpod_slurm_cluster import teams_parameters
from moe_cdk.schema.config import parse_config

SLURM = yaml.safe_load((ROOT / "config/slurm-teams.yaml").read_text())


def _tier(d, i=0):
    return d["teams"]["qos"][i]


def _team(d, i=0):
    return d["teams"]["teams"][i]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: _tier(d).update(preempt_exempt_s=-1), "teams.qos[0].preempt_exempt_s: out of range (got -1"),
        (lambda d: _tier(d).update(preempt_exempt_s=86401), "teams.qos[0].preempt_exempt_s: out of range (got 86401"),
        (lambda d: _tier(d).update(max_gpus_per_user=0), "teams.qos[0].max_gpus_per_user: must be positive (got 0"),
        (lambda d: _team(d).update(max_gpus=0), "teams.teams[0].max_gpus: must be positive (got 0"),
        (lambda d: _team(d).update(max_gpus_per_user=-8), "teams.teams[0].max_gpus_per_user: must be positive"),
        (lambda d: _team(d).update(max_jobs_per_user=0), "teams.teams[0].max_jobs_per_user: must be positive (got 0"),
        (
            lambda d: _team(d).update(max_gpus=8, max_gpus_per_user=16),
            "teams.teams[0].max_gpus_per_user: above the team's own cap max_gpus 8 (got 16; allowed 1 to 8)",
        ),
    ],
)  # fmt: skip
def test_a_bad_slurm_limit_is_refused_by_its_key(mutate, expected):
    found = config_errors(SLURM, mutate)
    assert any(e.startswith(expected) for e in found), found


def test_the_limits_reach_the_lifecycle_scripts():
    data = yaml.safe_load((ROOT / "config/slurm-teams.yaml").read_text())
    _tier(data).update(preempt_exempt_s=600, max_gpus_per_user=8)
    _team(data).update(max_gpus=16, max_gpus_per_user=8, max_jobs_per_user=4)
    params = teams_parameters(parse_config(data).teams)
    assert (params["qos"][0]["preempt_exempt_s"], params["qos"][0]["max_gpus_per_user"]) == (600, 8)
    research = params["teams"][0]
    assert {k: research[k] for k in ("max_gpus", "max_gpus_per_user", "max_jobs_per_user")} == {
        "max_gpus": 16, "max_gpus_per_user": 8, "max_jobs_per_user": 4,
    }  # fmt: skip


def test_by_default_a_tier_is_exempt_for_awss_thirty_minutes_and_nothing_is_capped():
    # 03-qos-priority-preemption.md (awslabs/ai-on-sagemaker-hyperpod at a1d1d75): PreemptExemptTime=00:30:00.
    params = teams_parameters(parse_config(SLURM).teams)
    assert {t["preempt_exempt_s"] for t in params["qos"]} == {1800}
    assert {(t["max_gpus"], t["max_gpus_per_user"], t["max_jobs_per_user"]) for t in params["teams"]} == {
        (None, None, None)
    }
