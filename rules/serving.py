"""Serving a trained model on HyperPod EKS through AWS's inference operator: the endpoint's resource, the
workers moe-cdk knows, and the memory a model needs per accelerator. Plain data and arithmetic; no CDK.

Sources (read 2026-12-05):

- [HP-INF-CRD] aws/sagemaker-hyperpod-cli@011ca92, config/crd/inference.sagemaker.aws.amazon.com_
  inferenceendpointconfigs.yaml: ``InferenceEndpointConfig`` v1 requires ``modelName`` (at most 63 letters, digits
  and inner hyphens), ``modelSourceConfig`` and ``worker`` (``image``, ``modelInvocationPort.containerPort``,
  ``modelVolumeMount.name``, ``resources``); ``instanceType`` matches ``^ml\\.``; ``metrics.modelMetrics.port`` is
  1024 to 65535; ``metrics.metricsScrapeIntervalSeconds`` 5 to 300; ``loadBalancer.healthCheckPath`` starts with
  ``/``; ``tlsConfig.tlsCertificateOutputS3Uri`` matches ``^s3://``.
  ``modelSourceConfig.modelSourceType`` is one of fsx, s3, huggingface, kubernetesVolume; ``fsxStorage`` needs
  ``fileSystemId``, ``s3Storage`` needs ``bucketName`` and ``region``; ``metrics.modelMetrics.path`` matches
  ``^/[a-zA-Z0-9\\-_./]*$``. (Read at that commit on 2026-12-05; the file is on GitHub only.)
- [HP-INF-PY] The same fields as the ``sagemaker-hyperpod`` package's pydantic model (PyPI 3.12.0,
  sagemaker/hyperpod/inference/config/hp_endpoint_config.py, ``_HPEndpoint``), which the tests validate with.
- [HP-INF-ACCESS] The managed policy AmazonSageMakerHyperPodInferenceAccess (AWS Managed Policy Reference, v4): S3
  access only to buckets named ``hyperpod-tls*``, and ``iam:PassRole`` only on roles named
  ``SageMakerHyperPodInference*``; the operator's chart refuses any other execution role (aws/sagemaker-hyperpod-cli
  @011ca92, helm_chart/HyperPodHelmChart/charts/inference-operator/templates/_validateRequiredValues.tpl).
- [VLLM] vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server``): ``/health``, ``/metrics`` and
  ``/v1/chat/completions`` on one port; ``--gpu-memory-utilization`` (default 0.9) is the share of each GPU it
  takes for the weights, the activations and the KV cache. The image ``vllm/vllm-openai:v0.12.0`` is on Docker
  Hub (sha256:f2309d91..., the tag cited in SemiAnalysisAI/InferenceX#303).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moe_cdk.core.catalog import InstanceSpec
from moe_cdk.core.problems import Problem, problem

API_VERSION = "inference.sagemaker.aws.amazon.com/v1"
KIND = "InferenceEndpointConfig"
NAMESPACE = "default"
"""Where ``serve render`` puts the endpoint unless told otherwise (the operator watches every namespace)."""
ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MODEL_VOLUME = "model-weights"
MODEL_MOUNT_PATH = "/opt/ml/model"
"""Where the operator mounts the model, its default ([HP-INF-CRD])."""
TLS_BUCKET_PREFIX = "hyperpod-tls"
EXECUTION_ROLE_PREFIX = "SageMakerHyperPodInference"
ACTIVATION_RESERVE_GIB = 2.0
"""Kept per accelerator for the server's activations and CUDA graphs, out of its memory share: an estimate, not
measured here (vLLM measures the real peak in a profiling run at start-up and sizes its KV cache from what is
left)."""


@dataclass(frozen=True, kw_only=True)
class Worker:
    """An inference server image the endpoint can run, and how it is called."""

    name: str
    image: str
    command: tuple[str, ...]
    port: int
    health_path: str
    metrics_path: str
    invocation_path: str
    """The path the load balancer forwards requests to (``invocationEndpoint``)."""
    memory_utilization: float
    """The share of each accelerator's memory the server takes."""

    def args(self, *, served_name: str, tensor: int, context_tokens: int, sequences: int) -> list[str]:
        return [
            f"--model={MODEL_MOUNT_PATH}",
            f"--served-model-name={served_name}",
            f"--port={self.port}",
            f"--tensor-parallel-size={tensor}",
            f"--max-model-len={context_tokens}",
            f"--max-num-seqs={sequences}",
            f"--gpu-memory-utilization={self.memory_utilization}",
        ]


WORKERS = {
    "vllm": Worker(
        name="vllm",
        image="vllm/vllm-openai:v0.12.0",
        command=("python3", "-m", "vllm.entrypoints.openai.api_server"),
        port=8000,
        health_path="/health",
        metrics_path="/metrics",
        invocation_path="v1/chat/completions",
        memory_utilization=0.9,
    ),
}


@dataclass(frozen=True, kw_only=True)
class InferenceMemory:
    """What one accelerator holds to serve a model at tensor parallelism ``tensor``, in GiB."""

    tensor: int
    weights_gib: float
    kv_cache_gib: float
    """The KV cache for ``sequences`` sequences of ``context_tokens`` tokens each."""
    reserve_gib: float
    capacity_gib: float
    """The server's share of the accelerator's memory."""

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.reserve_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib


def kv_bytes_per_token(config: dict, *, tensor: int, element_bytes: int) -> float:
    """KV-cache bytes one token takes on one accelerator, from a Hugging Face ``config.json``.

    Multi-latent attention (DeepSeek-V3: ``kv_lora_rank``) caches one latent of ``kv_lora_rank +
    qk_rope_head_dim`` per token and layer, which every tensor-parallel rank keeps whole. Otherwise each layer
    caches a key and a value per key/value head; tensor parallelism splits the heads, and a rank holds at least one
    (vLLM replicates key/value heads when there are fewer than ranks).
    """
    layers = config["num_hidden_layers"]
    if config.get("kv_lora_rank"):
        return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * element_bytes
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * max(1, kv_heads // tensor) * head_dim * element_bytes


ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def inference_memory(
    config: dict,
    *,
    weight_bytes: int,
    dtype: str,
    tensor: int,
    context_tokens: int,
    sequences: int,
    spec: InstanceSpec,
    worker: Worker,
) -> InferenceMemory:
    """The memory per accelerator to serve a model whose weights take ``weight_bytes`` (the export's safetensors)
    at tensor parallelism ``tensor``, with room in the KV cache for ``sequences`` sequences of ``context_tokens``."""
    element = ELEMENT_BYTES[dtype]
    kv = kv_bytes_per_token(config, tensor=tensor, element_bytes=element) * context_tokens * sequences
    return InferenceMemory(
        tensor=tensor,
        weights_gib=weight_bytes / tensor / 2**30,
        kv_cache_gib=kv / 2**30,
        reserve_gib=ACTIVATION_RESERVE_GIB,
        capacity_gib=spec.accelerator_memory_gib * worker.memory_utilization,
    )


def tensor_sizes(config: dict, spec: InstanceSpec) -> list[int]:
    """The tensor-parallel sizes a server can use on one instance: powers of two up to its accelerators that divide
    the attention heads (vLLM's requirement)."""
    sizes, t = [], 1
    while t <= spec.accelerator_count:
        if config["num_attention_heads"] % t == 0:
            sizes.append(t)
        t *= 2
    return sizes


def choose_tensor(
    config: dict, *, spec: InstanceSpec, **sizing
) -> tuple[InferenceMemory | None, list[InferenceMemory]]:
    """The smallest tensor-parallel size whose memory fits one instance's accelerators (None when none does), and
    the figures of every size tried."""
    tried = [inference_memory(config, tensor=t, spec=spec, **sizing) for t in tensor_sizes(config, spec)]
    return next((m for m in tried if m.fits), None), tried


def endpoint_name_problem(name: str) -> Problem | None:
    if ENDPOINT_NAME.match(name):
        return None
    return problem(
        "not an endpoint name", got=name, allowed="1 to 63 letters, digits and inner hyphens ([HP-INF-CRD] modelName)"
    )


def default_tls_bucket_name(deployment: str, *, account: str, region: str) -> str:
    """The serving TLS bucket of ``deployment`` when ``serving.tls_bucket_name`` names none."""
    return f"{TLS_BUCKET_PREFIX}-{deployment.lower()}-{account}-{region}"


def tls_bucket_problem(name: str) -> Problem | None:
    """Why the operator cannot write certificates to bucket ``name`` ([HP-INF-ACCESS]), or None."""
    if name.startswith(TLS_BUCKET_PREFIX):
        return None
    return problem(
        "the operator may write certificates only to buckets named hyperpod-tls* "
        "(AmazonSageMakerHyperPodInferenceAccess)",
        got=name,
        allowed=f"a bucket name starting with {TLS_BUCKET_PREFIX}",
    )


def execution_role_problem(name: str) -> Problem | None:
    """Why the operator's chart and managed policy refuse execution role ``name`` ([HP-INF-ACCESS]), or None."""
    if name.startswith(EXECUTION_ROLE_PREFIX):
        return None
    return problem(
        "the operator's chart and its managed policy accept only roles named SageMakerHyperPodInference*",
        got=name,
        allowed=f"a role name starting with {EXECUTION_ROLE_PREFIX}",
    )


_MODEL_METRICS_PATH = re.compile(r"^/[a-zA-Z0-9\-_./]*$")
MODEL_SOURCE_TYPES = ("fsx", "s3", "huggingface", "kubernetesVolume")


def crd_problems(endpoint: dict) -> list[Problem]:
    """What the ``InferenceEndpointConfig`` CRD's schema ([HP-INF-CRD]) refuses in ``endpoint``, each at its path: the
    constraints of the fields moe-cdk writes that the pydantic model ([HP-INF-PY]) does not check. The CRD itself is
    published on GitHub only, which the build cannot reach, so its constraints are restated here."""
    found: list[Problem] = []

    def need(ok: bool, path: str, what: str, got: object, allowed: str) -> None:
        if not ok:
            found.append(problem(what, got=got, allowed=allowed).at(path))

    need(
        endpoint.get("apiVersion") == API_VERSION,
        "apiVersion",
        "not the CRD's version",
        endpoint.get("apiVersion"),
        API_VERSION,
    )
    need(endpoint.get("kind") == KIND, "kind", "not the CRD's kind", endpoint.get("kind"), KIND)
    spec = endpoint.get("spec") or {}
    for key in ("modelName", "modelSourceConfig", "worker"):
        need(key in spec, f"spec.{key}", "required", None, "a value")
    name = spec.get("modelName", "")
    need(
        bool(ENDPOINT_NAME.match(str(name))),
        "spec.modelName",
        "not a model name",
        name,
        "1 to 63 letters, digits, inner hyphens",
    )
    if "instanceType" in spec:
        need(
            str(spec["instanceType"]).startswith("ml."),
            "spec.instanceType",
            "not an ml. instance type",
            spec["instanceType"],
            "^ml\\.",
        )
    source = spec.get("modelSourceConfig") or {}
    kind = source.get("modelSourceType")
    need(
        kind in MODEL_SOURCE_TYPES,
        "spec.modelSourceConfig.modelSourceType",
        "unknown source type",
        kind,
        ", ".join(MODEL_SOURCE_TYPES),
    )
    if "fsxStorage" in source:
        need(
            "fileSystemId" in source["fsxStorage"],
            "spec.modelSourceConfig.fsxStorage.fileSystemId",
            "required",
            None,
            "fs-...",
        )
    for key in ("bucketName", "region") if "s3Storage" in source else ():
        need(key in source["s3Storage"], f"spec.modelSourceConfig.s3Storage.{key}", "required", None, "a value")
    worker = spec.get("worker") or {}
    for key in ("image", "modelInvocationPort", "modelVolumeMount", "resources"):
        need(key in worker, f"spec.worker.{key}", "required", None, "a value")
    port = (worker.get("modelInvocationPort") or {}).get("containerPort")
    need(
        isinstance(port, int) and 1 <= port <= 65535,
        "spec.worker.modelInvocationPort.containerPort",
        "not a port",
        port,
        "1 to 65535",
    )
    need(
        "name" in (worker.get("modelVolumeMount") or {}),
        "spec.worker.modelVolumeMount.name",
        "required",
        None,
        "a name",
    )
    uri = (spec.get("tlsConfig") or {}).get("tlsCertificateOutputS3Uri")
    if uri is not None:
        need(
            bool(re.match(r"^s3://([^/]+)/?(.*)$", uri)),
            "spec.tlsConfig.tlsCertificateOutputS3Uri",
            "not an S3 URI",
            uri,
            "s3://bucket/prefix",
        )
    health = (spec.get("loadBalancer") or {}).get("healthCheckPath")
    if health is not None:
        need(
            str(health).startswith("/"),
            "spec.loadBalancer.healthCheckPath",
            "not a path",
            health,
            "a path starting with /",
        )
    metrics = spec.get("metrics") or {}
    if "metricsScrapeIntervalSeconds" in metrics:
        every = metrics["metricsScrapeIntervalSeconds"]
        need(5 <= every <= 300, "spec.metrics.metricsScrapeIntervalSeconds", "out of range", every, "5 to 300")
    model_metrics = metrics.get("modelMetrics") or {}
    if "port" in model_metrics:
        need(
            1024 <= model_metrics["port"] <= 65535,
            "spec.metrics.modelMetrics.port",
            "out of range",
            model_metrics["port"],
            "1024 to 65535",
        )
    if "path" in model_metrics:
        path = model_metrics["path"]
        need(
            bool(_MODEL_METRICS_PATH.match(path)),
            "spec.metrics.modelMetrics.path",
            "not a metrics path",
            path,
            "/ and letters, digits, -_./",
        )
    return found
