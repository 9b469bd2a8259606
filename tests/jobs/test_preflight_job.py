"""The preflight job (moe-cdk verify render): rendered for every shipped HyperPod configuration and
checked by bash, shellcheck and the Kubernetes schemas; the --local variant run for real on a two-node
Slurm and under torchrun; the training job's gate (--after) on that Slurm."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeflow.training import ApiClient

from moe_cdk.cli.main import main
from moe_cdk.jobs.preflight_job import NCCL_TESTS, preflight_job, render_preflight_sbatch
from moe_cdk.jobs.slurm_job import job_spec_from_config, render_sbatch
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema.config import Orchestrator, load_config, parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import free_port  # noqa: E402
from slurm_harness import Rejected, SlurmCluster, SlurmUnavailable  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:test"
HYPERPOD_CONFIGS = sorted(
    p for p in (ROOT / "config").glob("*.yaml") if load_config(p).cluster.orchestrator is not Orchestrator.TRAINING_JOB
)
MIXTRAL = ROOT / "training/configs/mixtral-8x7b.yaml"


def _render(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "preflight.out"
    assert main(["verify", "render", *args, "--output", str(out)]) == 0
    return out.read_text()


@pytest.mark.parametrize("config", HYPERPOD_CONFIGS, ids=lambda p: p.stem)
def test_every_hyperpod_configuration_renders_a_preflight_that_its_checker_accepts(config, tmp_path):
    orchestrator = load_config(config).cluster.orchestrator
    text = _render(tmp_path, "--config", str(config), "--image", IMAGE)
    if orchestrator is Orchestrator.EKS:
        config_map, job, *mpijob = yaml.safe_load_all(text)
        assert config_map["kind"] == "ConfigMap"
        # nccl-tests' MPIJob on GPUs; a Trainium preflight checks each node's devices only (docs/trainium.md).
        assert len(mpijob) == (0 if load_config(config).training_stack is TrainingStack.NXDT else 1)
        for nccl in mpijob:
            check_mpijob(nccl)
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            t = replica["template"]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **t["metadata"]}, "spec": t["spec"]}
            kubernetes_validate.validate(pod, "1.33.0", strict=True)
        # A field the Kubeflow models do not know would be dropped, and the round trip would differ.
        client = ApiClient()
        model = client._ApiClient__deserialize(job, "KubeflowOrgV1PyTorchJob")
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            for c in replica["template"]["spec"]["containers"]:
                c["resources"] = {k: {r: str(v) for r, v in q.items()} for k, q in c["resources"].items()}
        assert client.sanitize_for_serialization(model) == job
        return
    script = tmp_path / "preflight.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    done = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


# The fields of kubeflow.org/v2beta1 MPIJob that the MPI operator HyperPod's chart installs (v0.5.0) reads:
# kubeflow/mpi-operator v0.5.0, pkg/apis/kubeflow/v2beta1/types.go (MPIJobSpec, RunPolicy, ReplicaSpec).
MPIJOB_SPEC = {"slotsPerWorker", "runLauncherAsWorker", "runPolicy", "mpiReplicaSpecs", "sshAuthMountPath",
               "launcherCreationPolicy", "mpiImplementation"}  # fmt: skip
RUN_POLICY = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
              "schedulingPolicy", "suspend"}  # fmt: skip
REPLICA_SPEC = {"replicas", "template", "restartPolicy"}


def check_mpijob(job: dict) -> None:
    """An MPIJob as the operator reads it, with pod templates that pass Kubernetes' own schema."""
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert set(job["spec"]) <= MPIJOB_SPEC and set(job["spec"]["runPolicy"]) <= RUN_POLICY
    assert set(job["spec"]["mpiReplicaSpecs"]) == {"Launcher", "Worker"}
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        assert set(replica) <= REPLICA_SPEC
        t = replica["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **t["metadata"]}, "spec": t["spec"]}
        kubernetes_validate.validate(pod, "1.33.0", strict=True)


@pytest.fixture(scope="module")
def eks_preflight(tmp_path_factory) -> tuple[dict, dict]:
    """The PyTorchJob and the MPIJob; the profile's ConfigMap before them is checked on its own."""
    config_map, *jobs = yaml.safe_load_all(
        _render(tmp_path_factory.mktemp("eks"), "--config", str(ROOT / "config/eks-p5en.yaml"), "--image", IMAGE)
    )
    assert config_map["data"] == {"train.yaml": MIXTRAL.read_text()}
    return tuple(jobs)


def test_eks_preflight_runs_nccl_tests_through_an_mpijob_over_every_gpu(eks_preflight):
    _, job = eks_preflight
    assert job["metadata"]["name"] == "mixtral-8x7b-nccl-tests" and job["spec"]["slotsPerWorker"] == 8
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    container = worker["template"]["spec"]["containers"][0]
    # No command: the operator runs /usr/sbin/sshd -De there (mpi-operator v0.5.0, newWorker), on the pod network.
    assert "command" not in container and "args" not in container and "hostNetwork" not in worker["template"]["spec"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 16}
    script = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    for test in NCCL_TESTS:
        assert "-np 16 -N 8 --bind-to none" in script and f"/opt/nccl-tests/build/{test} -b 8 -e 16G" in script
        assert f"moe-preflight nccl-tests --log /tmp/{test}.log --instance-type ml.p5en.48xlarge --nodes 2" in script


def test_eks_nccl_tests_launcher_gives_a_verdict_per_test_and_fails_if_one_fails(eks_preflight, tmp_path):
    # The launcher's own script, with a stand-in mpirun that prints real logs (tests/fixtures/fabric):
    # all_reduce_perf a p5en NCCL/OFI INFO excerpt (16 EFA NICs) followed by the rows of a 2x p5.48xlarge run,
    # alltoall_perf a row excerpt that shows no EFA and a low bandwidth.
    _, job = eks_preflight
    script = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    fabric = ROOT / "tests/fixtures/fabric"
    (tmp_path / "all_reduce_perf.txt").write_text(
        (fabric / "nccl_debug_ofi_p5en_16nics.txt").read_text()
        + (fabric / "all_reduce_perf_p5_2node_srun.txt").read_text()
    )
    shutil.copy(fabric / "alltoall_perf_rows_mpirun_bottlerocket.txt", tmp_path / "alltoall_perf.txt")
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(
        f'#!/bin/bash\nfor a; do :; done\ncase "$*" in *all_reduce_perf*) cat {tmp_path}/all_reduce_perf.txt;; '
        f"*) cat {tmp_path}/alltoall_perf.txt;; esac\n"
    )
    mpirun.chmod(0o755)
    launcher = tmp_path / "launcher.sh"
    for test in NCCL_TESTS:  # the logs in this test's folder, not /tmp
        script = script.replace(f"/tmp/{test}.log", f"{tmp_path}/{test}.log")
    launcher.write_text("#!/bin/bash\n" + script.replace("/opt/amazon/openmpi/bin/mpirun", str(mpirun)))
    assert subprocess.run(["shellcheck", "-s", "bash", str(launcher)], capture_output=True).returncode == 0
    done = subprocess.run(
        ["bash", str(launcher)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    passed = r"^preflight all_reduce_perf: PASS busbw 487.3 GB/s at 17179869184 B, provider efa$"
    assert re.search(passed, done.stdout, re.M), done.stdout
    failed = r"^preflight alltoall_perf: FAIL alltoall_perf.busbw: bus bandwidth below the p5en.48xlarge floor"
    assert re.search(failed, done.stdout, re.M), done.stdout


@pytest.fixture(scope="module")
def gpu_script():
    config = load_config(ROOT / "config/default.yaml")
    job = job_spec_from_config(config, image=IMAGE)
    return render_preflight_sbatch(preflight_job(job, instance_type="ml.p5en.48xlarge"))


def test_gpu_preflight_runs_nccl_tests_over_every_gpu_with_pmix_in_the_image(gpu_script):
    for test in NCCL_TESTS:
        launch = re.search(rf"srun[^\n]*(?:\\\n[^\n]*)*?/opt/nccl-tests/build/{test} -b 8 -e 16G", gpu_script)
        assert launch, test
        assert "--ntasks-per-node=8" in launch.group(0) and "--mpi=pmix" in launch.group(0)
        assert "--container-image='123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:test'" in launch.group(0)
        assert f'moe-preflight nccl-tests --log "$work/{test}.log" --instance-type ml.p5en.48xlarge' in gpu_script


def test_gpu_preflight_runs_dcgm_on_the_host_and_hands_its_result_to_the_node_check(gpu_script):
    assert 'dcgmi diag -r "$2" -j' in gpu_script and 'dcgm "$work" 1' in gpu_script
    assert '--dcgm-level 1 --dcgm-json "$work/dcgm.json"' in gpu_script


def test_preflight_asks_for_the_training_jobs_nodes(gpu_script):
    config = load_config(ROOT / "config/default.yaml")
    training = render_sbatch(job_spec_from_config(config, image=IMAGE))
    wanted = {
        "--nodes=2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--constraint=efa",
        "--exclusive",
    }
    for line in wanted:
        assert f"#SBATCH {line}\n" in training and f"#SBATCH {line}\n" in gpu_script
    assert "#SBATCH --no-requeue" in gpu_script


def test_local_preflight_leaves_out_the_gpu_checks(tmp_path):
    text = _render(tmp_path, "--config", str(ROOT / "config/default.yaml"), "--local", "--python", PYTHON)
    assert "nccl-tests" not in text and "dcgmi" not in text and "--container-image" not in text
    assert f"{PYTHON} -m moe_cdk.cli.preflight collectives" in text


def test_eks_preflight_runs_the_node_check_then_torchrun_over_every_pod(eks_preflight):
    job, _ = eks_preflight
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    container = master["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["bash", "-c"]
    assert re.match(
        r"moe-preflight node --instance-type ml\.p5en\.48xlarge .*"
        r"&& exec torchrun -m moe_cdk\.cli\.preflight -- collectives",
        container["command"][2],
    )
    assert master["restartPolicy"] == "Never" and job["spec"]["runPolicy"]["backoffLimit"] == 0
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 16
    assert "livenessProbe" not in container


def test_eks_preflight_needs_the_image(capsys):
    assert main(["verify", "render", "--config", str(ROOT / "config/eks-p5en.yaml")]) == 2
    assert "--image: an EKS preflight runs in the training image" in capsys.readouterr().err


def test_unknown_group_is_refused_with_the_option_named(capsys):
    assert main(["verify", "render", "--config", str(ROOT / "config/default.yaml"), "--local", "--group", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


# -- run for real ---------------------------------------------------------------------------------


def test_local_collectives_under_torchrun_print_an_all_to_all_figure(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(PYTHON).parent)) or "torchrun"
    done = subprocess.run(
        [torchrun, "--nproc-per-node=2", f"--master-port={free_port()}", "-m", "moe_cdk.cli.preflight", "--"]
        + ["collectives", "--config", str(MIXTRAL), "--local", "--all-reduce-bytes", "1048576", "--iterations", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figure = re.search(r"preflight ep_all_to_all: PASS busbw ([\d.]+) GB/s", done.stdout)
    assert figure and float(figure.group(1)) > 0, done.stdout
    # The profile's shape: micro-batch 1 x 4096 tokens over tensor parallel 2, hidden 4096, top-2; its EP 8 is
    # capped at the 2 ranks there are.
    assert "2048 tokens x 4096 hidden x top-2 over EP 2" in done.stdout


@pytest.fixture(scope="module")
def slurm():
    try:
        with SlurmCluster() as cluster:
            yield cluster
    except SlurmUnavailable as error:
        pytest.fail(f"a real Slurm is needed for these tests: {error}")


def _ci_config(tmp_path: Path) -> Path:
    """config/default.yaml with the compute group on the test cluster's partition, and its profile with the
    checkpoints (where the jobs write the profile they carry) in ``tmp_path``."""
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    for group in data["cluster"]["instance_groups"]:
        if group["role"] == "compute":
            group["partition"] = "ci"
    profile = yaml.safe_load((ROOT / data["training"]["profile"]).read_text())
    profile["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    data["training"]["profile"] = str(tmp_path / "profile.yaml")
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    path = tmp_path / "ci.yaml"
    path.write_text(yaml.safe_dump(data))
    parse_config(data)
    return path


def _job_log(tmp_path: Path, job_id: str) -> str:
    logs = list(tmp_path.glob(f"*-{job_id}.out"))
    return logs[0].read_text(errors="replace") if logs else ""


def test_local_preflight_completes_on_two_slurm_nodes_with_a_verdict_per_node(slurm, tmp_path):
    script = tmp_path / "preflight.sh"
    args = ["--config", str(_ci_config(tmp_path)), "--local", "--python", PYTHON, "--master-port", str(free_port())]
    script.write_text(_render(tmp_path, *args))
    job_id = slurm.submit(script)
    assert not isinstance(job_id, Rejected), job_id
    state = slurm.wait_for(job_id, {"COMPLETED"}, timeout=240)
    log = _job_log(tmp_path, job_id)
    assert state.exit_code == "0:0", log[-4000:]
    assert {m for m in re.findall(r"preflight (node\d): PASS python", log)} == {"node1", "node2"}, log[-4000:]
    figure = re.search(r"preflight ep_all_to_all: PASS busbw ([\d.]+) GB/s.* over 2 ranks", log)
    assert figure and float(figure.group(1)) > 0, log[-4000:]
    assert "preflight passed" in log


def _gated_training(tmp_path: Path, config: Path, after: str) -> Path:
    """A training job (/bin/true as the interpreter) that must follow job ``after``."""
    out = tmp_path / f"training-after-{after}.sh"
    args = ["slurm", "render", "--config", str(config), "--local", "--python", "/bin/true"]
    args += ["--time", "5", "--signal-lead", "10", "--job-name", f"gated-{after}", "--after", after]
    assert main([*args, "--output", str(out)]) == 0
    return out


def _submit(slurm: SlurmCluster, script: Path) -> str:
    job_id = slurm.submit(script)
    assert not isinstance(job_id, Rejected), job_id
    return job_id


def test_training_after_a_passed_preflight_runs(slurm, tmp_path):
    config = _ci_config(tmp_path)
    preflight = tmp_path / "preflight.sh"
    preflight.write_text(
        _render(tmp_path, "--config", str(config), "--local", "--python", PYTHON, "--master-port", str(free_port()))
    )
    first = _submit(slurm, preflight)
    gated = _submit(slurm, _gated_training(tmp_path, config, first))
    assert slurm.job_state(gated).fields["Dependency"] == f"afterok:{first}(unfulfilled)"
    assert slurm.wait_for(gated, {"COMPLETED"}, timeout=240).exit_code == "0:0", _job_log(tmp_path, first)[-3000:]


def test_training_after_a_failed_preflight_is_cancelled_without_running(slurm, tmp_path):
    config = _ci_config(tmp_path)
    failing = tmp_path / "failing.sh"
    # /bin/false as the interpreter: every check fails, and the preflight exits 1.
    failing.write_text(_render(tmp_path, "--config", str(config), "--local", "--python", "/bin/false"))
    first = _submit(slurm, failing)
    gated = _submit(slurm, _gated_training(tmp_path, config, first))
    assert slurm.wait_for(first, {"FAILED"}, timeout=120).exit_code == "1:0"
    cancelled = slurm.wait_for(gated, {"CANCELLED"}, timeout=60)
    # Never started: Slurm sets StartTime to the cancel time. RunTime is no proof: it was once
    # read as 20789-18:20:41, counted from the epoch, as from a start time not yet set.
    start, end = cancelled.fields["StartTime"], cancelled.fields["EndTime"]
    assert start in {"Unknown", "None", end}, cancelled.fields
    assert cancelled.fields["Reason"] == "DependencyNeverSatisfied"
    assert not list(tmp_path.glob(f"gated-{first}-*.out"))
    assert "preflight FAILED: nodes collectives" in _job_log(tmp_path, first)


def test_eks_training_job_can_check_each_node_first_with_an_init_container(tmp_path):
    out = tmp_path / "job.yaml"
    args = ["eks", "render", "--config", str(ROOT / "config/eks-p5en.yaml"), "--image", IMAGE, "--preflight"]
    assert main([*args, "--output", str(out)]) == 0
    _, job = yaml.safe_load_all(out.read_text())
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        t = replica["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **t["metadata"]}, "spec": t["spec"]}
        kubernetes_validate.validate(pod, "1.33.0", strict=True)
        (init,) = t["spec"]["initContainers"]
        assert init["command"] == ["moe-preflight", "node", "--instance-type", "ml.p5en.48xlarge"]
        assert init["resources"] == t["spec"]["containers"][0]["resources"]


def test_training_job_configuration_has_no_fleet_to_verify(capsys):
    assert main(["verify", "render", "--config", str(ROOT / "config/training-job.yaml")]) == 2
    err = capsys.readouterr().err
    assert "cluster.orchestrator: verify render needs a cluster" in err and "slurm or eks or parallelcluster" in err
