"""The inference endpoint for an exported model on a HyperPod EKS cluster: AWS's ``InferenceEndpointConfig``, which
the HyperPod inference operator turns into the worker pods, a load balancer with TLS, and autoscaling.

``serve_spec(...)`` reads the export (``moe-checkpoint export-hf`` with its completion marker) and the
configuration's compute group, and chooses the tensor-parallel size: the smallest that holds the weights and the KV
cache for the requested context and sequences on the group's accelerators (``rules.serving.choose_tensor``).
``render_endpoint(spec)`` writes the resource. The model is read where training wrote it:

* ``fsx``: straight from the file system, ``modelLocation`` being the export's path under ``/fsx``;
* ``s3``: from the data bucket, after the data repository association has exported the folder; the export must lie
  under an association that exports (``auto_export_events``), and ``modelLocation`` is its S3 prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.rules import serving
from moe_cdk.rules.serving import InferenceMemory, Worker
from moe_cdk.schema.config import Config
from moe_cdk.training.checkpoints.export_marker import Export

FSX_ROOT = PurePosixPath("/fsx")
SOURCES = ("fsx", "s3")


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    """Everything the endpoint resource says."""

    name: str
    namespace: str
    instance_type: str
    worker: Worker
    memory: InferenceMemory
    context_tokens: int
    sequences: int
    source: str
    model_location: str
    file_system_id: str | None
    bucket: str | None
    region: str
    tls_bucket: str
    replicas: int
    max_replicas: int
    prometheus_url: str | None
    scrape_interval_s: int


def _location(export: Export, config: Config, source: str, mount: PurePosixPath, key: str) -> str:
    """The export's path as the operator's model source names it; ``mount`` is where the file system is mounted
    where the export is read (``/fsx`` on the cluster's nodes)."""
    path = PurePosixPath(str(export.folder))
    if not path.is_relative_to(mount):
        found = problem("the export is not on the file system", got=str(path), allowed=f"a folder under {mount}")
        raise ConfigError([found.at(key)])
    relative = path.relative_to(mount)
    if source == "fsx":
        return str(relative)
    for association in config.storage.data_repository.associations:
        root = PurePosixPath(association.file_system_path).relative_to("/")
        if relative.is_relative_to(root) and association.auto_export_events:
            return str(PurePosixPath(association.s3_prefix) / relative.relative_to(root))
    exporting = [
        f"{FSX_ROOT}{a.file_system_path}" for a in config.storage.data_repository.associations if a.auto_export_events
    ]
    raise ConfigError(
        [
            problem(
                "the export lies under no data repository association that exports to S3",
                got=str(path),
                allowed=f"a folder under {', '.join(exporting) or 'an association with auto_export_events'}",
            ).at(key)
        ]
    )


def serve_spec(
    config: Config,
    export: Export,
    *,
    worker: str = "vllm",
    source: str = "fsx",
    group: str | None = None,
    name: str | None = None,
    namespace: str = serving.NAMESPACE,
    file_system_id: str | None = None,
    bucket: str | None = None,
    tls_bucket: str,
    mount: str = str(FSX_ROOT),
    context_tokens: int = 4096,
    sequences: int = 16,
    replicas: int = 1,
    max_replicas: int | None = None,
    prometheus_url: str | None = None,
) -> ServeSpec:
    """The endpoint for ``export`` on ``config``'s compute group ``group``; raises ``ConfigError`` with every problem,
    each named by its command-line option."""
    found: list[Problem] = []
    chosen = config.cluster.compute_group(group)
    spec = catalog.lookup(chosen.instance_type)
    name = name or export.folder.name
    if p := serving.endpoint_name_problem(name):
        found.append(p.at("--name"))
    if worker not in serving.WORKERS:
        found.append(problem("unknown worker", got=worker, allowed=", ".join(serving.WORKERS)).at("--worker"))
    if source not in SOURCES:
        found.append(problem("unknown model source", got=source, allowed=", ".join(SOURCES)).at("--source"))
    if source == "fsx" and not file_system_id:
        found.append(
            problem("needed for an fsx source", got=None, allowed="the storage stack's FileSystemId").at(
                "--file-system-id"
            )
        )
    bucket = bucket or config.storage.data_repository.bucket_name
    if source == "s3" and not bucket:
        found.append(
            problem("needed for an s3 source", got=None, allowed="the storage stack's DataBucketName").at("--bucket")
        )
    if p := serving.tls_bucket_problem(tls_bucket):
        found.append(p.at("--tls-bucket"))
    for key, value in (("--context", context_tokens), ("--sequences", sequences), ("--replicas", replicas)):
        if value < 1:
            found.append(problem("must be at least 1", got=value, allowed="1 or more").at(key))
    max_replicas = replicas if max_replicas is None else max_replicas
    if max_replicas < replicas:
        found.append(
            problem("fewer than --replicas", got=max_replicas, allowed=f"{replicas} or more").at("--max-replicas")
        )
    if max_replicas > replicas and not prometheus_url:
        found.append(
            problem(
                "autoscaling reads the waiting and running requests from Managed Prometheus",
                got=None,
                allowed="the observability stack's workspace query URL",
            ).at("--prometheus-url")
        )
    if spec is None or spec.accelerator_kind is not catalog.AcceleratorKind.NVIDIA_GPU:
        found.append(
            problem(
                "the vLLM worker serves on NVIDIA GPUs",
                got=chosen.instance_type,
                allowed="a compute group of GPU instances",
            ).at("--group")
        )
    location = None
    if source in SOURCES:
        try:
            location = _location(export, config, source, PurePosixPath(mount), "--model")
        except ConfigError as error:
            found += error.problems
    if found:
        raise ConfigError(found)
    memory, tried = serving.choose_tensor(
        export.config,
        spec=spec,
        weight_bytes=export.weight_bytes,
        dtype=export.dtype,
        context_tokens=context_tokens,
        sequences=sequences,
        worker=serving.WORKERS[worker],
    )
    if memory is None:
        figures = ", ".join(f"TP{m.tensor} {m.total_gib:.1f} GiB" for m in tried)
        raise ConfigError(
            [
                problem(
                    f"the model does not fit one {chosen.instance_type} at any tensor-parallel size "
                    f"(per accelerator: {figures}; {tried[-1].capacity_gib:.1f} GiB usable)",
                    got=f"{context_tokens} tokens x {sequences} sequences",
                    allowed="a shorter --context, fewer --sequences, or a group with more accelerator memory",
                ).at("--context")
            ]
        )
    return ServeSpec(
        name=name,
        namespace=namespace,
        instance_type=chosen.instance_type,
        worker=serving.WORKERS[worker],
        memory=memory,
        context_tokens=context_tokens,
        sequences=sequences,
        source=source,
        model_location=location,
        file_system_id=file_system_id,
        bucket=bucket,
        region=config.region,
        tls_bucket=tls_bucket,
        replicas=replicas,
        max_replicas=max_replicas,
        prometheus_url=prometheus_url,
        scrape_interval_s=min(300, config.observability.scrape_interval_s),
    )


def render_endpoint(spec: ServeSpec) -> dict:
    """The ``InferenceEndpointConfig`` (inference.sagemaker.aws.amazon.com/v1) for ``spec``."""
    worker, tensor = spec.worker, spec.memory.tensor
    if spec.source == "fsx":
        source = {"modelSourceType": "fsx", "fsxStorage": {"fileSystemId": spec.file_system_id}}
    else:
        source = {"modelSourceType": "s3", "s3Storage": {"bucketName": spec.bucket, "region": spec.region}}
    endpoint = {
        "modelName": spec.name,
        "endpointName": spec.name,
        "instanceType": spec.instance_type,
        "invocationEndpoint": worker.invocation_path,
        "replicas": spec.replicas,
        "modelSourceConfig": {**source, "modelLocation": spec.model_location},
        "tlsConfig": {"tlsCertificateOutputS3Uri": f"s3://{spec.tls_bucket}/{spec.namespace}/{spec.name}/"},
        "loadBalancer": {"healthCheckPath": worker.health_path},
        "metrics": {
            "enabled": True,
            "metricsScrapeIntervalSeconds": spec.scrape_interval_s,
            "modelMetrics": {"path": worker.metrics_path, "port": worker.port},
        },
        "worker": {
            "image": worker.image,
            "command": list(worker.command),
            "args": worker.args(
                served_name=spec.name, tensor=tensor, context_tokens=spec.context_tokens, sequences=spec.sequences
            ),
            "modelInvocationPort": {"containerPort": worker.port, "name": "http"},
            "modelVolumeMount": {"name": serving.MODEL_VOLUME, "mountPath": serving.MODEL_MOUNT_PATH},
            "resources": {
                "limits": {"nvidia.com/gpu": tensor},
                "requests": {"nvidia.com/gpu": tensor},
            },
        },
    }
    if spec.max_replicas > spec.replicas:
        # One replica per `sequences` requests in flight: vLLM's own gauges of running and waiting requests.
        query = (
            f'sum(vllm:num_requests_running{{model_name="{spec.name}"}}) + '
            f'sum(vllm:num_requests_waiting{{model_name="{spec.name}"}})'
        )
        endpoint["autoScalingSpec"] = {
            "minReplicaCount": spec.replicas,
            "maxReplicaCount": spec.max_replicas,
            "prometheusTrigger": {
                "name": f"{spec.name}-requests",
                "serverAddress": spec.prometheus_url,
                "query": query,
                "targetValue": float(spec.sequences),
                "metricType": "Average",
            },
        }
    return {
        "apiVersion": serving.API_VERSION,
        "kind": serving.KIND,
        "metadata": {"name": spec.name, "namespace": spec.namespace},
        "spec": endpoint,
    }
