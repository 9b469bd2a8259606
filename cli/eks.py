"""``moe-cdk eks render``: the Kubernetes training job (a Kubeflow PyTorchJob, a
HyperPodPyTorchJob, or values for charts/moe-training) for a compute group of an EKS configuration."""

from __future__ import annotations

import argparse
import sys

from moe_cdk.cli.report import emit, report
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.jobs.eks_job import (
    helm_values,
    job_spec_from_config,
    pod_template,
    render_hyperpod_job,
    render_profile_config_map,
    render_pytorchjob,
    to_yaml,
)
from moe_cdk.jobs.node_pools import node_pool, node_pool_objects, unplaceable_reasons
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.rules.eks import TERMINATION_GRACE_S
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema.config import Orchestrator, load_config, require_orchestrator
from moe_cdk.tools.plan import grace_period_note, plan, termination_grace_s


def _neuron(args: argparse.Namespace, config) -> tuple[str, str]:
    """The NxD Training PyTorchJob and its configuration's ConfigMap for a Trainium configuration."""
    from moe_cdk.jobs.neuron_job import eks_spec, neuron_run, render_neuron_pytorchjob

    unsupported = [
        problem(reason, got=flag, allowed="a Kubeflow PyTorchJob (without it)").at(flag)
        for flag, given, reason in (
            ("--hyperpod", args.hyperpod, "the HyperPod training operator starts moe-train's agent, not NxD Training"),
            ("--helm-values", args.helm_values, "charts/moe-training runs moe-train"),
        )
        if given
    ]
    if unsupported:
        raise ConfigError(unsupported)
    run = neuron_run(
        config,
        load_job_profile(config, args.train_config, args.train_arg),
        group=args.group,
        nodes=args.nodes,
        name=args.name,
    )
    spec = eks_spec(
        config,
        run,
        image=args.image,
        backoff_limit=args.backoff_limit,
        preflight=args.preflight,
        team=args.team,
        qos=args.qos,
    )
    if problems := spec.problems():
        raise ConfigError(problems)
    job = render_neuron_pytorchjob(spec, run)
    summary = (
        f"ConfigMap {spec.profile_config_map} and NxD Training PyTorchJob {spec.name}, {spec.nodes} pod(s) x "
        f"{spec.devices_per_node} {spec.device_resource} ({run.spec.ranks_per_node} ranks), {spec.efa_per_node} EFA"
    )
    return to_yaml(render_profile_config_map(spec), job), summary


def _refused(args: argparse.Namespace, key: str, what: str, got: object, allowed: str) -> int:
    """Report the one problem with ``key`` (an option or a configuration key) against the configuration; 2."""
    return report(args.config, ConfigError([problem(what, got=got, allowed=allowed).at(key)]))


def _termination_grace(config, args: argparse.Namespace) -> int:
    """The pods' grace period: ``--termination-grace``, else what ``plan`` sizes for a stop of this profile on
    this cluster (the rest of a step and a checkpoint save). One line on stderr when a given period is
    shorter than that stop."""
    try:
        stop_s = plan(config, train_config_path=args.train_config).stop_s
    except ConfigError:
        return args.termination_grace or TERMINATION_GRACE_S  # the profile's own problems are plan's to report
    if args.termination_grace is None:
        return termination_grace_s(stop_s)
    if note := grace_period_note(args.termination_grace, stop_s, "--termination-grace"):
        print(f"warning: {note}", file=sys.stderr)
    return args.termination_grace


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(config, "eks render needs an EKS configuration", Orchestrator.EKS)
        if config.training_stack is TrainingStack.NXDT:
            text, summary = _neuron(args, config)
            return emit(text, args.output, summary)
        spec = job_spec_from_config(
            config,
            profile=load_job_profile(config, args.train_config, args.train_arg),
            image=args.image,
            group=args.group,
            name=args.name,
            nodes=args.nodes,
            train_args=tuple(args.train_arg),
            backoff_limit=args.backoff_limit,
            stall_timeout_s=args.stall_timeout,
            startup_timeout_s=args.startup_timeout,
            preflight=args.preflight,
            team=args.team,
            qos=args.qos,
            termination_grace_s=_termination_grace(config, args),
            nsys_rank=args.nsys_rank,
        )
    except ConfigError as error:
        return report(args.config, error)
    if problems := spec.problems():
        return report(args.config, ConfigError(problems))
    group = config.cluster.compute_group(args.group)
    if group.autoscale and (reasons := unplaceable_reasons(pod_template(spec, [], [])["spec"], node_pool(group))):
        return _refused(args, "--group", "Karpenter could not add a node for these pods", reasons, "a placeable pod")
    if args.helm_values and args.preflight:
        return _refused(
            args, "--preflight", "the chart has no preflight init container", "--helm-values", "a rendered job"
        )
    without_chart = "a rendered job (without --helm-values)"
    if args.helm_values and spec.team:
        what = "the chart does not render the team's queue and priority-class labels"
        return _refused(args, "--helm-values", what, f"--team {spec.team}", without_chart)
    if args.helm_values and spec.fallback_instance_types:
        what = "the chart selects one instance type, and this group's nodes may be any of several"
        return _refused(args, "--helm-values", what, [spec.instance_type, *spec.fallback_instance_types], without_chart)
    if args.helm_values:
        documents, kind = [helm_values(spec, hyperpod=args.hyperpod)], "Helm values"
    else:
        job = render_hyperpod_job(spec) if args.hyperpod else render_pytorchjob(spec)
        documents, kind = (
            [render_profile_config_map(spec), job],
            f"ConfigMap {spec.profile_config_map} and {job['kind']}",
        )
    summary = (
        f"{kind} {spec.name}, {spec.nodes} pod(s) x "
        f"{spec.devices_per_node} {spec.device_resource}, {spec.efa_per_node} EFA"
    )
    return emit(to_yaml(*documents), args.output, summary)


def _node_pools(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(config, "eks node-pools needs an EKS configuration", Orchestrator.EKS)
    except ConfigError as error:
        return report(args.config, error)
    objects = node_pool_objects(config)
    if not objects:
        return _refused(
            args,
            "cluster.instance_groups",
            "no group is autoscaled",
            "autoscale false everywhere",
            "a compute group with autoscale: true",
        )
    groups = ", ".join(o["metadata"]["name"] for o in objects if o["kind"] == "NodePool")
    return emit(to_yaml(*objects), args.output, f"HyperpodNodeClass and NodePool for {groups}")


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register ``eks render`` and ``eks node-pools`` on an argparse subparsers object."""
    eks = subcommands.add_parser("eks", help="HyperPod EKS helpers")
    commands = eks.add_subparsers(dest="eks_command", required=True, metavar="COMMAND")
    parser = commands.add_parser("render", help="write the Kubernetes training job for the compute group")
    parser.add_argument(
        "--config", required=True, help="infrastructure YAML with orchestrator eks, e.g. config/eks-p5en.yaml"
    )
    parser.add_argument("--image", required=True, help="training image URI (the storage stack's TrainingImageUri)")
    parser.add_argument(
        "--train-config",
        metavar="PROFILE.yaml",
        help="the moe-train profile the job runs, a file here; a ConfigMap beside the job carries it to the pods "
        "(default: the configuration's training.profile)",
    )
    parser.add_argument(
        "--hyperpod",
        action="store_true",
        help="render a HyperPodPyTorchJob (HyperPod training operator, log-based hang detection) "
        "instead of a Kubeflow PyTorchJob",
    )
    parser.add_argument("--helm-values", action="store_true", help="print values for charts/moe-training instead")
    parser.add_argument(
        "--team", help="the team the job runs as: its namespace, task-governance queue and default QoS (config teams)"
    )
    parser.add_argument("--qos", help="the QoS tier: its priority class; one of the team's tiers")
    parser.add_argument("--group", help="compute group to run on (default: the first)")
    parser.add_argument("--nodes", type=int, help="pods, one per node (default: the group's instance_count)")
    parser.add_argument("--name", help="job name (default: the training profile's file name)")
    parser.add_argument(
        "--nsys-rank", type=int, help="run the pod of this rank under Nsight Systems where the image has nsys"
    )
    parser.add_argument("--backoff-limit", type=int, default=10, help="restarts after permanent failures (default: 10)")
    parser.add_argument(
        "--startup-timeout",
        type=int,
        default=1800,
        help="seconds allowed until the first metrics record (default: 1800)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=int,
        default=900,
        help="restart a pod whose trainer wrote no metrics record for this many seconds (default: 900)",
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="start each pod with an init container that checks its node's GPUs and EFA (moe-preflight node)",
    )
    parser.add_argument(
        "--termination-grace",
        type=int,
        help="seconds between a pod's SIGTERM and its SIGKILL, for the stop checkpoint "
        "(terminationGracePeriodSeconds; default: plan's stop time and a quarter, in minutes, "
        f"at least {TERMINATION_GRACE_S}; a shorter one is warned about)",
    )
    parser.add_argument("--train-arg", action="append", default=[], help="argument passed to moe-train (repeatable)")
    parser.add_argument("--output", help="write the YAML here instead of stdout")
    parser.set_defaults(run=_run)
    pools = commands.add_parser(
        "node-pools", help="write the Karpenter HyperpodNodeClass and NodePool of each autoscaled group"
    )
    pools.add_argument(
        "--config", required=True, help="infrastructure YAML with orchestrator eks, e.g. config/eks-autoscaling.yaml"
    )
    pools.add_argument("--output", help="write the YAML here instead of stdout")
    pools.set_defaults(run=_node_pools)
    return parser
