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
    from moe_cdk.training.config import load_train_config, trainer_overrides, trainer_parser

    args = trainer_parser().parse_args(argv)
    from moe_cdk.training.exit_codes import EXIT_CONFIG, EXIT_FAILED_RETRYABLE
    from moe_cdk.training.launch_env import detect

    try:
        config = load_train_config(args.config, trainer_overrides(args))
        env = detect()
    except ConfigError as error:
        return report(args.config, error, EXIT_CONFIG)
    if env.launcher == "sagemaker" or (env.launcher == "kubeflow" and env.local_world_size > 1):
        # One process per node was started: this one launches the node's ranks.
        from moe_cdk.training.node_launcher import run_node, trainer_command

        _configure_logging(env.rank)
        return run_node(env, trainer_command(argv))
    # Before torch is imported: a TERM from now on is a request to stop (see training/stop.py).
    from moe_cdk.training.stop import StopRequested

    stop = StopRequested()
    _configure_logging(env.rank)

    from moe_cdk.training.step import _megatron

    _megatron.import_core()
    _megatron.report_kernel_libraries()
    from moe_cdk.training.step.trainer import train

    try:
        return train(config, env, stop)
    except ConfigError as error:
        # Every rank checks the same configuration and layout the same way, so rank 0 alone
        # reports it: the job log gets the reason once, not once per rank.
        if env.rank != 0:
            return EXIT_CONFIG
        return report(args.config, error, EXIT_CONFIG)
    except Exception:
        logging.getLogger(__name__).exception(
            "training failed; the run is retryable and resumes from its last checkpoint"
        )
        return EXIT_FAILED_RETRYABLE
    finally:
        stop.ignore_from_now()


if __name__ == "__main__":
    sys.exit(main())
