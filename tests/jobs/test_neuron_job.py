"""The Trainium job (jobs/neuron_job.py) on Slurm and on EKS, checked against AWS's launch scripts
(tests/fixtures/neuron/nxdt_reference.yaml: train_setup.sh's variables, train.sh's launch), run in bash with
stand-ins for the Neuron commands, and validated against the Kubeflow and Kubernetes schemas."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from kubeflow.training import ApiClient

from moe_cdk.cli.main import main
from moe_cdk.jobs.eks_job import to_yaml
from moe_cdk.jobs.neuron_job import (
    eks_spec,
    neuron_run,
    node_script,
    render_neuron_pytorchjob,
    render_neuron_sbatch,
    slurm_spec,
)
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.rules import neuron
from moe_cdk.schema.config import load_config

IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:neuron"
REFERENCE = yaml.safe_load((ROOT / "tests/fixtures/neuron/nxdt_reference.yaml").read_text())
SETUP, TRAIN_SH = REFERENCE["train_setup"], REFERENCE["train_sh"]


@pytest.fixture(scope="module")
def slurm_run():
    config = load_config(ROOT / "config/trn2.yaml")
    return config, neuron_run(config, load_job_profile(config, None))


@pytest.fixture(scope="module")
def sbatch(slurm_run) -> str:
    config, run = slurm_run
    return render_neuron_sbatch(slurm_spec(config, run, image=IMAGE), run)


@pytest.fixture(scope="module")
def eks_job():
    config = load_config(ROOT / "config/eks-trn2.yaml")
    run = neuron_run(config, load_job_profile(config, None))
    return render_neuron_pytorchjob(eks_spec(config, run, image=IMAGE), run)


def exports(script: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", script, re.MULTILINE))


def test_sbatch_exports_every_variable_train_setup_exports(sbatch):
    assert exports(sbatch).items() >= {k: str(v) for k, v in SETUP["env"].items()}.items()


def test_sbatch_rendezvous_is_train_setups_port(sbatch):
    assert f"export MASTER_PORT={SETUP['master_port']}" in sbatch


def test_sbatch_reserves_the_port_and_raises_the_open_files_limit(sbatch):
    assert f"{SETUP['reserved_port_sysctl']}=" in sbatch and f"ulimit -n {SETUP['open_files']}" in sbatch


def test_sbatch_is_shellcheck_clean(sbatch, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(sbatch)
    done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_sbatch_runs_one_launcher_per_whole_node(sbatch):
    assert "#SBATCH --ntasks-per-node=1" in sbatch and "#SBATCH --exclusive" in sbatch
    assert "#SBATCH --gpus-per-node" not in sbatch


def test_sbatch_carries_the_nxdt_configuration_beside_the_checkpoints(sbatch, slurm_run):
    _, run = slurm_run
    assert 'train_config=/fsx/checkpoints/mixtral-8x7b-trn2/"train-${SLURM_JOB_ID}.yaml"' in sbatch
    carried = sbatch.split("<<'MOE_CDK_PROFILE'\n")[1].split("MOE_CDK_PROFILE\n")[0]
    assert yaml.safe_load(carried) == run.nxdt_config


def test_sbatch_auto_resumes_on_hyperpod_and_requeues_all_but_a_bad_configuration(sbatch):
    assert "auto_resume=(--auto-resume=1)" in sbatch and '"${auto_resume[@]}"' in sbatch
    assert 'permanent() { local rc="$1"; (( rc == 2 )); }' in sbatch and 'elif permanent "$rc"; then' in sbatch
    assert 'scontrol requeue "$SLURM_JOB_ID"' in sbatch


def test_sbatch_stops_nxd_training_with_term(sbatch):
    # torchrun ends its ranks on TERM; USR1 would kill it without that.
    assert 'kill -TERM "$srun_pid"' in sbatch and "kill -USR1" not in sbatch


def test_node_script_launches_as_train_sh_does(slurm_run):
    _, run = slurm_run
    script = node_script(run)
    launch = script.split("launch=(")[1].split(")\n")[0]
    assert launch.split()[0] == TRAIN_SH["launcher"]
    assert all(option in launch for option in TRAIN_SH["launcher_options"] + TRAIN_SH["config_options"])
    assert TRAIN_SH["entry_point"] in launch and "--nproc_per_node=64" in launch
    assert f'{TRAIN_SH["compile_env"]}=1 {TRAIN_SH["compile_prefix"]} "${{launch[@]}}"' in script
    assert f'{TRAIN_SH["compile_env"]}=0 exec "${{launch[@]}}"' in script


def _stand_ins(folder: Path, log: Path) -> dict[str, str]:
    """torchrun and neuron_parallel_compile as scripts that record how they were called."""
    for name in ("torchrun", "neuron_parallel_compile"):
        tool = folder / name
        tool.write_text(f'#!/bin/bash\necho "{name} COMPILE=${{COMPILE:-}} $*" >> {log}\n')
        if name == "neuron_parallel_compile":
            tool.write_text(tool.read_text() + 'exec "$@"\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_node_script_compiles_once_then_trains_each_time(slurm_run, tmp_path):
    _, run = slurm_run
    cache, examples, log = tmp_path / "cache", tmp_path / "examples", tmp_path / "calls.log"
    examples.mkdir()
    script = (
        node_script(run).replace(run.compile_cache, str(cache)).replace(f"{neuron.NXDT_DIR}/examples", str(examples))
    )
    env = _stand_ins(tmp_path, log) | {
        "SLURM_NODEID": "0",
        "SLURM_JOB_NUM_NODES": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "41000",
        "TRAIN_CONFIG": "/fsx/checkpoints/run/train-7.yaml",
    }
    for _ in range(2):
        subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
    calls = log.read_text().splitlines()
    assert [c.split()[0:2] for c in calls] == [
        ["neuron_parallel_compile", "COMPILE=1"],
        ["torchrun", "COMPILE=1"],
        ["torchrun", "COMPILE=0"],
        ["torchrun", "COMPILE=0"],
    ]
    assert calls[-1].split()[2:] == [
        "--nproc_per_node=64",
        "--nnodes=2",
        "--node_rank=0",
        "--master_addr=10.0.0.1",
        "--master_port=41000",
        "training_orchestrator.py",
        "--config-path=/fsx/checkpoints/run",
        "--config-name=train-7",
    ]
    assert (cache / f"moe-cdk-compiled-{run.digest}").exists()


def test_node_script_reads_the_training_operators_variables_on_eks(slurm_run, tmp_path):
    _, run = slurm_run
    (tmp_path / "cache").mkdir()
    (tmp_path / f"cache/moe-cdk-compiled-{run.digest}").touch()
    log = tmp_path / "calls.log"
    script = (
        node_script(run)
        .replace(run.compile_cache, str(tmp_path / "cache"))
        .replace(f"{neuron.NXDT_DIR}/examples", str(tmp_path))
    )
    env = _stand_ins(tmp_path, log) | {
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2:2",
        "MASTER_ADDR": "master-0",
        "TRAIN_CONFIG": "/etc/moe-train/train.yaml",
    }
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
    (call,) = log.read_text().splitlines()
    assert "--node_rank=1 --nnodes=2" not in call and "--nnodes=2 --node_rank=1" in call
    assert "--master_port=41000" in call and "--config-name=train" in call


def test_node_script_without_a_place_exits_2(slurm_run, tmp_path):
    _, run = slurm_run
    done = subprocess.run(["bash", "-c", node_script(run)], env={"PATH": os.environ["PATH"]}, capture_output=True)
    assert done.returncode == 2 and b"needs SLURM_NODEID or PET_NODE_RANK" in done.stderr


def pod(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]


def test_eks_job_validates_against_the_kubeflow_and_kubernetes_schemas(eks_job):
    for replica in eks_job["spec"]["pytorchReplicaSpecs"].values():
        t = replica["template"]
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **t["metadata"]}, "spec": t["spec"]},
            "1.33.0",
            strict=True,
        )
    client = ApiClient()
    model = client._ApiClient__deserialize(eks_job, "KubeflowOrgV1PyTorchJob")
    expected = yaml.safe_load(to_yaml(eks_job))
    for replica in expected["spec"]["pytorchReplicaSpecs"].values():
        for c in replica["template"]["spec"]["containers"]:
            c["resources"] = {k: {r: str(v) for r, v in q.items()} for k, q in c["resources"].items()}
    assert client.sanitize_for_serialization(model) == expected


def test_eks_pods_take_every_neuron_device_and_efa_interface(eks_job):
    (container,) = pod(eks_job)["spec"]["containers"]
    assert container["resources"]["limits"] == {"aws.amazon.com/neuron": 16, "vpc.amazonaws.com/efa": 16}


def test_eks_pods_set_train_setups_kubernetes_variables(eks_job):
    (container,) = pod(eks_job)["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    expected = {k: str(v) for k, v in (SETUP["env"] | SETUP["kubernetes_env"]).items()}
    assert env.items() >= expected.items() and env["TRAIN_CONFIG"] == "/etc/moe-train/train.yaml"


def test_eks_pods_stay_on_the_pod_network_and_restart_on_failure(eks_job):
    assert "hostNetwork" not in pod(eks_job)["spec"]
    assert {r["restartPolicy"] for r in eks_job["spec"]["pytorchReplicaSpecs"].values()} == {"OnFailure"}
    assert eks_job["spec"]["nprocPerNode"] == "64"


def test_eks_pods_have_no_moe_train_probes(eks_job):
    (container,) = pod(eks_job)["spec"]["containers"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(container)


@pytest.mark.parametrize("flag", ["--hyperpod", "--helm-values"])
def test_eks_render_refuses_what_runs_moe_train(flag, capsys):
    assert main(["eks", "render", "--config", str(ROOT / "config/eks-trn2.yaml"), "--image", IMAGE, flag]) == 2
    assert f"{flag}:" in capsys.readouterr().err


def test_slurm_render_of_a_trn2_configuration_is_the_neuron_job(tmp_path):
    out = tmp_path / "job.sh"
    assert (
        main(["slurm", "render", "--config", str(ROOT / "config/trn2.yaml"), "--image", IMAGE, "--output", str(out)])
        == 0
    )
    assert "neuron_parallel_compile" in out.read_text() and "moe-train" not in out.read_text()


def test_slurm_render_names_the_profile_key_nxd_training_cannot_express(capsys):
    args = ["slurm", "render", "--config", str(ROOT / "config/trn2.yaml"), "--image", IMAGE]
    assert main([*args, "--train-arg=--set", "--train-arg=moe.z_loss_coeff=0.001"]) == 2
    assert "training.profile: moe.z_loss_coeff: NxD Training cannot express it" in capsys.readouterr().err


def test_slurm_render_of_a_trn2_configuration_needs_an_image(capsys):
    assert main(["slurm", "render", "--config", str(ROOT / "config/trn2.yaml"), "--local"]) == 2
    assert "--image:" in capsys.readouterr().err


def test_preflight_runs_nccom_test_all_reduce_and_all_to_all_over_every_core(tmp_path):
    out = tmp_path / "preflight.sh"
    args = ["verify", "render", "--config", str(ROOT / "config/trn2.yaml"), "--image", IMAGE, "--output", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert "for operation in all_reduce alltoall; do" in text
    assert '--nworkers "$(( 64 * SLURM_JOB_NUM_NODES ))"' in text and 'NEURON_RT_ROOT_COMM_ID="${MASTER_ADDR}' in text
    assert "moe-preflight node --instance-type ml.trn2.48xlarge" in text
    assert "moe-preflight collectives" not in text


def test_sbatch_writes_the_ecr_credentials_but_not_the_gpu_nodes_nccl_settings(sbatch):
    assert "write_enroot_credentials 123456789012.dkr.ecr.us-east-2.amazonaws.com us-east-2" in sbatch
    assert "moe-cdk-efa.sh" not in sbatch


def test_preflight_holds_nccom_test_to_efa(tmp_path):
    # AWS's nccom-tests sbatch (awsome-distributed-training micro-benchmarks/nccom-tests/slurm/nccom-tests.sbatch,
    # line 8) exports FI_PROVIDER=efa before nccom-test.
    out = tmp_path / "preflight.sh"
    args = ["verify", "render", "--config", str(ROOT / "config/trn2.yaml"), "--image", IMAGE, "--output", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert "export FI_PROVIDER=efa\n" in text
    assert text.index("export FI_PROVIDER=efa") < text.index("nccom-test \\")


def team_trn2_config(tmp_path):
    """config/eks-trn2.yaml with the teams of config/eks-teams.yaml."""
    teams = (ROOT / "config/eks-teams.yaml").read_text()
    teams = teams[teams.index("\nteams:") : teams.index("\nobservability:")]
    path = tmp_path / "eks-trn2-teams.yaml"
    path.write_text((ROOT / "config/eks-trn2.yaml").read_text() + teams + "\n")
    return load_config(path)


def test_a_teams_eks_pods_ask_for_the_neuron_resource_task_governance_counts(tmp_path):
    # sagemaker-hyperpod-cli's NEURON_RESOURCE_LIMIT_KEY: the team ClusterQueues cover aws.amazon.com/neurondevice.
    config = team_trn2_config(tmp_path)
    run = neuron_run(config, load_job_profile(config, None))
    job = render_neuron_pytorchjob(eks_spec(config, run, image=IMAGE, team="research"), run)
    (container,) = pod(job)["spec"]["containers"]
    assert container["resources"]["limits"] == {"aws.amazon.com/neurondevice": 16, "vpc.amazonaws.com/efa": 16}


def test_a_job_without_a_team_on_a_teams_cluster_asks_for_the_same_name(tmp_path):
    # One name per cluster: a plugin that registers both would hand a chip out under each.
    config = team_trn2_config(tmp_path)
    run = neuron_run(config, load_job_profile(config, None))
    job = render_neuron_pytorchjob(eks_spec(config, run, image=IMAGE), run)
    (container,) = pod(job)["spec"]["containers"]
    assert container["resources"]["limits"] == {"aws.amazon.com/neurondevice": 16, "vpc.amazonaws.com/efa": 16}
