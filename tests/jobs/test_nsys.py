"""--nsys-rank: the rendered Slurm script and PyTorchJob run the chosen rank under nsys where it is on the PATH,
and without it otherwise, saying so in one line."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from moe_cdk.jobs.slurm_job import SlurmJobSpec, nsys_wrapper, render_sbatch


def _run_wrapper(tmp_path, rank: str, *, with_nsys: bool, script: str | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if with_nsys:  # a stand-in that notes its arguments and runs the command after them
        fake = bin_dir / "nsys"
        fake.write_text('#!/bin/bash\necho "nsys $*" >>"$NSYS_LOG"\nshift 4\nexec "$@"\n')
        fake.chmod(0o755)
    script = script or nsys_wrapper('[[ "${SLURM_PROCID:-}" == 1 ]]', 1, f"{tmp_path}/nsys/rank-1")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_PROCID": rank, "SLURM_JOB_ID": "7"}
    env["NSYS_LOG"] = str(tmp_path / "log")
    return subprocess.run(
        ["bash", "-c", script, "w", "echo", "trained"], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_the_chosen_rank_runs_under_nsys_and_the_others_do_not(tmp_path):
    chosen, other = _run_wrapper(tmp_path, "1", with_nsys=True), _run_wrapper(tmp_path, "0", with_nsys=True)
    assert chosen.stdout == other.stdout == "trained\n"
    assert (tmp_path / "log").read_text().splitlines() == [
        f"nsys profile --trace=cuda,nvtx,osrt --force-overwrite=true --output={tmp_path}/nsys/rank-1 echo trained"
    ]
    assert (tmp_path / "nsys").is_dir()


def test_without_nsys_the_rank_runs_and_says_so_once(tmp_path):
    done = _run_wrapper(tmp_path, "1", with_nsys=False)
    assert done.returncode == 0 and done.stdout == "trained\n"
    assert done.stderr.count("nsys: not found in the image; rank 1 runs without Nsight Systems") == 1
    assert len(done.stderr.splitlines()) == 1


def _spec(**kw) -> SlurmJobSpec:
    return SlurmJobSpec(
        job_name="j", nodes=2, tasks_per_node=2, time_limit="1:00:00", local=True, train_config="t.yaml", **kw
    )


def test_the_sbatch_script_wraps_the_trainer_of_the_chosen_rank_only_when_asked(tmp_path):
    assert "nsys" not in render_sbatch(_spec())
    script = render_sbatch(_spec(nsys_rank=3))
    assert 'bash -c "$nsys_wrapper" nsys-wrapper python3 -m moe_cdk.cli.train' in script
    lexer = shlex.shlex(script.split("\nnsys_wrapper=", 1)[1], posix=True)
    lexer.whitespace_split = True
    wrapper = lexer.get_token()  # the value the script assigns, unquoted as bash would
    assert _run_wrapper(tmp_path, "3", with_nsys=True, script=wrapper).stdout == "trained\n"
    assert _run_wrapper(tmp_path, "1", with_nsys=True, script=wrapper).stdout == "trained\n"
    assert (tmp_path / "log").read_text().splitlines() == [
        "nsys profile --trace=cuda,nvtx,osrt --force-overwrite=true --output=./nsys/rank-3-job-7 echo trained"
    ]


@pytest.mark.parametrize("rank", [-1, 4])
def test_a_rank_the_job_does_not_have_is_a_problem(rank):
    assert [p.key for p in _spec(nsys_rank=rank).problems()] == ["nsys_rank"]


def test_the_pytorchjob_runs_the_pod_of_the_chosen_rank_under_the_wrapper(tmp_path):
    from conftest import ROOT

    from moe_cdk.jobs.eks_job import job_spec_from_config, render_pytorchjob
    from moe_cdk.schema.config import load_config

    config = load_config(ROOT / "config/eks-p5en.yaml")
    plain = render_pytorchjob(job_spec_from_config(config, image="img:1"))
    spec = job_spec_from_config(config, image="img:1", nsys_rank=9)  # 8 GPUs a node: the second pod
    (template,) = {r["template"]["spec"]["containers"][0]["command"][2] for r in _replicas(render_pytorchjob(spec))}
    command = _replicas(render_pytorchjob(spec))[0]["template"]["spec"]["containers"][0]["command"]
    assert _replicas(plain)[0]["template"]["spec"]["containers"][0]["command"] == ["moe-train"]
    assert command[:2] == ["bash", "-c"] and command[3:] == ["nsys-wrapper", "moe-train"]
    assert '[[ "${PET_NODE_RANK:-0}" == 1 ]]' in template
    assert f"{spec.nsys_dir}/node-1-" in template


def _replicas(job: dict) -> list[dict]:
    return list(job["spec"]["pytorchReplicaSpecs"].values())
