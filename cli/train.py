"""``moe-train``: the trainer's command line, the container's entry point; ``moe-train plot`` draws a run's metrics."""

from __future__ import annotations

import logging
import sys

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError


def _configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("megatron", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _plot(argv: list[str]) -> int:
    """``moe-train plot METRICS.jsonl``: the run's loss and expert load as a PNG (training/metrics_plot.py)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="moe-train plot", description="Plot a run's metrics.jsonl: loss, the experts' load, imbalance."
    )
    parser.add_argument("metrics", metavar="METRICS.jsonl", help="the file metrics.file names")
    parser.add_argument("--output", help="the PNG to write (default: METRICS.png beside the file)")
    parser.add_argument(
        "--window", type=int, help="average the experts' load over the last N records (default: all of them)"
    )
    args = parser.parse_args(argv)
    from pathlib import Path

    from moe_cdk.core.problems import problem
    from moe_cdk.training.metrics_plot import read_records, render

    output = Path(args.output) if args.output else Path(args.metrics).with_suffix(".png")
    try:
        if args.window is not None and args.window < 1:
            raise ConfigError([problem("too small", got=args.window, allowed="1 or more").at("--window")])
        if not output.parent.is_dir():
            raise ConfigError(
                [problem("no such folder", got=str(output.parent), allowed="an existing folder").at("--output")]
            )
        records = read_records(args.metrics)
    except ConfigError as error:
        return report(args.metrics, error)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("moe-train plot needs matplotlib: pip install 'moe-cdk[train]' (or matplotlib)", file=sys.stderr)
        return 2
    render(
        records,
        output,
        title=f"{args.metrics}: steps {records[0]['step']} to {records[-1]['step']}",
        window=args.window,
    )
    print(f"wrote {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        return _plot(argv[1:])
    from moe_cdk.training.exit_codes import EXIT_INTERRUPTED

    try:
        return _train(argv)
    except KeyboardInterrupt:
        # Ctrl-C before the rank's own handler was installed (training/stop.py): nothing was written yet.
        print("interrupted while starting: nothing was trained or saved", file=sys.stderr)
        return EXIT_INTERRUPTED


def _local_ranks(env, nproc_per_node: int):
    """``env`` for ``--nproc-per-node N``: N ranks of one machine, started by the node launcher, which
    exits with their own code (torchrun exits 1 whatever a rank's code)."""
    import dataclasses

    from moe_cdk.core.problems import problem

    if nproc_per_node == 1:
        return env
    if nproc_per_node < 1:
        raise ConfigError([problem("too small", got=nproc_per_node, allowed="1 or more").at("--nproc-per-node")])
    if env.launcher != "single":
        raise ConfigError(
            [
                problem(
                    f"the ranks were started by {env.launcher} already",
                    got=nproc_per_node,
                    allowed="1 under a launcher (torchrun, Slurm, Kubeflow, SageMaker)",
                ).at("--nproc-per-node")
            ]
        )
    return dataclasses.replace(env, launcher="local", world_size=nproc_per_node, local_world_size=nproc_per_node)


def _train(argv: list[str]) -> int:
    from moe_cdk.training.config import load_train_config, trainer_overrides, trainer_parser

    args = trainer_parser().parse_args(argv)
    from moe_cdk.training.exit_codes import EXIT_CONFIG, EXIT_FAILED_RETRYABLE, SaveFailed
    from moe_cdk.training.launch_env import detect

    try:
        config = load_train_config(args.config, trainer_overrides(args))
        env = detect()
        env = _local_ranks(env, args.nproc_per_node)
    except ConfigError as error:
        return report(args.config, error, EXIT_CONFIG)
    if env.launcher in ("sagemaker", "local") or (env.launcher == "kubeflow" and env.local_world_size > 1):
        # One process per node was started: this one launches the node's ranks.
        from moe_cdk.training.config import without_nproc_per_node
        from moe_cdk.training.node_launcher import run_node, trainer_command

        _configure_logging(env.rank)
        return run_node(env, trainer_command(without_nproc_per_node(argv)))
    # Before torch is imported: a TERM, USR1 or Ctrl-C from now on is a request to stop (see training/stop.py).
    from moe_cdk.training.stop import StopRequested

    stop = StopRequested()
    stop.announce = env.rank == 0
    _configure_logging(env.rank)
    try:
        from moe_cdk.training.step import _megatron

        _megatron.import_core()
        _megatron.report_kernel_libraries()
        from moe_cdk.training.step.trainer import train

        return train(config, env, stop)
    except ConfigError as error:
        # Every rank checks the same configuration and layout the same way, so rank 0 alone
        # reports it: the job log gets the reason once, not once per rank.
        if env.rank != 0:
            return EXIT_CONFIG
        return report(args.config, error, EXIT_CONFIG)
    except SaveFailed as error:
        # A file-system error while saving: one line; the exit code says whether a retry can help.
        if error.cause is not None:
            logging.getLogger(__name__).error("%s", error)
        return error.exit_code
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # torch's CheckpointException is a BaseException
        logging.getLogger(__name__).exception(
            "training failed; the run is retryable and resumes from its last checkpoint"
        )
        return EXIT_FAILED_RETRYABLE
    finally:
        stop.ignore_from_now()


if __name__ == "__main__":
    sys.exit(main())
