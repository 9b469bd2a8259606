"""``moe-cdk verify render``: the preflight job (jobs/preflight_job.py) for a HyperPod configuration, over
the nodes and image its training job uses: an sbatch script on Slurm; on EKS a Kubeflow PyTorchJob and an
MPIJob for nccl-tests, in one file for kubectl apply -f."""

from __future__ import annotations

import argparse

from moe_cdk.cli.report import emit, report, require_image
from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema.config import HYPERPOD, Orchestrator, load_config, require_orchestrator


def _render(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        # SageMaker Training Jobs pick fresh instances for every job: there is no fleet to verify first.
        require_orchestrator(config, "verify render needs a cluster", *HYPERPOD, Orchestrator.PARALLELCLUSTER)
        if config.cluster.orchestrator is Orchestrator.EKS:
            text, summary = _eks(args, config)
        else:
            text, summary = _slurm(args, config)
    except ConfigError as error:
        return report(args.config, error)
    return emit(text, args.output, summary)


def _neuron_job(args: argparse.Namespace, config):
    """The Slurm spec of the NxD Training job whose nodes and image a Trainium preflight checks."""
    from moe_cdk.jobs.neuron_job import slurm_spec

    require_image(args, "a Trainium preflight runs in the Neuron image on the Trainium nodes")
    return slurm_spec(config, _neuron_run(args, config), image=args.image)


def _neuron_run(args: argparse.Namespace, config):
    """The NxD Training run whose nodes a Trainium preflight checks."""
    from moe_cdk.jobs.neuron_job import neuron_run

    return neuron_run(
        config, load_job_profile(config, args.train_config), group=args.group, nodes=args.nodes, name=args.job_name
    )


def _slurm(args: argparse.Namespace, config) -> tuple[str, str]:
    from moe_cdk.jobs.preflight_job import preflight_job, render_preflight_sbatch
    from moe_cdk.jobs.slurm_job import job_spec_from_config

    if config.training_stack is TrainingStack.NXDT:
        job = _neuron_job(args, config)
    else:
        job = job_spec_from_config(
            config,
            profile=load_job_profile(config, args.train_config),
            image=args.image,
            local=args.local,
            python=args.python,
            group=args.group,
            nodes=args.nodes,
            job_name=args.job_name,
            master_port=args.master_port,
        )
    group = config.cluster.compute_group(args.group)
    spec = preflight_job(job, instance_type=group.instance_type, dcgm_level=args.dcgm_level)
    return render_preflight_sbatch(
        spec
    ), f"preflight {spec.job.job_name}, {spec.job.nodes} node(s) of {group.instance_type}"


def _eks(args: argparse.Namespace, config) -> tuple[str, str]:
    from moe_cdk.jobs.eks_job import job_spec_from_config, render_profile_config_map, to_yaml
    from moe_cdk.jobs.preflight_job import render_preflight_mpijob, render_preflight_pytorchjob

    require_image(args, "an EKS preflight runs in the training image on the accelerator nodes")
    if config.training_stack is TrainingStack.NXDT:
        # Each pod checks its node's Neuron and EFA devices; nccom-test across pods is not rendered on EKS
        # (docs/trainium.md): its multi-node launch needs SSH between the pods.
        from moe_cdk.jobs.neuron_job import eks_spec

        spec = eks_spec(config, _neuron_run(args, config), image=args.image)
        if problems := spec.problems():
            raise ConfigError(problems)
        job = render_preflight_pytorchjob(spec)
        return (
            to_yaml(render_profile_config_map(spec), job),
            f"ConfigMap {spec.profile_config_map} and PyTorchJob {job['metadata']['name']} (Neuron and EFA devices), "
            f"{spec.nodes} pod(s) of {spec.instance_type}",
        )
    spec = job_spec_from_config(
        config,
        profile=load_job_profile(config, args.train_config),
        image=args.image,
        group=args.group,
        name=args.job_name,
        nodes=args.nodes,
    )
    if problems := spec.problems():
        raise ConfigError(problems)
    job, nccl = render_preflight_pytorchjob(spec), render_preflight_mpijob(spec)
    return (
        to_yaml(render_profile_config_map(spec), job, nccl),
        f"ConfigMap {spec.profile_config_map}, PyTorchJob {job['metadata']['name']} and MPIJob "
        f"{nccl['metadata']['name']} (nccl-tests), {spec.nodes} pod(s) of {spec.instance_type}",
    )


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register ``verify render`` on an argparse subparsers object."""
    verify = subcommands.add_parser("verify", help="the preflight job that proves GPUs, EFA and NCCL before training")
    commands = verify.add_subparsers(dest="verify_command", required=True, metavar="COMMAND")
    parser = commands.add_parser(
        "render", help="write the preflight for the compute group (sbatch, or PyTorchJob and MPIJob)"
    )
    parser.add_argument("--config", required=True, help="infrastructure YAML, e.g. config/default.yaml")
    parser.add_argument("--image", help="training image URI (the storage stack's TrainingImageUri); not with --local")
    parser.add_argument(
        "--local", action="store_true", help="Slurm CPU cluster: gloo, no GPU, EFA or nccl-tests checks"
    )
    parser.add_argument("--python", default="python3", help="interpreter for --local (default: python3)")
    parser.add_argument("--group", help="compute group (default: the first)")
    parser.add_argument("--nodes", type=int, help="nodes (default: the group's instance_count)")
    parser.add_argument(
        "--train-config",
        metavar="PROFILE.yaml",
        help="the moe-train profile the training job will run, a file here, for the dispatch shape; the job "
        "carries it to the nodes (default: the configuration's training.profile)",
    )
    parser.add_argument(
        "--job-name", help="the training job's name; the preflight adds -preflight (default: the profile's)"
    )
    parser.add_argument(
        "--dcgm-level",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="Slurm: DCGM diagnostics level on each host (default 1)",
    )
    parser.add_argument("--master-port", type=int, default=29500, help="Slurm: rendezvous port (default 29500)")
    parser.add_argument("--output", help="write the preflight here instead of stdout")
    parser.set_defaults(run=_render)
    return parser
