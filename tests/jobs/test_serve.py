"""``moe-cdk serve render``: the InferenceEndpointConfig of an exported model, checked with AWS's own model of it.

AWS's model is the ``_HPEndpoint`` pydantic class of the ``sagemaker-hyperpod`` package (the ``hyp`` CLI), which
``make test`` installs without its dependencies into .venv/hyperpod-models; its module imports pydantic alone, so it
is loaded here by its path, without the package's own imports (kubernetes, boto3 and the CLI's).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys

import pydantic
import pytest
import yaml
from conftest import ROOT

from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.serve import render_endpoint, serve_spec
from moe_cdk.rules import serving
from moe_cdk.schema.config import parse_config
from moe_cdk.training.checkpoints.export_marker import EXPORT_MARKER, read_export, write_marker

MODELS = ROOT / ".venv/hyperpod-models/sagemaker/hyperpod/inference/config/hp_endpoint_config.py"
EKS = ROOT / "config/eks-p5en.yaml"
FS_ID = "fs-0123456789abcdef0"
TLS = "hyperpod-tls-moe"
AMP = "https://aps-workspaces.us-east-2.amazonaws.com/workspaces/ws-0123/"
# Mixtral-8x7B's published config.json sizes, and DeepSeek-V2-Lite's latent attention at 16 layers.
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "torch_dtype": "bfloat16",
}
LATENT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_hidden_layers": 16,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
MIXTRAL_BYTES = 93_400_000_000  # 46.7B parameters in bf16


@pytest.fixture(scope="module")
def aws_model():
    assert MODELS.is_file(), "run make test: it installs sagemaker-hyperpod's models into .venv/hyperpod-models"
    loaded = importlib.util.spec_from_file_location("hp_endpoint_config", MODELS)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module._HPEndpoint


def make_export(folder, config: dict, weight_bytes: int):
    """An export-hf folder: config.json, sparse safetensors of ``weight_bytes`` in 5 GB shards, and the marker."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    shards = -(-weight_bytes // 5_000_000_000)
    for i in range(shards):
        with open(folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as shard:
            shard.truncate(min(5_000_000_000, weight_bytes - i * 5_000_000_000))
    write_marker(folder, family=config["model_type"], architecture=config["architectures"][0], dtype="bfloat16", step=9)
    return folder


@pytest.fixture
def fsx(tmp_path):
    return tmp_path / "fsx"


@pytest.fixture
def mixtral(fsx):
    return read_export(make_export(fsx / "checkpoints/mixtral/hf-9", MIXTRAL, MIXTRAL_BYTES), key="--model")


def _config(instance_type: str = "ml.p5en.48xlarge"):
    data = yaml.safe_load(EKS.read_text())
    data["cluster"]["instance_groups"][1]["instance_type"] = instance_type
    return parse_config(data)


def _render(export, fsx, **options) -> dict:
    options = {"file_system_id": FS_ID, "tls_bucket": TLS, "mount": str(fsx), **options}
    return render_endpoint(serve_spec(options.pop("config", None) or _config(), export, **options))


@pytest.mark.parametrize(
    "options",
    [{}, {"source": "s3", "bucket": "moe-data-bucket"}, {"max_replicas": 4, "prometheus_url": AMP}],
    ids=["fsx", "s3", "autoscaled"],
)
def test_the_endpoint_is_valid_for_awss_model(aws_model, mixtral, fsx, options):
    endpoint = _render(mixtral, fsx, **options)
    assert (endpoint["apiVersion"], endpoint["kind"]) == (
        "inference.sagemaker.aws.amazon.com/v1",
        "InferenceEndpointConfig",
    )
    aws_model.model_validate(endpoint["spec"])


def test_every_key_of_the_spec_is_one_awss_model_has(aws_model, mixtral, fsx):
    # _HPEndpoint ignores unknown top-level keys (extra="ignore"), where the CRD's structural schema would prune them.
    spec = _render(mixtral, fsx, max_replicas=2, prometheus_url=AMP)["spec"]
    assert set(spec) <= set(aws_model.model_fields)


def _broken(spec: dict, change) -> dict:
    spec = copy.deepcopy(spec)
    change(spec)
    return spec


BROKEN = {
    "no image": (lambda s: s["worker"].pop("image"), "worker.image\n  Field required"),
    "unknown source": (lambda s: s["modelSourceConfig"].update(modelSourceType="nfs"), "modelSourceType"),
    "misspelt field": (lambda s: s["worker"].update(modelInvocationPorts=s["worker"]["modelInvocationPort"]), "Extra"),
    "s3 without region": (lambda s: s["modelSourceConfig"]["s3Storage"].pop("region"), "s3Storage.region"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_endpoint_fails_awss_model_with_its_message(aws_model, mixtral, fsx, case):
    change, message = BROKEN[case]
    spec = _broken(_render(mixtral, fsx, source="s3", bucket="moe-data-bucket")["spec"], change)
    with pytest.raises(pydantic.ValidationError, match=message):
        aws_model.model_validate(spec)


@pytest.mark.parametrize(
    "options",
    [{}, {"source": "s3", "bucket": "moe-data-bucket"}, {"max_replicas": 4, "prometheus_url": AMP}],
    ids=["fsx", "s3", "autoscaled"],
)
def test_the_endpoint_meets_the_crds_constraints(mixtral, fsx, options):
    assert serving.crd_problems(_render(mixtral, fsx, **options)) == []


CRD_BROKEN = {
    "instance type": (lambda s: s.update(instanceType="p5en.48xlarge"), "spec.instanceType"),
    "tls uri": (lambda s: s["tlsConfig"].update(tlsCertificateOutputS3Uri="https://certs"), "spec.tlsConfig"),
    "source type": (lambda s: s["modelSourceConfig"].update(modelSourceType="nfs"), "spec.modelSourceConfig"),
    "metrics port": (lambda s: s["metrics"]["modelMetrics"].update(port=80), "spec.metrics.modelMetrics.port"),
}


@pytest.mark.parametrize("case", CRD_BROKEN)
def test_what_the_crd_refuses_is_named_by_its_path(mixtral, fsx, case):
    change, path = CRD_BROKEN[case]
    endpoint = _render(mixtral, fsx)
    change(endpoint["spec"])
    assert any(p.key.startswith(path) for p in serving.crd_problems(endpoint))


def test_the_model_source_is_its_path_on_the_file_system(mixtral, fsx):
    source = _render(mixtral, fsx)["spec"]["modelSourceConfig"]
    assert source == {
        "modelSourceType": "fsx",
        "fsxStorage": {"fileSystemId": FS_ID},
        "modelLocation": "checkpoints/mixtral/hf-9",
    }


def test_an_s3_source_is_the_exporting_associations_prefix(mixtral, fsx):
    source = _render(mixtral, fsx, source="s3", bucket="moe-data-bucket")["spec"]["modelSourceConfig"]
    assert source["s3Storage"] == {"bucketName": "moe-data-bucket", "region": "us-east-2"}
    assert source["modelLocation"] == "checkpoints/mixtral/hf-9"  # the /checkpoints association's prefix


def test_an_export_under_an_association_that_does_not_export_is_refused_for_s3(fsx):
    export = read_export(make_export(fsx / "datasets/hf-9", MIXTRAL, MIXTRAL_BYTES), key="--model")
    with pytest.raises(ConfigError, match=r"--model: the export lies under no data repository association"):
        _render(export, fsx, source="s3", bucket="moe-data-bucket")


def test_the_smallest_tensor_parallel_size_that_holds_weights_and_kv_cache_is_chosen(mixtral, fsx):
    # 87 GiB of weights fit one H200 (118 GiB usable); an A100's 67 GiB needs two.
    h200 = serve_spec(_config(), mixtral, file_system_id=FS_ID, tls_bucket=TLS, mount=str(fsx)).memory
    a100 = serve_spec(_config("ml.p4de.24xlarge"), mixtral, file_system_id=FS_ID, tls_bucket=TLS, mount=str(fsx)).memory
    assert (h200.tensor, a100.tensor) == (1, 2)
    assert a100.weights_gib == pytest.approx(MIXTRAL_BYTES / 2 / 2**30)
    # 2 (key, value) x 32 layers x 8 heads / 2 ranks x 128 wide x 2 bytes, for 4,096 tokens x 16 sequences.
    assert a100.kv_cache_gib == pytest.approx(2 * 32 * 4 * 128 * 2 * 4096 * 16 / 2**30)


def test_a_longer_context_takes_more_accelerators(mixtral, fsx):
    spec = serve_spec(
        _config(), mixtral, file_system_id=FS_ID, tls_bucket=TLS, mount=str(fsx), context_tokens=32768, sequences=32
    )
    assert spec.memory.tensor == 2 and spec.memory.fits
    assert _render(mixtral, fsx, context_tokens=32768, sequences=32)["spec"]["worker"]["resources"]["limits"] == {
        "nvidia.com/gpu": 2
    }


def test_latent_attention_caches_one_latent_per_token_and_layer_on_every_rank():
    per_token = serving.kv_bytes_per_token(LATENT, tensor=4, element_bytes=2)
    assert per_token == 16 * (512 + 64) * 2


def test_a_model_no_instance_holds_is_refused_with_the_figures(mixtral, fsx):
    with pytest.raises(ConfigError, match=r"--context: the model does not fit one ml.p5en.48xlarge .*TP8") as error:
        serve_spec(
            _config(), mixtral, file_system_id=FS_ID, tls_bucket=TLS, mount=str(fsx), context_tokens=10**6, sequences=64
        )
    assert len(error.value.problems) == 1


def test_a_tls_bucket_the_operator_may_not_write_is_refused(mixtral, fsx):
    with pytest.raises(ConfigError, match=r"--tls-bucket: the operator may write certificates only to buckets named"):
        _render(mixtral, fsx, tls_bucket="my-certificates")


def test_autoscaling_without_a_prometheus_workspace_is_refused(mixtral, fsx):
    with pytest.raises(ConfigError, match=r"--prometheus-url: autoscaling reads"):
        _render(mixtral, fsx, max_replicas=3)


def test_the_autoscaler_keeps_sequences_requests_in_flight_per_replica(mixtral, fsx):
    scaling = _render(mixtral, fsx, max_replicas=4, prometheus_url=AMP, sequences=8)["spec"]["autoScalingSpec"]
    assert (scaling["minReplicaCount"], scaling["maxReplicaCount"]) == (1, 4)
    assert scaling["prometheusTrigger"]["targetValue"] == 8.0
    assert 'vllm:num_requests_waiting{model_name="hf-9"}' in scaling["prometheusTrigger"]["query"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moe_cdk.cli.main", "serve", "render", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_serve_render_writes_the_endpoint(aws_model, mixtral, fsx, tmp_path):
    out = tmp_path / "endpoint.yaml"
    done = _cli("--config", str(EKS), "--model", str(mixtral.folder), "--mount", str(fsx), "--file-system-id", FS_ID,
                "--tls-bucket", TLS, "--output", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tensor parallel 1" in done.stdout
    aws_model.model_validate(yaml.safe_load(out.read_text())["spec"])


def test_an_export_without_its_marker_is_refused_in_one_line_naming_it(mixtral, fsx):
    (mixtral.folder / EXPORT_MARKER).unlink()
    done = _cli("--config", str(EKS), "--model", str(mixtral.folder), "--mount", str(fsx), "--file-system-id", FS_ID,
                "--tls-bucket", TLS)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"  --model: no {EXPORT_MARKER}: not a finished moe-checkpoint export-hf folder" in done.stderr


def test_an_export_whose_files_are_not_all_there_is_refused(mixtral):
    shard = next(mixtral.folder.glob("*.safetensors"))
    os.truncate(shard, 1000)  # a copy or an S3 export still under way
    with pytest.raises(ConfigError, match=rf"--model: the files differ .*{shard.name} has 1000 bytes"):
        read_export(mixtral.folder, key="--model")


def test_serve_render_refuses_a_slurm_configuration(mixtral, fsx):
    done = _cli("--config", str(ROOT / "config/default.yaml"), "--model", str(mixtral.folder), "--mount", str(fsx),
                "--file-system-id", FS_ID, "--tls-bucket", TLS)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "serve render needs an EKS configuration" in done.stderr


def test_the_hybrid_serving_cluster_reads_an_export_of_the_training_cluster_from_its_bucket(aws_model, mixtral, fsx):
    # Rendered on the Slurm cluster, where export-hf wrote the folder; the bucket is moe-train's DataBucketName.
    config = parse_config(yaml.safe_load((ROOT / "config/hybrid-serve-eks.yaml").read_text()))
    bucket = "moe-data-123456789012-us-east-2-moe-train"
    endpoint = _render(mixtral, fsx, config=config, source="s3", bucket=bucket)
    source = endpoint["spec"]["modelSourceConfig"]
    assert (source["s3Storage"]["bucketName"], source["modelLocation"]) == (bucket, "checkpoints/mixtral/hf-9")
    aws_model.model_validate(endpoint["spec"])
