"""The `observability` section: Managed Prometheus and Grafana for a HyperPod cluster, either orchestrator."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ROOT, config_errors as errors_for

from moe_cdk.schema.config import parse_config

SLURM = yaml.safe_load((ROOT / "config/default.yaml").read_text())
EKS = yaml.safe_load((ROOT / "config/eks-p5en.yaml").read_text())
TRAINING_JOB = yaml.safe_load((ROOT / "config/training-job.yaml").read_text())


@pytest.mark.parametrize("base", [SLURM, EKS], ids=["slurm", "eks"])
def test_grafana_without_identity_center_is_refused(base):
    errors = errors_for(base, lambda d: d["observability"].pop("identity_center_enabled"))
    assert errors == [
        "observability.identity_center_enabled: observability creates a Managed Grafana workspace that signs users in "
        "through IAM Identity Center; enable Identity Center in the account, then set this to true, or set "
        "observability.enabled: false (got False; allowed true with observability)"
    ]


def test_without_observability_identity_center_is_not_needed():
    data = copy.deepcopy(SLURM)
    data["observability"] = {"enabled": False}
    assert parse_config(data).observability.enabled is False


def test_observability_is_off_unless_asked_for():
    data = copy.deepcopy(SLURM)
    del data["observability"]
    assert parse_config(data).observability.enabled is False


def test_training_jobs_have_no_cluster_to_observe():
    errors = errors_for(
        TRAINING_JOB, lambda d: d.update(observability={"enabled": True, "identity_center_enabled": True})
    )
    assert errors == [
        "observability.enabled: SageMaker Training Jobs report to CloudWatch, not to a HyperPod cluster's Prometheus "
        "(got True; allowed false with orchestrator training-job)"
    ]


@pytest.mark.parametrize("interval", [10, 301])
def test_scrape_interval_out_of_range_is_refused(interval):
    errors = errors_for(SLURM, lambda d: d["observability"].update(scrape_interval_s=interval))
    assert errors == [f"observability.scrape_interval_s: out of range (got {interval}; allowed 30 to 300)"]
