"""The observability step: node_info.py's checks of its parameters, setup_observability.sh on each
kind of node, slurm_exporter.py and scrape_targets.py against a real Slurm, and the agent's
configuration under promtool and a real Prometheus.

Docker cannot run here (there is no Docker engine), so setup_observability.sh runs in the node
sandbox of test_lifecycle_scripts.py with a stand-in ``docker`` first on PATH. It records every
command line in the sandbox's calls.log, like the other stubs, and keeps only what ``docker
inspect`` must answer: which images were pulled (with a digest made from the reference) and
which containers exist, with their image, spec label and running flag. The tests assert the
command lines and the files the script writes; no container runs. ``nvidia-smi`` is a stub
that lists eight GPUs; ``aws`` answers the remote-write URL parameter and ECR's token call.

The Slurm tests start a real two-node Slurm 22.05 (tests/slurm_harness.py) whose nodes declare
four GPUs each in their Gres (GpuSlurmCluster, below), scrape slurm_exporter.py over HTTP and
parse the text with prometheus_client's parser. The agent test runs Debian's prometheus 2.42
(the Makefile's system package; the nodes run 3.13 with --agent, this one takes
--enable-feature=agent) on the configuration the script wrote, against that exporter, remote-
writing with SigV4 (dummy credentials) to a second prometheus with its remote-write receiver on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ports import free_port  # noqa: E402
from slurm_harness import SlurmCluster, SlurmUnavailable  # noqa: E402
from test_lifecycle_scripts import PARAMS, SCRIPTS, Sandbox, resource_config, sandbox, succeeded  # noqa: E402, F401

ROOT_DIR = SCRIPTS.parent
REMOTE_WRITE_PARAMETER = "/moe-cdk/moe/observability/remote-write-url"
REMOTE_WRITE_URL = (
    "https://aps-workspaces.us-east-2.amazonaws.com/workspaces/ws-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    "/api/v1/remote_write"
)
OBSERVABILITY = {
    "remote_write_url_parameter": REMOTE_WRITE_PARAMETER,
    "scrape_interval_s": 30,
    "trainer_metrics_port": 9090,
}
OBS_PARAMS = {**PARAMS, "fsx_lustre": None, "observability": OBSERVABILITY}
COMPUTE, CONTROLLER, LOGIN = "i-0456", "i-0123", "i-0789"  # gpu-1, controller-1, login-1 in resource_config()
FAMILIES = {
    "moe_slurm_up",
    "moe_slurm_nodes",
    "moe_slurm_jobs",
    "moe_slurm_node_gpus_total",
    "moe_slurm_node_gpus_allocated",
    "moe_slurm_account_gpus",
}

# The stand-in docker: state under $MOE_STUB_STATE/docker (images: "REF DIGEST" lines; one file per
# container: "IMAGE SPEC RUNNING"). MOE_STUB_DOCKER_PULL_FAILURES makes the first pulls fail;
# MOE_STUB_DOCKER_DIGEST replaces the digest a pull reports.
DOCKER_STUB = r"""
state="${MOE_STUB_STATE}/docker"
mkdir -p "${state}/containers"
touch "${state}/images"
last="${!#}"
case "$1" in
  login) cat >/dev/null ;;
  pull)
    count=$(( $(cat "${state}/pulls" 2>/dev/null || echo 0) + 1 ))
    echo "${count}" >"${state}/pulls"
    if [ "${count}" -le "${MOE_STUB_DOCKER_PULL_FAILURES:-0}" ]; then
      echo "Error response from daemon: toomanyrequests" >&2
      exit 1
    fi
    case "${last}" in
      *@*) digest="${last#*@}" ;;
      *) digest="sha256:$(printf '%s' "${last}" | sha256sum | cut -c1-64)" ;;
    esac
    echo "${last} ${MOE_STUB_DOCKER_DIGEST:-${digest}}" >>"${state}/images"
    echo "${last}" ;;
  image)
    line="$(grep -F -- "${last} " "${state}/images" | head -n 1)"
    [ -n "${line}" ] || { echo "Error: No such image: ${last}" >&2; exit 1; }
    ref="${last%@*}"
    echo "${ref%:*}@${line##* }" ;;
  inspect)
    [ -f "${state}/containers/${last}" ] || { echo "Error: No such object: ${last}" >&2; exit 1; }
    cat "${state}/containers/${last}" ;;
  rm) rm -f "${state}/containers/${last}" ;;
  run)
    shift
    name="" spec="" image=""
    while [ "$#" -gt 0 ]; do
      case "$1" in
        -d) ;;
        --name) name="$2"; shift ;;
        --label) case "$2" in moe-cdk.spec=*) spec="${2#moe-cdk.spec=}" ;; esac; shift ;;
        --restart|--net|--pid|-v|--gpus|--cap-add) shift ;;
        *) image="$1"; break ;;
      esac
      shift
    done
    echo "${image} ${spec} true" >"${state}/containers/${name}"
    echo "0123456789abcdef" ;;
esac
"""
AWS_STUB = rf"""
case "$1 $2" in
  "ecr get-login-password") echo "ecr-token" ;;
  "ssm get-parameter")
    name=""
    while [ "$#" -gt 0 ]; do [ "$1" = --name ] && name="$2"; shift; done
    if [ "${{name}}" = "{REMOTE_WRITE_PARAMETER}" ]; then echo "${{MOE_STUB_REMOTE_WRITE_URL:-{REMOTE_WRITE_URL}}}";
    else echo "An error occurred (ParameterNotFound)" >&2; exit 254; fi ;;
  *) exit 254 ;;
esac
"""
NVIDIA_SMI_STUB = r"""
[ "$1" = -L ] || exit 0
for i in 0 1 2 3 4 5 6 7; do echo "GPU ${i}: NVIDIA H200 (UUID: GPU-0000000${i}-0000-0000-0000-000000000000)"; done
"""


def stub(box: Sandbox, name: str, body: str) -> None:
    path = box.bin / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"${{MOE_STUB_CALLS}}"\n{body}')
    path.chmod(0o755)


def obs_sandbox(base: Path, instance_id: str = COMPUTE, params: dict | None = None, gpus: bool = True) -> Sandbox:
    """A node sandbox with observability on, the stand-in docker, and nvidia-smi when ``gpus``."""
    box = Sandbox(base, instance_id=instance_id, params=OBS_PARAMS if params is None else params)
    stub(box, "docker", DOCKER_STUB)
    stub(box, "aws", AWS_STUB)
    if gpus:
        stub(box, "nvidia-smi", NVIDIA_SMI_STUB)
    return box


def setup(box: Sandbox, **extra: str) -> subprocess.CompletedProcess:
    return box.run("bash", str(box.lc / "setup_observability.sh"), **extra)


def pins(manifest: Path = SCRIPTS / "observability_images.txt", region: str = "us-east-2") -> dict:
    """NAME -> image reference, read from the manifest the way a reader of it would."""
    found = {}
    for line in manifest.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, image, tag, digest = line.split()
            found[name] = image.replace("{region}", region) + ":" + tag + ("" if digest == "-" else "@" + digest)
    return found


def docker_runs(box: Sandbox, since: int = 0) -> dict:
    """Container name -> (docker-run options other than the spec label, image, image args) of each
    `docker run` among the docker calls after the first ``since``."""
    runs = {}
    takes_value = {"--restart", "--name", "--label", "--net", "--pid", "-v", "--gpus", "--cap-add"}
    for line in box.calls("docker")[since:]:
        if not line.startswith("docker run "):
            continue
        words = line.split()[2:]
        options, index = [], 0
        while index < len(words) and words[index].startswith("-"):
            width = 2 if words[index] in takes_value else 1
            options.append(" ".join(words[index : index + width]))
            index += width
        name = next(o.split()[1] for o in options if o.startswith("--name "))
        options = [o for o in options if not o.startswith(("--name ", "--label moe-cdk.spec="))]
        runs[name] = (options, words[index], words[index + 1 :])
    return runs


# ---- node_info.py: the observability parameters ----------------------------------------------


def check(box: Sandbox, params: dict) -> subprocess.CompletedProcess:
    box.write_params(params)
    return box.node_info("--check", str(box.lc / "provisioning_parameters.json"))


@pytest.mark.parametrize("observability", [OBSERVABILITY, {**OBSERVABILITY, "trainer_metrics_port": None}, None])
def test_check_accepts_observability(sandbox, observability):
    assert succeeded(check(sandbox, {**PARAMS, "observability": observability})).stdout.startswith("OK: ")


@pytest.mark.parametrize(
    "change, line",
    [
        (
            {"remote_write_url_parameter": "moe-cdk/url"},
            "observability.remote_write_url_parameter: invalid (got 'moe-cdk/url'; allowed an SSM parameter name "
            "starting with '/')",
        ),
        (
            {"scrape_interval_s": 1},
            "observability.scrape_interval_s: invalid (got 1; allowed an integer number of seconds from 5 to 300)",
        ),
        (
            {"scrape_interval_s": "30"},
            "observability.scrape_interval_s: invalid (got '30'; allowed an integer number of seconds from 5 to 300)",
        ),
        (
            {"trainer_metrics_port": 9100},
            "observability.trainer_metrics_port: invalid (got 9100; allowed a port from 1024 to 65535 other than the "
            "exporters' 9100, 9109, 9400, or null)",
        ),
        (
            {"trainer_metrics_port": True},
            "observability.trainer_metrics_port: invalid (got true; allowed a port from 1024 to 65535 other than the "
            "exporters' 9100, 9109, 9400, or null)",
        ),
        (
            {"trainer_metrics_port": 80},
            "observability.trainer_metrics_port: invalid (got 80; allowed a port from 1024 to 65535 other than the "
            "exporters' 9100, 9109, 9400, or null)",
        ),
    ],
)
def test_check_rejects_bad_observability_values(sandbox, change, line):
    result = check(sandbox, {**PARAMS, "observability": {**OBSERVABILITY, **change}})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [line]


def test_check_rejects_missing_and_unknown_observability_keys(sandbox):
    observability = {"remote_write_url_parameter": REMOTE_WRITE_PARAMETER, "scrape_interval_s": 30, "port": 1}
    result = check(sandbox, {**PARAMS, "observability": observability})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "observability.trainer_metrics_port: missing (got nothing; allowed a port from 1024 to 65535 other than the "
        "exporters' 9100, 9109, 9400, or null)",
        "observability: unknown key (got 'port'; allowed remote_write_url_parameter, scrape_interval_s, "
        "trainer_metrics_port)",
    ]


def test_check_rejects_observability_that_is_not_an_object(sandbox):
    result = check(sandbox, {**PARAMS, "observability": "on"})
    assert result.stderr.splitlines() == [
        "observability: invalid (got 'on'; allowed an object with keys remote_write_url_parameter, scrape_interval_s, "
        "trainer_metrics_port or null)"
    ]


def test_check_rejects_observability_on_eks(tmp_path):
    params = json.loads((Path(__file__).resolve().parents[1] / "fixtures/eks_provisioning_parameters.json").read_text())
    box = Sandbox(tmp_path, params=params)
    result = check(box, {**params, "observability": OBSERVABILITY})
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith('observability: not used on EKS (got {"remote_write_url_parameter": ')
    assert line.endswith("; allowed null when workload_manager is 'eks')")


def params_lines(box: Sandbox) -> list[str]:
    result = succeeded(box.node_info("--params", str(box.lc / "provisioning_parameters.json")))
    return [line for line in result.stdout.splitlines() if line.startswith("OBSERVABILITY_")]


def test_params_prints_the_observability_settings(sandbox):
    sandbox.write_params(OBS_PARAMS)
    assert params_lines(sandbox) == [
        "OBSERVABILITY_ENABLED=true",
        f"OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER={REMOTE_WRITE_PARAMETER}",
        "OBSERVABILITY_SCRAPE_INTERVAL_S=30",
        "OBSERVABILITY_TRAINER_METRICS_PORT=9090",
    ]


def test_params_prints_an_empty_trainer_port_for_null(sandbox):
    sandbox.write_params({**OBS_PARAMS, "observability": {**OBSERVABILITY, "trainer_metrics_port": None}})
    assert "OBSERVABILITY_TRAINER_METRICS_PORT=" in params_lines(sandbox)


def test_params_reads_a_missing_observability_key_as_null(sandbox):
    assert "observability" not in PARAMS
    assert params_lines(sandbox) == [
        "OBSERVABILITY_ENABLED=false",
        "OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER=",
        "OBSERVABILITY_SCRAPE_INTERVAL_S=",
        "OBSERVABILITY_TRAINER_METRICS_PORT=",
    ]


# ---- setup_observability.sh: static checks and the null path ---------------------------------


def test_setup_observability_parses_and_passes_shellcheck():
    script = str(SCRIPTS / "setup_observability.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True, check=False).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the Makefile installs it for `make test`)")
    result = subprocess.run([shellcheck, "-x", script], cwd=ROOT_DIR, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_null_observability_is_skipped_on_a_real_on_create_run(tmp_path):
    box = obs_sandbox(tmp_path, params={**OBS_PARAMS, "observability": None})
    result = succeeded(box.on_create())
    assert "[observability] observability is null in provisioning_parameters.json; skipped" in result.stdout
    assert "[observability] step finished in" in box.read("var/log/provision/moe-cdk-lifecycle.log")
    assert box.calls("docker") == [] and box.calls("aws") == [] and box.calls("systemctl") == []
    assert not (box.root / "etc/moe-cdk").exists() and not (box.root / "opt/moe-cdk").exists()


# ---- setup_observability.sh: compute and login nodes -----------------------------------------


def _compute_node(base: Path) -> Sandbox:
    """Compute node gpu-1 with eight GPUs and an EFA device, set up once through on_create.sh."""
    box = obs_sandbox(base)
    succeeded(box.on_create())
    return box


@pytest.fixture(scope="module")
def compute_run(tmp_path_factory) -> Sandbox:
    """The compute node of the tests that only read what its setup did."""
    return _compute_node(tmp_path_factory.mktemp("compute"))


@pytest.fixture
def compute_box(tmp_path) -> Sandbox:
    """A compute node of its own, for a test that runs the setup again."""
    return _compute_node(tmp_path)


def test_compute_node_runs_the_three_pinned_exporters(compute_run):
    images = pins()
    host = f"{compute_run.root}/:/host:ro,rslave"
    assert docker_runs(compute_run) == {
        "node-exporter": (
            ["-d", "--restart always", "--net host", "--pid host", f"-v {host}"],
            images["node_exporter"],
            ["--path.rootfs=/host"],
        ),
        "dcgm-exporter": (
            [
                "-d",
                "--restart always",
                "--net host",
                "--gpus all",
                "--cap-add SYS_ADMIN",
                f"-v {compute_run.root}/run/slurm/dcgm-job-mapping:/etc/dcgm-exporter/hpc:ro",
            ],
            images["dcgm_exporter"],
            ["--hpc-job-mapping-dir", "/etc/dcgm-exporter/hpc"],
        ),
        "efa-exporter": (
            ["-d", "--restart always", "--net host", "--pid host", f"-v {host}"],
            images["efa_exporter"],
            ["--path.rootfs=/host", "--web.listen-address=:9109"],
        ),
    }


def test_dcgm_without_a_job_mapping_prolog_warns_that_gpu_series_have_no_job(compute_run):
    log = compute_run.read("var/log/provision/moe-cdk-lifecycle.log")
    assert "WARNING: no Slurm prolog under /opt/slurm/etc/prolog.d or /opt/slurm/etc/scripts names" in log


@pytest.mark.parametrize(
    ("prolog", "folder"),
    [
        # HyperPod's AMI (OnInitComplete), as AWS's observability extension README names it.
        ("opt/slurm/etc/prolog.d/700_dcgm_job_map_register.sh", "/run/slurm/dcgm-job-mapping"),
        # AWS's base-config prolog.sh, installed by its start_slurm.sh (OnCreate).
        ("opt/slurm/etc/scripts/prolog.sh", "/run/slurm/dcgm_job_mapping"),
    ],
)
def test_dcgm_reads_the_job_mapping_folder_the_nodes_prolog_writes(tmp_path, prolog, folder):
    # Finding 7: GPU series carried no Slurm job. AWS's sources name the folder two ways.
    box = obs_sandbox(tmp_path)
    box.write(prolog, f'#!/bin/bash\nJOB_ID_MAP_DIR="{folder}"\necho "$SLURM_JOB_ID" >>"$JOB_ID_MAP_DIR/$GPU"\n')
    result = succeeded(box.on_create())
    options, _, args = docker_runs(box)["dcgm-exporter"]
    assert f"-v {box.root}{folder}:/etc/dcgm-exporter/hpc:ro" in options
    assert args == ["--hpc-job-mapping-dir", "/etc/dcgm-exporter/hpc"]
    assert (box.root / folder.lstrip("/")).is_dir() and "names a DCGM job mapping" not in result.stdout


def test_compute_node_pulls_from_hyperpods_registry_after_an_ecr_login(compute_run):
    registry = "602401143452.dkr.ecr.us-east-2.amazonaws.com"
    assert compute_run.calls("docker pull") == [
        f"docker pull --quiet {pins()[name]}" for name in ("node_exporter", "dcgm_exporter", "efa_exporter")
    ]
    assert compute_run.calls("docker login") == [f"docker login --username AWS --password-stdin {registry}"] * 3
    assert compute_run.calls("aws") == ["aws ecr get-login-password --region us-east-2"] * 3


def test_compute_node_records_the_pulled_digests(compute_run):
    lines = compute_run.read("var/lib/moe-cdk/observability/images").splitlines()
    assert [line.split()[:2] for line in lines] == [
        [name, pins()[name]] for name in ("node_exporter", "dcgm_exporter", "efa_exporter")
    ]
    for line in lines:
        _, ref, digest = line.split()
        assert re.fullmatch(re.escape(ref.rsplit(":", 1)[0]) + "@sha256:[0-9a-f]{64}", digest)
        assert f"has digest {digest}" in compute_run.read("var/log/provision/moe-cdk-lifecycle.log")


def test_second_run_leaves_running_exporters_alone(compute_box):
    calls = len(compute_box.calls("docker"))
    result = succeeded(setup(compute_box))
    new = compute_box.calls("docker")[calls:]
    assert [c for c in new if c.startswith(("docker run", "docker rm", "docker pull", "docker login"))] == []
    assert result.stdout.count("already runs") == 3
    assert result.stdout.count("is already pulled") == 3


def test_a_new_pin_replaces_the_container(compute_box):
    manifest = compute_box.lc / "observability_images.txt"
    manifest.write_text(manifest.read_text().replace("v1.9.1", "v1.9.2"))
    calls = len(compute_box.calls("docker"))
    result = succeeded(setup(compute_box))
    new = compute_box.calls("docker")[calls:]
    image = pins(manifest)["node_exporter"]
    assert image.endswith("/hyperpod/node_exporter:v1.9.2")
    assert [c.split()[:2] + c.split()[-1:] for c in new if c.startswith(("docker pull", "docker rm"))] == [
        ["docker", "pull", image],
        ["docker", "rm", "node-exporter"],
    ]
    runs = docker_runs(compute_box, since=calls)
    assert list(runs) == ["node-exporter"] and runs["node-exporter"][1] == image
    assert "replacing container node-exporter" in result.stdout


def test_a_stopped_exporter_is_started_again(compute_box):
    container = compute_box.state / "docker/containers/efa-exporter"
    container.write_text(container.read_text().replace(" true", " false"))
    calls = len(compute_box.calls("docker"))
    succeeded(setup(compute_box))
    assert list(docker_runs(compute_box, since=calls)) == ["efa-exporter"]


def test_compute_node_without_gpus_or_efa_runs_node_exporter_only(tmp_path):
    box = obs_sandbox(tmp_path, gpus=False)
    shutil.rmtree(box.root / "sys/class/infiniband")
    result = succeeded(setup(box))
    assert list(docker_runs(box)) == ["node-exporter"]
    assert "nvidia-smi -L lists no GPU on this ml.p5en.48xlarge node: no DCGM exporter" in result.stdout
    assert "no EFA device under" in result.stdout


def test_failed_pulls_are_retried(tmp_path):
    box = obs_sandbox(tmp_path)
    result = succeeded(setup(box, MOE_STUB_DOCKER_PULL_FAILURES="2"))
    assert "attempt 2/5 failed (exit 1): docker_pull 602401143452.dkr.ecr.us-east-2.amazonaws.com/" in result.stdout
    assert len(box.calls("docker pull")) == 5  # 3 for node_exporter, then dcgm and efa


def test_a_pinned_digest_that_docker_does_not_report_fails(tmp_path):
    box = obs_sandbox(tmp_path)
    manifest = box.lc / "observability_images.txt"
    digest = "sha256:" + "a" * 64
    manifest.write_text(re.sub(r"(node_exporter\s+\S+\s+v1\.9\.1\s+)-", rf"\g<1>{digest}", manifest.read_text()))
    result = setup(box, MOE_STUB_DOCKER_DIGEST="sha256:" + "b" * 64)
    assert result.returncode != 0
    assert f"hyperpod/node_exporter:v1.9.1@{digest}: Docker reports digests" in result.stdout
    assert f"not the pinned {digest}" in result.stdout
    assert box.calls("docker run") == []


def test_login_node_runs_node_exporter_only(tmp_path):
    box = obs_sandbox(tmp_path, instance_id=LOGIN)
    succeeded(setup(box))
    assert list(docker_runs(box)) == ["node-exporter"]
    assert box.calls("systemctl") == [] and not box.calls("aws ssm")
    # Scraped from the controller's agent, so on every interface (as on compute nodes).
    assert docker_runs(box)["node-exporter"][2] == ["--path.rootfs=/host"]


# ---- setup_observability.sh: the controller --------------------------------------------------

AGENT_CONFIG = "etc/moe-cdk/prometheus/agent.yml"


def expected_agent_config(interval_s: int, jobs: tuple[str, ...]) -> str:
    scrape = "".join(
        f"  - job_name: {job}\n    file_sd_configs:\n"
        f"      - files: [targets/{job}.json]\n        refresh_interval: 1m\n"
        for job in jobs
    )
    return (
        "# Written by moe-cdk's setup_observability.sh; the next run replaces it.\n"
        "# Prometheus in agent mode: scrape every node's exporters, remote-write to Amazon Managed\n"
        "# Service for Prometheus (SigV4 with the instance's credentials).\n"
        f"global:\n  scrape_interval: {interval_s}s\nscrape_configs:\n{scrape}"
        f"remote_write:\n  - url: {REMOTE_WRITE_URL}\n    sigv4:\n      region: us-east-2\n"
    )


def _controller(base: Path) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """Controller controller-1 (stub scontrol: no Slurm nodes), set up once through on_create.sh."""
    box = obs_sandbox(base, instance_id=CONTROLLER, gpus=False)
    return box, succeeded(box.on_create())


@pytest.fixture(scope="module")
def controller_run(tmp_path_factory) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """The controller of the tests that only read what its setup did."""
    return _controller(tmp_path_factory.mktemp("controller"))


@pytest.fixture
def controller_box(tmp_path) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """A controller of its own, for a test that runs the setup again."""
    return _controller(tmp_path)


def test_controller_writes_the_agent_config(controller_run):
    box, _ = controller_run
    assert box.read(AGENT_CONFIG) == expected_agent_config(30, ("node", "dcgm", "efa", "slurm", "moe-trainer"))


def test_agent_config_without_a_trainer_port_has_no_trainer_job(tmp_path):
    box = obs_sandbox(tmp_path, instance_id=CONTROLLER, gpus=False)
    box.write_params({**OBS_PARAMS, "observability": {**OBSERVABILITY, "trainer_metrics_port": None}})
    succeeded(setup(box))
    assert box.read(AGENT_CONFIG) == expected_agent_config(30, ("node", "dcgm", "efa", "slurm"))
    assert not (box.root / "etc/moe-cdk/prometheus/targets/moe-trainer.json").exists()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # Debian's prometheus package, which the Makefile's system packages include
        install = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", "prometheus"]
        subprocess.run(install, capture_output=True, check=False)
        found = shutil.which("promtool")
    assert found, "promtool is needed: `make system-packages` installs Debian's prometheus package"
    return found


def test_agent_config_passes_promtool(controller_run):
    box, _ = controller_run
    result = subprocess.run(
        [promtool(), "check", "config", str(box.root / AGENT_CONFIG)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "WARNING" not in result.stdout + result.stderr


def test_controller_reads_the_remote_write_url_from_ssm(controller_run):
    box, _ = controller_run
    assert box.calls("aws ssm") == [
        f"aws ssm get-parameter --name {REMOTE_WRITE_PARAMETER} --query Parameter.Value --output text "
        "--region us-east-2"
    ]


def test_controller_runs_the_pinned_prometheus_agent(controller_run):
    box, _ = controller_run
    options, image, args = docker_runs(box)["prometheus-agent"]
    assert image == pins()["prometheus"]
    config_hash = hashlib.sha256((box.root / AGENT_CONFIG).read_bytes()).hexdigest()[:16]
    assert options == [
        "-d",
        "--restart always",
        "--net host",
        f"--label moe-cdk.config={config_hash}",
        f"-v {box.root}/etc/moe-cdk/prometheus:/etc/moe-cdk/prometheus:ro",
        f"-v {box.root}/var/lib/moe-cdk/prometheus-agent:/prometheus",
    ]
    assert args == [
        "--agent",
        "--config.file=/etc/moe-cdk/prometheus/agent.yml",
        "--storage.agent.path=/prometheus",
        "--web.listen-address=127.0.0.1:9095",
    ]
    assert (box.root / "var/lib/moe-cdk/prometheus-agent").stat().st_uid == 65534


def test_controller_runs_node_exporter_but_no_gpu_or_efa_exporter(controller_run):
    box, _ = controller_run
    assert sorted(docker_runs(box)) == ["node-exporter", "prometheus-agent"]


def test_controller_listeners_are_on_loopback_only(controller_run):
    """Every listener on the controller has one scraper, the agent beside it on the host network: the
    node exporter, the Slurm exporter and the agent's own web server take 127.0.0.1, and the targets the
    agent scrapes name the same addresses."""
    box, _ = controller_run
    runs = docker_runs(box)
    assert runs["node-exporter"][2] == ["--path.rootfs=/host", "--web.listen-address=127.0.0.1:9100"]
    assert "--web.listen-address=127.0.0.1:9095" in runs["prometheus-agent"][2]
    assert " --listen-address 127.0.0.1:9341\n" in box.read("etc/systemd/system/moe-cdk-slurm-exporter.service")
    node_targets = json.loads(box.read("etc/moe-cdk/prometheus/targets/node.json"))
    assert [t["targets"] for t in node_targets if t["labels"]["node"] == "ip-10-0-64-10"] == [["127.0.0.1:9100"]]
    assert json.loads(box.read("etc/moe-cdk/prometheus/targets/slurm.json"))[0]["targets"] == ["127.0.0.1:9341"]


def test_controller_installs_and_starts_the_exporter_and_the_timer(controller_run):
    box, _ = controller_run
    assert box.calls("systemctl") == [
        "systemctl daemon-reload",
        "systemctl enable --now moe-cdk-slurm-exporter.service",
        "systemctl restart moe-cdk-slurm-exporter.service",
        "systemctl enable --now moe-cdk-scrape-targets.timer",
    ]
    install = box.root / "opt/moe-cdk/observability"
    unit = box.read("etc/systemd/system/moe-cdk-slurm-exporter.service")
    assert f" {install}/slurm_exporter.py --listen-address 127.0.0.1:9341\n" in unit
    assert "Environment=PATH=/opt/slurm/bin:" in unit
    service = box.read("etc/systemd/system/moe-cdk-scrape-targets.service")
    assert (
        f" {install}/scrape_targets.py --params {install}/provisioning_parameters.json --resource-config "
        f"{box.root}/opt/ml/config/resource_config.json --out {box.root}/etc/moe-cdk/prometheus/targets "
        "--slurm-exporter-address 127.0.0.1:9341 --controller-node-exporter-address 127.0.0.1:9100\n"
    ) in service
    assert "OnUnitActiveSec=60s" in box.read("etc/systemd/system/moe-cdk-scrape-targets.timer")
    assert (install / "slurm_exporter.py").read_bytes() == (SCRIPTS / "slurm_exporter.py").read_bytes()


def test_controller_targets_list_the_controller_and_login_nodes(controller_run):
    box, _ = controller_run
    targets = json.loads(box.read("etc/moe-cdk/prometheus/targets/node.json"))
    assert targets == [
        {"labels": {"instance_type": "ml.m5.2xlarge", "node": "ip-10-0-64-10"}, "targets": ["127.0.0.1:9100"]},
        {"labels": {"instance_type": "ml.m5.2xlarge", "node": "ip-10-0-64-12"}, "targets": ["10.0.64.12:9100"]},
    ]
    assert json.loads(box.read("etc/moe-cdk/prometheus/targets/slurm.json")) == [
        {"labels": {"instance_type": "ml.m5.2xlarge", "node": "ip-10-0-64-10"}, "targets": ["127.0.0.1:9341"]}
    ]


def test_controller_second_run_changes_nothing(controller_box):
    box, _ = controller_box
    config = box.read(AGENT_CONFIG)
    calls = len(box.calls())
    result = succeeded(setup(box))
    new = box.calls()[calls:]
    assert [
        c for c in new if c.startswith(("docker run", "docker pull", "systemctl restart", "systemctl daemon"))
    ] == []
    assert box.read(AGENT_CONFIG) == config
    assert f"{box.root / AGENT_CONFIG} is already up to date" in result.stdout


def test_a_new_scrape_interval_replaces_the_agent(controller_box):
    box, _ = controller_box
    box.write_params({**OBS_PARAMS, "observability": {**OBSERVABILITY, "scrape_interval_s": 60}})
    calls = len(box.calls("docker"))
    succeeded(setup(box))
    assert "  scrape_interval: 60s\n" in box.read(AGENT_CONFIG)
    assert list(docker_runs(box, since=calls)) == ["prometheus-agent"]


@pytest.mark.parametrize(
    "url, message",
    [
        (
            "https://example.com/api/v1/remote_write",
            "remote-write URL: invalid (got 'https://example.com/api/v1/remote_write' from "
            f"{REMOTE_WRITE_PARAMETER}; allowed https://aps-workspaces.REGION.amazonaws.com/workspaces/ws-ID/api/v1/"
            "remote_write)",
        ),
        (
            REMOTE_WRITE_URL.replace("us-east-2", "eu-west-1"),
            "remote-write URL: workspace in eu-west-1, but the cluster's region is us-east-2",
        ),
    ],
)
def test_a_bad_remote_write_url_stops_the_controller(tmp_path, url, message):
    box = obs_sandbox(tmp_path, instance_id=CONTROLLER, gpus=False)
    result = box.on_create(MOE_STUB_REMOTE_WRITE_URL=url)
    assert result.returncode != 0
    assert message in result.stdout
    assert "step:        observability" in result.stderr
    assert "prometheus-agent" not in docker_runs(box)
    assert not (box.root / AGENT_CONFIG).exists()


# ---- setup_observability.sh on ParallelCluster -----------------------------------------------

# Ubuntu's apt-get as far as docker.io goes: installing it puts the stand-in docker on PATH.
APT_DOCKER_IO_STUB = r"""
case " $* " in
  *" install docker.io "*) cp -- "${MOE_STUB_STATE}/docker.io" "$(dirname "$0")/docker" ;;
esac
"""


def parallelcluster_obs_sandbox(base: Path, *, docker: bool) -> tuple[Sandbox, dict]:
    """A ParallelCluster node with observability on (no resource_config.json), and the environment its step runs
    in: without ``docker``, a PATH on which no docker is found until apt-get installs docker.io."""
    box = obs_sandbox(base, params={**OBS_PARAMS, "cluster_manager": "parallelcluster"})
    (box.root / "opt/ml/config/resource_config.json").unlink()
    env = {}
    if not docker:
        shutil.copy(box.bin / "docker", box.state / "docker.io")
        stub(box, "apt-get", APT_DOCKER_IO_STUB)
        env["PATH"] = box.without("docker")
    return box, env


def test_a_parallelcluster_node_without_docker_installs_ubuntus_docker_io_then_its_exporters(tmp_path):
    box, env = parallelcluster_obs_sandbox(tmp_path, docker=False)
    result = succeeded(setup(box, MOE_LC_NODE_GROUP="gpu", **env))
    assert "docker is not installed (ParallelCluster's AMIs ship none): installing Ubuntu's docker.io" in result.stdout
    assert box.calls("apt-get") == [
        "apt-get -y -q -o DPkg::Lock::Timeout=120 update",
        "apt-get -y -q -o DPkg::Lock::Timeout=120 install docker.io",
    ]
    assert "systemctl enable --now docker.service" in box.calls("systemctl")
    assert sorted(docker_runs(box)) == ["dcgm-exporter", "efa-exporter", "node-exporter"]


def test_a_parallelcluster_node_with_docker_installs_nothing(tmp_path):
    box, env = parallelcluster_obs_sandbox(tmp_path, docker=True)
    succeeded(setup(box, MOE_LC_NODE_GROUP="gpu", **env))
    assert box.calls("apt-get") == [] and sorted(docker_runs(box)) == ["dcgm-exporter", "efa-exporter", "node-exporter"]


def test_a_hyperpod_node_without_docker_stops_in_one_line_and_installs_nothing(tmp_path):
    box = obs_sandbox(tmp_path)
    result = setup(box, PATH=box.without("docker"))
    assert result.returncode != 0
    assert "docker is not installed: HyperPod's AMI-based configuration installs it" in result.stderr
    assert box.calls("apt-get") == []


def test_the_parallelcluster_head_node_names_itself_and_reads_no_resource_config(tmp_path):
    box, env = parallelcluster_obs_sandbox(tmp_path, docker=True)
    succeeded(setup(box, MOE_LC_NODE_GROUP="controller", **env))
    assert "--resource-config" not in box.read("etc/systemd/system/moe-cdk-scrape-targets.service")
    head = {"instance_type": "unknown", "node": socket.gethostname().split(".")[0]}
    targets = box.root / "etc/moe-cdk/prometheus/targets"
    assert json.loads((targets / "node.json").read_text()) == [{"labels": head, "targets": ["127.0.0.1:9100"]}]
    assert json.loads((targets / "slurm.json").read_text()) == [{"labels": head, "targets": ["127.0.0.1:9341"]}]


def test_nodes_with_no_instance_behind_them_are_not_scraped():
    # ParallelCluster's dynamic nodes while powered down carry their own name as NodeAddr.
    lines = "\n".join(
        f"NodeName={name} NodeAddr={address} State={state} Partitions=gpu"
        for name, address, state in (
            ("gpu-st-1", "10.0.64.21", "IDLE"),
            ("gpu-dy-1", "gpu-dy-1", "IDLE+CLOUD+POWERED_DOWN"),
            ("gpu-dy-2", "10.0.64.22", "ALLOCATED+CLOUD+POWERING_UP"),
            ("gpu-dy-3", "10.0.64.23", "MIXED+CLOUD"),
        )
    )
    slurm_exporter, scrape_targets = load_script("slurm_exporter"), load_script("scrape_targets")
    targets = scrape_targets.build_targets(
        slurm_exporter.parse_nodes(lines), TARGETS_PARAMS, None, "127.0.0.1:9341", controller_node="head"
    )
    assert [t["labels"]["node"] for t in targets["node.json"]] == ["head", "gpu-dy-3", "gpu-st-1"]


# ---- slurm_exporter.py and scrape_targets.py on a real Slurm ---------------------------------


class GpuSlurmCluster(SlurmCluster):
    """The harness's cluster with four GPUs (type h100) in each node's Gres. slurmd wants one
    device file per GPU, so empty files stand in for /dev/nvidia0-3 (gres.conf File=). This
    overrides the harness's slurm.conf writer, adding GresTypes=gpu and Gres=gpu:h100:4 to what it
    writes. Without slurmdbd, Slurm does not track gres/gpu in AllocTRES, so the allocated count
    comes from GresUsed here."""

    def _slurm_conf(self) -> str:
        text = super()._slurm_conf()
        devices = self.dir / "gpu-devices"
        devices.mkdir()
        for index in range(4):
            (devices / f"nvidia{index}").touch()
        (self.conf.parent / "gres.conf").write_text(f"Name=gpu Type=h100 File={devices}/nvidia[0-3]\n")
        text = text.replace("ClusterName=moeci\n", "ClusterName=moeci\nGresTypes=gpu\n")
        return text.replace(" State=UNKNOWN", " Gres=gpu:h100:4 State=UNKNOWN")


@pytest.fixture(scope="module")
def gpu_slurm():
    try:
        with GpuSlurmCluster() as cluster:
            yield cluster
    except SlurmUnavailable as error:
        pytest.fail(f"a real Slurm is needed for this test: {error}")


@pytest.fixture
def slurm(gpu_slurm):
    """The module's cluster with no jobs and both nodes idle again."""
    jobs = gpu_slurm.run("squeue", "-h", "-o", "%i").stdout.split()
    if jobs:
        gpu_slurm.run("scancel", *jobs)
    deadline = time.monotonic() + 60
    while not gpu_slurm._nodes_idle() or gpu_slurm.run("squeue", "-h", "-o", "%i").stdout.strip():
        assert time.monotonic() < deadline, gpu_slurm.log_tail(20)
        time.sleep(0.5)
    return gpu_slurm


def get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.headers["Content-Type"], response.read().decode()


class Exporter:
    """slurm_exporter.py as a process on a free port, with the given environment."""

    def __init__(self, env: dict, tmp: Path, *args: str):
        self.port = free_port()
        self.log = tmp / f"exporter-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(SCRIPTS / "slurm_exporter.py"),
                    "--listen-address",
                    f"127.0.0.1:{self.port}",
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                get(self.url)
                return
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.2)

    def scrape(self) -> dict:
        """(family, sample name, sorted labels) -> value, and the families' types under (family, "TYPE")."""
        _, text = get(self.url)
        found = {}
        for family in text_string_to_metric_families(text):
            found[(family.name, "TYPE")] = family.type
            for s in family.samples:
                found[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return found

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def exporter(slurm, tmp_path):
    running = Exporter(slurm.env, tmp_path)
    yield running
    running.stop()


def nodes(scrape: dict, state: str, partition: str = "ci") -> float | None:
    return scrape.get(("moe_slurm_nodes", (("partition", partition), ("state", state))))


def jobs(scrape: dict, state: str, partition: str = "ci") -> float | None:
    return scrape.get(("moe_slurm_jobs", (("partition", partition), ("state", state))))


def test_exporter_counts_two_idle_nodes(exporter):
    scrape = exporter.scrape()
    assert scrape[("moe_slurm_up", ())] == 1
    assert nodes(scrape, "idle") == 2
    assert [key for key in scrape if key[0] == "moe_slurm_nodes" and key[1] != "TYPE"] == [
        ("moe_slurm_nodes", (("partition", "ci"), ("state", "idle")))
    ]


def test_exporter_exports_exactly_six_gauges_in_text_format_0_0_4(exporter):
    content_type, text = get(exporter.url)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    types = {key[0]: value for key, value in exporter.scrape().items() if key[1] == "TYPE"}
    assert types == dict.fromkeys(FAMILIES, "gauge")
    for family in FAMILIES:
        assert f"# HELP {family} " in text and f"# TYPE {family} gauge\n" in text


def test_exporter_zero_fills_running_and_pending_jobs(exporter):
    scrape = exporter.scrape()
    assert jobs(scrape, "running") == 0 and jobs(scrape, "pending") == 0


def test_exporter_counts_running_and_pending_jobs(slurm, exporter, tmp_path):
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    running = slurm.submit(script, ["-N1", "-n1", f"--output={tmp_path}/%j.out"])
    held = slurm.submit(script, ["-N1", "-n1", "--hold", f"--output={tmp_path}/%j.out"])
    slurm.wait_for(running, {"RUNNING"}, timeout=60)
    assert slurm.job_state(held).state == "PENDING"
    scrape = exporter.scrape()
    assert jobs(scrape, "running") == 1 and jobs(scrape, "pending") == 1
    assert nodes(scrape, "mixed") == 1 and nodes(scrape, "idle") == 1


def test_exporter_reports_gpus_from_gres_and_their_allocation(slurm, exporter, tmp_path):
    script = tmp_path / "gpu.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    job = slurm.submit(script, ["-N1", "-n1", "--gres=gpu:h100:3", "--account=research", f"--output={tmp_path}/%j.out"])
    slurm.wait_for(job, {"RUNNING"}, timeout=60)
    node = slurm.job_state(job).fields["NodeList"]
    scrape = exporter.scrape()
    for name in ("node1", "node2"):
        assert scrape[("moe_slurm_node_gpus_total", (("node", name),))] == 4
        assert scrape[("moe_slurm_node_gpus_allocated", (("node", name),))] == (3 if name == node else 0)
    # A team's GPUs: its account's running jobs, nodes x GPUs per node.
    assert scrape[("moe_slurm_account_gpus", (("account", "research"), ("state", "running")))] == 3


def test_exporter_reports_down_when_slurm_cannot_be_reached(slurm, tmp_path):
    # Without its slurm.conf, Slurm 22.05's sinfo looks for a configless controller and hangs: the
    # scrape's time budget ends it, and the other two commands are not started.
    down = Exporter({**slurm.env, "SLURM_CONF": str(tmp_path / "missing.conf")}, tmp_path, "--command-timeout-s", "2")
    try:
        scrape = down.scrape()
    finally:
        down.stop()
    assert scrape[("moe_slurm_up", ())] == 0
    assert [key for key in scrape if key[1] != "TYPE" and key[0] != "moe_slurm_up"] == []
    log = down.log.read_text()
    assert "sinfo --noheader --Node --format=%N|%R|%T failed: Command" in log and "timed out" in log
    assert "scontrol not run: the scrape's time budget is spent" in log


def test_exporter_reports_down_when_sinfo_alone_fails(slurm, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (bin_dir / "sinfo").chmod(0o755)
    broken = Exporter({**slurm.env, "PATH": f"{bin_dir}{os.pathsep}{slurm.env['PATH']}"}, tmp_path)
    try:
        scrape = broken.scrape()
    finally:
        broken.stop()
    assert scrape[("moe_slurm_up", ())] == 0
    assert not [key for key in scrape if key[0] == "moe_slurm_nodes" and key[1] != "TYPE"]
    assert scrape[("moe_slurm_node_gpus_total", (("node", "node1"),))] == 4  # scontrol still answered


def load_script(name: str):
    """A lifecycle Python script as a module, without leaving __pycache__ in lifecycle_scripts/."""
    previous, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = previous


@pytest.mark.parametrize(
    "gres, gpus",
    [
        ("gpu:8(S:0-1)", 8),
        ("gpu:h100:2(IDX:0,2),gpu:a100:1(IDX:3)", 3),
        ("gpu", 1),
        ("gpu:h100", 1),
        ("(null)", 0),
        ("N/A", 0),
        ("nic:2,gpu:4", 4),
    ],
)
def test_gres_gpu_counts(gres, gpus):
    """Gres and GresUsed values in the forms scontrol(1) and Slurm's gres.html document."""
    assert load_script("slurm_exporter").gres_gpus(gres) == gpus


@pytest.mark.parametrize(
    "tres, gpus",
    [
        ("cpu=4,mem=8G,gres/gpu=2,gres/gpu:h100=2", 2),  # untyped count wins over the typed one
        ("cpu=4,gres/gpu:h100=2,gres/gpu:a100=1", 3),
        ("cpu=4,mem=8G", None),
        ("", None),
    ],
)
def test_alloc_tres_gpu_counts(tres, gpus):
    """AllocTRES as Slurm's tres.html writes TRES lists (gres/gpu, gres/gpu:TYPE)."""
    assert load_script("slurm_exporter").tres_gpus(tres) == gpus


def test_alloc_tres_is_preferred_over_gres_used():
    line = (
        "NodeName=n1 NodeAddr=10.0.0.1 Gres=gpu:8(S:0-1) GresUsed=gpu:1(IDX:0) AllocTRES=cpu=8,gres/gpu=2 State=MIXED"
    )
    [node] = load_script("slurm_exporter").parse_nodes(line)
    assert (node.gpus_total, node.gpus_allocated) == (8, 2)


@pytest.mark.parametrize(
    "state, base", [("idle", "idle"), ("down*", "down"), ("idle~", "idle"), ("DRAINED", "drained")]
)
def test_node_state_drops_sinfo_suffixes(state, base):
    assert load_script("slurm_exporter").node_state(state) == base


TARGETS_PARAMS = {
    **OBS_PARAMS,
    "worker_groups": [
        {"instance_group_name": "gpu", "partition_name": "ci", "instance_type": "ml.p5en.48xlarge", "features": []}
    ],
}


def scrape_targets(slurm: SlurmCluster, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    params = tmp_path / "params.json"
    params.write_text(json.dumps(TARGETS_PARAMS))
    resource = tmp_path / "resource_config.json"
    resource.write_text(json.dumps(resource_config()))
    out = tmp_path / "targets"
    result = subprocess.run(
        [sys.executable, "-B", str(SCRIPTS / "scrape_targets.py"), "--params", str(params), "--resource-config",
         str(resource), "--out", str(out)],
        env={**slurm.env, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result, out


def labelled(address: str, node: str, instance_type: str = "ml.p5en.48xlarge") -> dict:
    return {"labels": {"instance_type": instance_type, "node": node}, "targets": [address]}


def test_scrape_targets_list_every_node_for_node_exporter(slurm, tmp_path):
    result, out = scrape_targets(slurm, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "node.json").read_text()) == [
        labelled("127.0.0.1:9100", "ip-10-0-64-10", "ml.m5.2xlarge"),  # the controller's own, on loopback
        labelled("10.0.64.12:9100", "ip-10-0-64-12", "ml.m5.2xlarge"),
        labelled("127.0.0.1:9100", "node1"),
        labelled("127.0.0.1:9100", "node2"),
    ]


def test_scrape_targets_list_gpu_efa_and_trainer_targets_of_slurm_nodes(slurm, tmp_path):
    result, out = scrape_targets(slurm, tmp_path)
    assert result.returncode == 0, result.stderr
    for name, port in (("dcgm.json", 9400), ("efa.json", 9109), ("moe-trainer.json", 9090)):
        assert json.loads((out / name).read_text()) == [
            labelled(f"127.0.0.1:{port}", "node1"),
            labelled(f"127.0.0.1:{port}", "node2"),
        ], name


def test_scrape_targets_keep_the_files_when_scontrol_fails(slurm, tmp_path):
    result, out = scrape_targets(slurm, tmp_path)
    before = (out / "node.json").read_text()
    # A slurm.conf scontrol cannot use makes it fail at once. (Without one, Slurm looks for a configless controller
    # in DNS and waits out the resolver; the time budget that ends such a hang is slurm_exporter.Slurm's, which
    # test_exporter_reports_down_when_slurm_cannot_be_reached checks.)
    (broken := tmp_path / "broken.conf").write_text("")
    result, _ = scrape_targets(slurm, tmp_path, SLURM_CONF=str(broken))
    assert result.returncode == 1
    assert "scontrol failed; the target files" in result.stderr
    assert (out / "node.json").read_text() == before


# ---- the agent: the written configuration, run by a real Prometheus --------------------------


def start_prometheus(tmp_path: Path, name: str, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is needed: `make system-packages` installs Debian's prometheus package"
    port = free_port()
    log = open(tmp_path / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [prometheus, f"--web.listen-address=127.0.0.1:{port}", *args],
        stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ),
    )  # fmt: skip
    log.close()
    return proc, port


def query(port: int, expression: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    _, text = get(url)
    return json.loads(text)["data"]["result"]


def test_agent_remote_writes_slurm_metrics_to_a_receiver(slurm, exporter, tmp_path):
    """The configuration setup_observability.sh wrote on the controller, with one change: the AMP
    URL becomes the local receiver's. Its targets are rewritten by scrape_targets.py from the
    real Slurm, pointed at this test's exporter with --slurm-exporter-address."""
    box = obs_sandbox(tmp_path / "node", instance_id=CONTROLLER, gpus=False)
    box.write_params({**OBS_PARAMS, "observability": {**OBSERVABILITY, "scrape_interval_s": 5}})
    succeeded(setup(box))
    install = box.root / "opt/moe-cdk/observability"
    targets = box.root / "etc/moe-cdk/prometheus/targets"
    rewrite = subprocess.run(
        [sys.executable, "-B", str(install / "scrape_targets.py"),
         "--params", str(install / "provisioning_parameters.json"),
         "--resource-config", str(box.root / "opt/ml/config/resource_config.json"), "--out", str(targets),
         "--slurm-exporter-address", f"127.0.0.1:{exporter.port}"],
        env=slurm.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rewrite.returncode == 0, rewrite.stderr
    receiver_data = tmp_path / "receiver"
    receiver_config = tmp_path / "receiver.yml"
    receiver_config.write_text("global: {}\n")
    receiver, receiver_port = start_prometheus(
        tmp_path, "receiver", f"--config.file={receiver_config}", f"--storage.tsdb.path={receiver_data}",
        "--web.enable-remote-write-receiver",
    )  # fmt: skip
    written = (box.root / AGENT_CONFIG).read_text()
    assert f"  - url: {REMOTE_WRITE_URL}\n" in written
    config = box.root / "etc/moe-cdk/prometheus/agent-test.yml"  # beside agent.yml: same relative target paths
    config.write_text(written.replace(REMOTE_WRITE_URL, f"http://127.0.0.1:{receiver_port}/api/v1/write"))
    credentials = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy-secret-for-sigv4"}
    agent, _ = start_prometheus(
        tmp_path, "agent", "--enable-feature=agent", f"--config.file={config}",
        f"--storage.agent.path={tmp_path / 'agent'}", env={**os.environ, **credentials},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            try:
                found = query(receiver_port, "moe_slurm_up")
            except OSError:
                found = []
            if found:
                break
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()[-3000:]
            time.sleep(1)
        [series] = found
        assert series["value"][1] == "1"
        assert series["metric"] == {
            "__name__": "moe_slurm_up",
            "instance": f"127.0.0.1:{exporter.port}",
            "instance_type": "ml.m5.2xlarge",
            "job": "slurm",
            "node": "ip-10-0-64-10",
        }
        [idle] = query(receiver_port, 'moe_slurm_nodes{state="idle"}')
        assert idle["value"][1] == "2"
    finally:
        for proc in (agent, receiver):
            proc.terminate()
            proc.wait(timeout=30)


def test_account_gpus_count_nodes_times_gpus_per_node_for_running_and_pending_jobs():
    count_account_gpus = load_script("slurm_exporter").count_account_gpus
    lines = "gpu|RUNNING|research|2|gres:gpu:8\ngpu|PENDING|prod|1|gres/gpu:h100:4\ngpu|RUNNING|prod|1|N/A\n"
    assert count_account_gpus(lines + "gpu|COMPLETING|research|2|gres:gpu:8\n") == {
        ("research", "running"): 16,
        ("prod", "pending"): 4,
        ("prod", "running"): 0,
    }
