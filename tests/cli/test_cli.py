"""`moe-cdk validate` and synth report a bad configuration identically, without a traceback or output."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from conftest import PYTHON, ROOT

BAD_CONFIG = """\
region: us-east-2
cluster:
  availability_zone: us-west-2a
  instance_groups:
    - {name: controller, role: controller, instance_type: ml.m5.2xlarge, instance_count: 1}
    - {name: gpu, role: compute, instance_type: ml.p5en.48xlarge, instance_count: -1}
storage:
  lustre: {storage_capacity_gib: 1000, per_unit_storage_throughput_mb_s_tib: 300}
"""
EXPECTED = [
    "cluster.instance_groups[1].instance_count: must be at least 1 (got -1; allowed 1 or more)",
    "storage.lustre.storage_capacity_gib: not a PERSISTENT_2 SSD capacity (got 1000; allowed 1200 or a multiple of "
    "2400 GiB)",
    "storage.lustre.per_unit_storage_throughput_mb_s_tib: not a PERSISTENT_2 throughput tier (got 300; allowed 125, "
    "250, 500, 1000 MB/s/TiB)",
]
ENV = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}


@pytest.fixture(scope="module")
def bad_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "bad.yaml"
    path.write_text(BAD_CONFIG)
    return path


def moe_cdk(*args):
    return subprocess.run([str(ROOT / ".venv/bin/moe-cdk"), *args], capture_output=True, text=True, env=ENV, cwd=ROOT)


def test_validate_accepts_the_default_configuration():
    result = moe_cdk("validate", "--config", "config/default.yaml")
    assert (result.returncode, result.stdout) == (0, "config/default.yaml: valid\n")


@pytest.mark.parametrize("staged", [True, False], ids=["chart staged", "no chart"])
def test_validate_accepts_an_eks_configuration_and_names_what_synth_still_needs(staged, tmp_path):
    chart = ROOT / "tests/fixtures/hyperpod-chart-standin" if staged else tmp_path / "no-chart"
    data = yaml.safe_load((ROOT / "config/eks-p5en.yaml").read_text())
    data["eks"]["hyperpod_chart_directory"] = str(chart)
    config = tmp_path / "eks.yaml"
    config.write_text(yaml.safe_dump(data))
    result = moe_cdk("validate", "--config", str(config))
    if staged:
        assert (result.returncode, result.stdout) == (0, f"{config}: valid\n")
    else:
        first, needed = result.stdout.splitlines()
        assert (result.returncode, first) == (0, f"{config}: valid")
        assert needed.startswith("synth still needs: eks.hyperpod_chart_directory: has no Chart.yaml")
        assert "run `make hyperpod-chart CONFIG=...`" in needed


def test_validate_lists_every_problem_and_exits_2(bad_config):
    result = moe_cdk("validate", "--config", str(bad_config))
    assert result.returncode == 2
    assert sorted(result.stderr.splitlines()[1:]) == sorted(f"  {line}" for line in EXPECTED)
    assert "Traceback" not in result.stderr


def test_validate_reports_an_unreadable_file(tmp_path):
    result = moe_cdk("validate", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "cannot read the file" in result.stderr


def test_synth_prints_exactly_what_validate_prints_and_writes_nothing(bad_config, tmp_path):
    validate = moe_cdk("validate", "--config", str(bad_config))
    outdir = tmp_path / "out"
    synth = subprocess.run(
        [PYTHON, "app.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV | {"CDK_OUTDIR": str(outdir), "CDK_CONTEXT_JSON": json.dumps({"config": str(bad_config)})},
    )
    assert synth.returncode == 2
    assert synth.stderr == validate.stderr
    assert "Traceback" not in synth.stdout + synth.stderr
    assert not outdir.exists() or not any(outdir.iterdir())


def test_unknown_command_line_option_exits_2():
    result = moe_cdk("validate", "--configuration", "x.yaml")
    assert result.returncode == 2
    assert "--config" in result.stderr


def test_config_docs_check_detects_a_stale_reference(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    assert moe_cdk("config-docs", "--check", str(stale)).returncode == 1
    assert moe_cdk("config-docs", "--check", "docs/configuration.md").returncode == 0


def test_slurm_render_takes_the_job_shape_from_the_configuration():
    # The golden file is the container variant for the default configuration's gpu group.
    result = moe_cdk(
        "slurm",
        "render",
        "--config",
        "config/default.yaml",
        "--image",
        "123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:latest",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "tests/golden/sbatch-default.sh").read_text()


def test_slurm_render_names_a_profile_it_cannot_read():
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml", "--train-config", "x.yaml", "--local")
    assert result.returncode == 2 and not result.stdout
    assert "  --train-config: cannot read the file (got 'x.yaml: No such file or directory';" in result.stderr


def test_slurm_render_checks_the_profile_with_the_trainer_arguments_applied():
    result = moe_cdk(
        "slurm", "render", "--config", "config/default.yaml", "--local", "--train-arg=--set", "--train-arg=moe.top_k=9"
    )
    assert result.returncode == 2 and not result.stdout
    assert "  training.profile: moe.top_k: out of range (got 9; allowed 1 to num_experts (8))" in result.stderr


def test_slurm_render_refuses_a_second_config_among_the_trainer_arguments():
    result = moe_cdk(
        "slurm",
        "render",
        "--config",
        "config/default.yaml",
        "--local",
        "--train-arg=--config",
        "--train-arg=/fsx/b.yaml",
    )
    assert result.returncode == 2 and not result.stdout
    assert "  --train-arg: the job runs the profile it was rendered with (got '--config';" in result.stderr


def test_slurm_render_needs_an_image_or_local():
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml")
    assert result.returncode == 2
    assert "  --image: give an image, or --local for a CPU-only cluster, not both (got None;" in result.stderr


@pytest.mark.parametrize(
    "config, orchestrator", [("config/eks-p5en.yaml", "eks"), ("config/training-job.yaml", "training-job")]
)
def test_slurm_render_refuses_a_configuration_without_slurm(config, orchestrator):
    result = moe_cdk("slurm", "render", "--config", config, "--local")
    assert result.returncode == 2 and not result.stdout
    assert (
        f"  cluster.orchestrator: slurm render needs a Slurm configuration (got '{orchestrator}'; "
        "allowed slurm or parallelcluster)" in result.stderr
    )


def test_slurm_render_refuses_more_nodes_than_the_group_has():
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml", "--local", "--nodes", "5")
    assert result.returncode == 2 and not result.stdout
    assert "  --nodes: more nodes than group gpu has (got 5; allowed 1 to 2)" in result.stderr


def test_slurm_render_rejects_an_unknown_group():
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml", "--local", "--group", "tpu")
    assert result.returncode == 2
    assert "  --group: unknown compute group (got 'tpu'; allowed gpu)" in result.stderr


def test_an_output_in_a_missing_folder_is_a_problem_with_output(tmp_path):
    target = tmp_path / "missing" / "x.sbatch"
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml", "--local", "--output", target)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"  --output: cannot be written in {target.parent} (No such file or directory)" in result.stderr
    assert not target.parent.exists()


def test_an_output_is_replaced_whole_with_nothing_left_beside_it(tmp_path):
    target = tmp_path / "x.sbatch"
    target.write_text("old\n")
    result = moe_cdk("slurm", "render", "--config", "config/default.yaml", "--local", "--output", target)
    assert result.returncode == 0, result.stderr
    assert target.read_text().startswith("#!") and [p.name for p in tmp_path.iterdir()] == ["x.sbatch"]


def test_an_output_never_writes_through_a_planted_partial_link(tmp_path):
    """A link planted at the old, predictable `.NAME.partial` is neither followed nor removed."""
    from moe_cdk.cli.report import emit

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = tmp_path / ".x.sbatch.partial"
    planted.symlink_to(victim)
    target = tmp_path / "x.sbatch"
    assert emit("#!/bin/bash\n", str(target)) == 0
    assert target.read_text() == "#!/bin/bash\n" and not target.is_symlink()
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.sbatch.partial", "victim.txt", "x.sbatch"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_an_output_has_the_modes_the_umask_allows(tmp_path, umask):
    """Rendered job files are read by others (sbatch, kubectl users): 0666 less the umask, not mkstemp's 0600."""
    from moe_cdk.cli.report import emit

    target = tmp_path / "x.sbatch"
    old = os.umask(umask)
    try:
        assert emit("#!/bin/bash\n", str(target)) == 0
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_output_leaves_no_partial_file(tmp_path, monkeypatch):
    from moe_cdk.cli import report as report_module

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(report_module.os, "replace", refuse)
    target = tmp_path / "x.sbatch"
    assert report_module.emit("#!/bin/bash\n", str(target)) == 2
    assert list(tmp_path.iterdir()) == []


def test_slurm_render_writes_a_parallelcluster_job_for_its_queue(tmp_path):
    out = tmp_path / "train.sbatch"
    result = moe_cdk("slurm", "render", "--config", "config/parallelcluster.yaml", "--local", "--output", str(out))
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --nodes=2" in lines and "#SBATCH --requeue" in lines
