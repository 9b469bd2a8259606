"""``moe-cdk serve render``: the inference endpoint of an exported model on a HyperPod EKS cluster (jobs/serve.py).

Exit codes: 0 written, 2 an invalid configuration, export or option (one line per problem, each naming it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moe_cdk.cli.report import emit, report
from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.eks_job import to_yaml
from moe_cdk.jobs.serve import FSX_ROOT, SOURCES, render_endpoint, serve_spec
from moe_cdk.rules import serving
from moe_cdk.schema.config import Orchestrator, load_config, require_orchestrator
from moe_cdk.training.checkpoints.export_marker import read_export


def _render(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(config, "serve render needs an EKS configuration", Orchestrator.EKS)
        spec = serve_spec(
            config,
            read_export(Path(args.model), key="--model"),
            worker=args.worker,
            source=args.source,
            group=args.group,
            name=args.name,
            namespace=args.namespace,
            file_system_id=args.file_system_id,
            bucket=args.bucket,
            tls_bucket=args.tls_bucket,
            mount=args.mount,
            context_tokens=args.context,
            sequences=args.sequences,
            replicas=args.replicas,
            max_replicas=args.max_replicas,
            prometheus_url=args.prometheus_url,
        )
    except ConfigError as error:
        return report(args.config, error)
    endpoint = render_endpoint(spec)
    if found := serving.crd_problems(endpoint):  # what AWS's CRD would refuse at kubectl apply
        return report(args.config, ConfigError(found))
    m = spec.memory
    summary = (
        f"InferenceEndpointConfig {spec.name} on {spec.instance_type}, tensor parallel {m.tensor}: "
        f"{m.weights_gib:.1f} GiB of weights + {m.kv_cache_gib:.1f} GiB of KV cache + {m.reserve_gib:.1f} GiB reserve "
        f"of {m.capacity_gib:.1f} GiB per GPU"
    )
    return emit(to_yaml(endpoint), args.output, summary)


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register ``serve render`` on an argparse subparsers object."""
    serve = subcommands.add_parser("serve", help="serve an exported model on HyperPod EKS")
    commands = serve.add_subparsers(dest="serve_command", required=True, metavar="COMMAND")
    parser = commands.add_parser("render", help="write the InferenceEndpointConfig for an export-hf folder")
    parser.add_argument("--config", required=True, help="infrastructure YAML with orchestrator eks")
    parser.add_argument("--model", required=True, help="the export-hf folder, with its moe-export.json")
    parser.add_argument(
        "--mount", default=str(FSX_ROOT), help=f"where the file system is mounted here (default: {FSX_ROOT})"
    )
    parser.add_argument("--tls-bucket", required=True, help="the bucket the operator writes certificates to")
    parser.add_argument("--source", choices=SOURCES, default="fsx", help="read the model from FSx or S3 (default: fsx)")
    parser.add_argument("--file-system-id", help="with --source fsx: the storage stack's FileSystemId")
    parser.add_argument("--bucket", help="with --source s3: the data bucket (default: storage.data_repository)")
    parser.add_argument("--worker", default="vllm", help=f"inference server: {', '.join(serving.WORKERS)}")
    parser.add_argument("--group", help="compute group to serve on (default: the first)")
    parser.add_argument("--name", help="endpoint and model name (default: the export folder's name)")
    parser.add_argument("--namespace", default=serving.NAMESPACE, help=f"default: {serving.NAMESPACE}")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence, prompt and answer (4096)")
    parser.add_argument("--sequences", type=int, default=16, help="sequences served at once per replica (16)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas, the minimum when autoscaled (1)")
    parser.add_argument("--max-replicas", type=int, help="autoscale up to this many on requests in flight")
    parser.add_argument("--prometheus-url", help="with --max-replicas: the Managed Prometheus workspace's URL")
    parser.add_argument("--output", help="write the YAML here instead of stdout")
    parser.set_defaults(run=_render)
    return parser
