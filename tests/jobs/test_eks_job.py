"""`moe-cdk eks render`: the PyTorchJob and HyperPodPyTorchJob follow the configuration and the
instance catalog, and validate against the Kubernetes OpenAPI schemas and the Kubeflow models."""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from kubeflow.training import ApiClient
from ports import free_port
from trainer_runs import ENV, MEGATRON_REJECTS, TINY, data_prefix  # noqa: F401 (fixture)

from moe_cdk.cli.main import main
from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.eks_job import (
    EksJobSpec,
    job_spec_from_config,
    render_hyperpod_job,
    render_profile_config_map,
    render_pytorchjob,
    suffixed_name,
)
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.schema.config import load_config, parse_config
from moe_cdk.tools.plan import plan
from moe_cdk.training.exit_codes import KUBEFLOW_RETRYABLE
from moe_cdk.training.metrics import MetricsSink

IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:test"
CONFIG = ROOT / "config/eks-p5en.yaml"


@pytest.fixture(scope="module")
def config():
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def spec(config):
    return job_spec_from_config(config, image=IMAGE)


def config_with_compute(instance_type: str, *, require_efa: bool = True):
    data = yaml.safe_load(CONFIG.read_text())
    data["cluster"]["require_efa"] = require_efa
    data["cluster"]["instance_groups"][1]["instance_type"] = instance_type
    return parse_config(data)


def pods(job: dict) -> list[dict]:
    """Every pod template of a job, as a Pod object the Kubernetes schemas can check."""
    if job["kind"] == "PyTorchJob":
        templates = [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [r["template"] for r in job["spec"]["replicaSpecs"]]
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", **t["metadata"]}, "spec": t["spec"]}
        for t in templates
    ]


def container(job: dict) -> dict:
    return pods(job)[0]["spec"]["containers"][0]


def quantities_as_strings(document: dict) -> dict:
    """Resource quantities as the Kubeflow models serialise them (Kubernetes accepts both)."""
    document = copy.deepcopy(document)
    for replica in document["spec"]["pytorchReplicaSpecs"].values():
        for c in replica["template"]["spec"]["containers"]:
            for kind in ("requests", "limits"):
                c["resources"][kind] = {k: str(v) for k, v in c["resources"][kind].items()}
    return document


@pytest.mark.parametrize("version", ["1.32.0", "1.33.0"])
def test_pod_templates_validate_against_the_kubernetes_schemas(spec, version):
    for job in (render_pytorchjob(spec), render_hyperpod_job(spec)):
        for pod in pods(job):
            kubernetes_validate.validate(pod, version, strict=True)


def test_pytorchjob_round_trips_through_the_kubeflow_models(spec):
    job = render_pytorchjob(spec)
    client = ApiClient()
    model = client._ApiClient__deserialize(job, "KubeflowOrgV1PyTorchJob")
    # A field the models do not know would be dropped, and the comparison would fail.
    assert client.sanitize_for_serialization(model) == quantities_as_strings(job)


def test_one_master_and_the_rest_workers(spec):
    replicas = render_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)


def test_a_single_node_job_has_no_workers(spec):
    replicas = render_pytorchjob(dataclasses.replace(spec, nodes=1))["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master"]


def test_restart_policy_follows_the_trainer_exit_codes(spec):
    job = render_pytorchjob(spec)
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    assert job["spec"]["runPolicy"]["backoffLimit"] == 10
    assert job["spec"]["nprocPerNode"] == "8"


def test_pods_use_the_host_network_and_cluster_dns(spec):
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")


def test_fsx_claim_shared_memory_and_profile_are_mounted(spec, config):
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == "fsx-lustre"
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["profile"]["configMap"]["name"] == render_profile_config_map(spec)["metadata"]["name"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert set(mounts) == {"/fsx", "/dev/shm", "/etc/moe-train"} and mounts["/etc/moe-train"]["readOnly"] is True


def test_probes_watch_the_files_the_trainer_is_told_to_write(spec):
    c = container(render_pytorchjob(spec))
    args = c["args"]
    assert "metrics.readiness_file=/tmp/moe-train/ready" in args
    assert "metrics.liveness_file=/tmp/moe-train/alive" in args
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-f", "/tmp/moe-train/ready"]
    assert "/tmp/moe-train/alive" in c["livenessProbe"]["exec"]["command"][-1]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800


def test_liveness_probe_command_fails_on_a_stale_file(spec, tmp_path):
    command = container(render_pytorchjob(dataclasses.replace(spec, stall_timeout_s=60)))["livenessProbe"]["exec"][
        "command"
    ]
    alive = tmp_path / "alive"
    alive.touch()
    script = command[-1].replace("/tmp/moe-train/alive", str(alive))
    assert subprocess.run([*command[:-1], script]).returncode == 0
    subprocess.run(["touch", "-d", "-5 minutes", str(alive)], check=True)
    assert subprocess.run([*command[:-1], script]).returncode != 0


def test_tolerations_match_the_group_taints():
    data = yaml.safe_load(CONFIG.read_text())
    data["cluster"]["instance_groups"][1] |= {
        "deep_health_checks": False,
        "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    }
    pod = pods(render_pytorchjob(job_spec_from_config(parse_config(data), image=IMAGE)))[0]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_node_selector_is_the_group_instance_type_and_labels(spec):
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.p5en.48xlarge", "moe-cdk/pool": "training"}


def test_the_pods_run_the_profile_their_config_map_holds(spec, config):
    args = container(render_pytorchjob(spec))["args"]
    assert args[:2] == ["--config", "/etc/moe-train/train.yaml"]
    assert not [a for a in args if a.startswith(("moe.", "parallel."))]  # nothing set over the profile
    config_map = render_profile_config_map(spec)
    assert config_map["data"] == {"train.yaml": config.training.path.read_text()}
    assert config_map["metadata"]["namespace"] == spec.namespace


def test_another_profile_reaches_the_config_map_and_names_the_job(config, tmp_path):
    profile = tmp_path / "my_run.yaml"
    profile.write_text((ROOT / "training/configs/moe-8x1b.yaml").read_text().replace("top_k: 2", "top_k: 1"))
    spec = job_spec_from_config(config, profile=load_job_profile(config, str(profile)), image=IMAGE, name="my-run")
    assert "top_k: 1" in render_profile_config_map(spec)["data"]["train.yaml"]
    assert render_profile_config_map(spec)["metadata"]["name"] == "my-run-profile"


def test_a_config_map_name_is_cut_to_a_kubernetes_name():
    assert suffixed_name("a" * 55 + "-b", "profile") == "a" * 55 + "-b-profi"
    assert suffixed_name("a" * 55 + "-bcdefg", "profile") == "a" * 55 + "-bcdefg"


def test_metrics_port_is_annotated_for_the_scraper(spec):
    metadata = pods(render_pytorchjob(spec))[0]["metadata"]
    assert metadata["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9410"}


@pytest.mark.parametrize("instance_type", ["ml.p5en.48xlarge", "ml.p5.48xlarge", "ml.p4de.24xlarge"])
def test_efa_and_device_requests_follow_the_instance_type(instance_type):
    spec = catalog.lookup(instance_type)
    resources = container(render_pytorchjob(job_spec_from_config(config_with_compute(instance_type), image=IMAGE)))[
        "resources"
    ]
    assert (
        resources["limits"]
        == resources["requests"]
        == {"nvidia.com/gpu": spec.accelerator_count, "vpc.amazonaws.com/efa": spec.efa_interfaces}
    )


def test_a_moe_train_job_on_trainium_is_refused_naming_the_neuron_path():
    with pytest.raises(ConfigError) as error:
        job_spec_from_config(config_with_compute("ml.trn2.48xlarge"), image=IMAGE)
    (found,) = error.value.problems
    assert found.key == "--group" and "training.stack: neuronx-distributed-training" in str(found)


def test_no_efa_resource_without_efa_devices(spec):
    resources = container(render_pytorchjob(dataclasses.replace(spec, efa_per_node=0)))["resources"]
    assert "vpc.amazonaws.com/efa" not in resources["limits"] and "vpc.amazonaws.com/efa" not in resources["requests"]


def test_a_group_without_accelerators_is_refused():
    with pytest.raises(ConfigError) as error:
        job_spec_from_config(config_with_compute("ml.m5.2xlarge", require_efa=False), image=IMAGE)
    assert error.value.errors == [
        "--group: group gpu has no accelerators to train on "
        "(got 'ml.m5.2xlarge'; allowed a GPU or Trainium compute group)"
    ]


def test_hyperpod_job_detects_hangs_from_the_progress_line(spec, caplog):
    job = render_hyperpod_job(spec)
    rules = {r["name"]: r for r in job["spec"]["runPolicy"]["logMonitoringConfiguration"]}
    assert rules["JobHangingDetection"]["expectedRecurringFrequencyInSeconds"] == 900
    # The pattern matches the progress line the trainer really logs at every record.
    sink = MetricsSink(rank=0, max_steps=5000)
    with caplog.at_level(logging.INFO, logger="moe_cdk.training.metrics"):
        sink.write(
            {"step": 120, "loss": 2.314, "tokens_per_s": 51234.0, "expert_imbalance": [1.21], "dispatch_time_s": 0.0032}
        )
    assert re.match(rules["JobHangingDetection"]["logPattern"], caplog.messages[-1])
    assert job["spec"]["replicaSpecs"][0]["replicas"] == 2 and job["spec"]["nprocPerNode"] == "8"


def test_unknown_group_names_the_option(config):
    with pytest.raises(ConfigError) as error:
        job_spec_from_config(config, image=IMAGE, group="nope")
    assert error.value.errors == ["--group: unknown compute group (got 'nope'; allowed gpu)"]


def test_more_nodes_than_the_group_has_is_refused(config):
    with pytest.raises(ConfigError) as error:
        job_spec_from_config(config, image=IMAGE, nodes=3)
    assert error.value.errors == ["--nodes: more nodes than group gpu has (got 3; allowed 1 to 2)"]


def test_cli_refuses_a_second_config_that_the_profile_would_not_size(capsys):

    args = ["eks", "render", "--config", str(CONFIG), "--image", IMAGE]
    assert main([*args, "--train-arg=--config", "--train-arg=/fsx/my.yaml"]) == 2
    assert "  --train-arg: the job runs the profile it was rendered with (got '--config';" in capsys.readouterr().err


def test_cli_runs_the_profile_given_with_train_config(tmp_path):

    out = tmp_path / "job.yaml"
    profile = ROOT / "training/configs/moe-8x1b.yaml"
    args = ["eks", "render", "--config", str(CONFIG), "--image", IMAGE, "--train-config", str(profile)]
    assert main([*args, "--output", str(out)]) == 0
    config_map, job = yaml.safe_load_all(out.read_text())
    assert config_map["data"]["train.yaml"] == profile.read_text() and job["metadata"]["name"] == "moe-8x1b"


def _grace_periods(out: Path) -> set[int]:
    _, job = yaml.safe_load_all(out.read_text())
    specs = job["spec"]["pytorchReplicaSpecs"].values()
    return {r["template"]["spec"]["terminationGracePeriodSeconds"] for r in specs}


def test_cli_gives_the_pods_a_grace_period_that_holds_plans_stop_time(tmp_path, capsys):
    stop_s = plan(load_config(CONFIG)).stop_s
    assert main(["eks", "render", "--config", str(CONFIG), "--image", IMAGE, "--output", str(tmp_path / "j.yaml")]) == 0
    (grace,) = _grace_periods(tmp_path / "j.yaml")
    assert grace >= stop_s * 1.25 and grace % 60 == 0 and "warning" not in capsys.readouterr().err


def test_cli_warns_of_a_grace_period_shorter_than_plans_stop_time(tmp_path, capsys):
    args = ["eks", "render", "--config", str(CONFIG), "--image", IMAGE, "--termination-grace", "60"]
    assert main([*args, "--output", str(tmp_path / "j.yaml")]) == 0
    assert _grace_periods(tmp_path / "j.yaml") == {60}
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "--termination-grace is 60 s, and a stop needs about" in warning[0]


def test_cli_writes_the_job_and_refuses_a_slurm_configuration(tmp_path):
    out = tmp_path / "job.yaml"
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_cdk.cli.main",
            "eks",
            "render",
            "--config",
            str(CONFIG),
            "--image",
            IMAGE,
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert ok.returncode == 0, ok.stderr
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == ["ConfigMap", "PyTorchJob"]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_cdk.cli.main",
            "eks",
            "render",
            "--config",
            str(ROOT / "config/default.yaml"),
            "--image",
            IMAGE,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2
    assert "cluster.orchestrator: eks render needs an EKS configuration (got 'slurm'; allowed eks)" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_kubeflow_pod_exits_2_for_a_configuration_megatron_rejects_and_is_not_restarted(data_prefix, tmp_path):
    spec = EksJobSpec(
        name="rejected",
        namespace="default",
        image=IMAGE,
        nodes=1,
        instance_type="ml.p5en.48xlarge",
        devices_per_node=2,
        device_resource="nvidia.com/gpu",
        efa_per_node=0,
        train_profile=TINY.read_text(),
        profile_config_map="rejected-profile",
        train_args=(
            "--set",
            f"data.prefixes=[{data_prefix}]",
            "--set",
            f"data.prepare_from=[{ROOT / 'training/configs/tiny-corpus.txt'}]",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *MEGATRON_REJECTS,
        ),
    )
    job = render_pytorchjob(spec)
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    pod = master["template"]["spec"]["containers"][0]
    port = free_port()
    # What the training operator sets in a Master pod of a job with nprocPerNode.
    kubeflow = {
        "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"],
        "PET_NNODES": "1",
        "PET_NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    # The profile's ConfigMap, as the kubelet mounts it.
    mount = tmp_path / "etc-moe-train"
    mount.mkdir()
    for name, text in render_profile_config_map(spec)["data"].items():
        (mount / name).write_text(text)
    args = [a.replace("/etc/moe-train/", f"{mount}/") for a in pod["args"]]
    command = [str(Path(sys.executable).parent / pod["command"][0]), *args]
    result = subprocess.run(command, env={**ENV, **kubeflow}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-4000:]
    assert master["restartPolicy"] == "ExitCode" and result.returncode not in KUBEFLOW_RETRYABLE
    reasons = [line for line in result.stderr.splitlines() if "TransformerConfig rejects" in line]
    assert len(reasons) == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]


TEAMS_CONFIG = ROOT / "config/eks-teams.yaml"


def test_a_team_job_runs_in_the_teams_namespace_with_its_queue_and_priority_labels():
    spec = job_spec_from_config(load_config(TEAMS_CONFIG), image=IMAGE, team="production")
    job = render_pytorchjob(spec)
    expected = {
        "kueue.x-k8s.io/queue-name": "hyperpod-ns-production-localqueue",
        "kueue.x-k8s.io/priority-class": "normal-priority",  # the team's default tier
    }
    assert job["metadata"]["namespace"] == "hyperpod-ns-production"
    assert job["metadata"]["labels"].items() >= expected.items()
    assert all(p["metadata"]["labels"].items() >= expected.items() for p in pods(job))


def test_a_job_without_a_team_keeps_the_configured_namespace_and_no_queue():
    job = render_pytorchjob(job_spec_from_config(load_config(TEAMS_CONFIG), image=IMAGE))
    assert job["metadata"]["namespace"] == "moe" and "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]


def test_eks_render_checks_the_team(capsys):
    args = ["eks", "render", "--config", str(TEAMS_CONFIG), "--image", IMAGE, "--team", "marketing"]
    assert main(args) == 2
    assert "--team: no such team in the configuration (got 'marketing'; allowed research, production)" in (
        capsys.readouterr().err
    )


def test_helm_values_for_a_team_job_are_refused(capsys):
    args = ["eks", "render", "--config", str(TEAMS_CONFIG), "--image", IMAGE, "--team", "research", "--helm-values"]
    assert main(args) == 2 and "--helm-values: the chart does not render the team's" in capsys.readouterr().err


# What the pods may do (docs/teams.md, "What isolation each orchestrator gives on EKS").

# Pod Security Standards, "baseline": the capabilities a container may add; anything else is refused in a namespace
# that enforces it, as the team namespaces do (constructs/lustre_volume.py).
BASELINE_ADDABLE = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def team_spec(**overrides) -> EksJobSpec:
    return dataclasses.replace(
        job_spec_from_config(load_config(TEAMS_CONFIG), image=IMAGE, team="research"), **overrides
    )


def baseline_violations(pod: dict) -> list[str]:
    """What Pod Security's baseline level refuses in ``pod`` (the checks a training pod could trip)."""
    spec = pod["spec"]
    found = [f"spec.{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    found += [f"volume {v['name']}: hostPath" for v in spec.get("volumes", []) if "hostPath" in v]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        context = c.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{c['name']}: privileged")
        found += [f"{c['name']}: adds {cap}" for cap in context.get("capabilities", {}).get("add", [])
                  if cap not in BASELINE_ADDABLE]  # fmt: skip
        found += [f"{c['name']}: hostPort {p['hostPort']}" for p in c.get("ports", []) if p.get("hostPort")]
    return found


@pytest.mark.parametrize("render", [render_pytorchjob, render_hyperpod_job])
def test_a_team_job_runs_on_the_pod_network(render):
    spec = team_spec()
    assert spec.uses_host_network is False
    for pod in pods(render(spec)):
        assert "hostNetwork" not in pod["spec"] and "dnsPolicy" not in pod["spec"]


@pytest.mark.parametrize("render", [render_pytorchjob, render_hyperpod_job])
def test_a_team_job_passes_pod_security_baseline(render):
    assert {tuple(baseline_violations(p)) for p in pods(render(team_spec(preflight=True)))} == {()}


def test_host_network_is_an_option_of_a_job_without_a_team(spec):
    assert spec.uses_host_network is True
    pod = pods(render_pytorchjob(dataclasses.replace(spec, host_network=False)))[0]["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert job_spec_from_config(load_config(CONFIG), image=IMAGE, host_network=False).uses_host_network is False


def test_host_network_for_a_team_job_is_refused():
    (found,) = team_spec(host_network=True).problems()
    assert found.key == "host_network" and "baseline" in str(found)


def test_a_tier_without_a_team_is_refused_rather_than_dropped():
    # Without a team the job has no task-governance queue, so a priority class would have no effect.
    spec = job_spec_from_config(load_config(TEAMS_CONFIG), image=IMAGE, qos="urgent")
    (found,) = spec.problems()
    assert found.key == "qos" and "a team's jobs only" in str(found)
    assert team_spec(qos="urgent").problems() == []


@pytest.mark.parametrize("render", [render_pytorchjob, render_hyperpod_job])
@pytest.mark.parametrize("team", [None, "research"])
def test_containers_drop_every_capability_and_privilege_escalation_under_the_runtime_seccomp_profile(render, team):
    spec = team_spec(preflight=True) if team else job_spec_from_config(load_config(CONFIG), image=IMAGE, preflight=True)
    for pod in pods(render(spec)):
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        containers = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
        assert [c["name"] for c in containers] == ["preflight", "pytorch"]
        for c in containers:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("version", ["1.32.0", "1.33.0"])
def test_team_pod_templates_validate_against_the_kubernetes_schemas(version):
    for job in (render_pytorchjob(team_spec(preflight=True)), render_hyperpod_job(team_spec())):
        for pod in pods(job):
            kubernetes_validate.validate(pod, version, strict=True)


def test_a_team_pytorchjob_round_trips_through_the_kubeflow_models():
    job = render_pytorchjob(team_spec())
    client = ApiClient()
    model = client._ApiClient__deserialize(job, "KubeflowOrgV1PyTorchJob")
    assert client.sanitize_for_serialization(model) == quantities_as_strings(job)
