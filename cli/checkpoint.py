"""``moe-checkpoint``: Hugging Face weights into a moe-train run, and a run's checkpoint back out.

    moe-checkpoint import-hf HF_DIR --output CKPT_DIR --write-config PROFILE.yaml [--set section.key=value ...]
    moe-checkpoint export-hf CKPT_DIR --config PROFILE.yaml --output HF_DIR [--step N] [--dtype D] [--family F]
    moe-checkpoint verify CKPT_DIR [--step N]

Exit codes: 0 success (verify: every step checked is intact), 1 verify found a step that is not,
2 bad input (printed one problem per line, never as a traceback).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError, Problem
from moe_cdk.training.exit_codes import EXIT_CONFIG


def _parser() -> argparse.ArgumentParser:
    from moe_cdk.training.checkpoints.hf_checkpoint import DTYPES, FAMILIES

    parser = argparse.ArgumentParser(
        prog="moe-checkpoint", description="Convert between Hugging Face and moe-train checkpoints."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    imp = commands.add_parser(
        "import-hf",
        help="a Hugging Face MoE model folder into a step-0 checkpoint and a moe-train profile",
        description=f"Families: {', '.join(FAMILIES)}. Runs as one process; "
        "the checkpoint loads under any layout the profile's parallel section sets.",
    )
    imp.add_argument("hf_dir", metavar="HF_DIR", type=Path, help="folder with config.json and the safetensors")
    imp.add_argument(
        "--output",
        required=True,
        type=Path,
        metavar="CKPT_DIR",
        help="the run's checkpoint folder (step-0 is written there)",
    )
    imp.add_argument(
        "--write-config",
        required=True,
        type=Path,
        metavar="PROFILE.yaml",
        help="the moe-train profile to write (must not exist)",
    )
    imp.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="set a profile value, e.g. data.prefixes=[/fsx/data/web_document] or parallel.expert=8 (repeatable)",
    )
    exp = commands.add_parser(
        "export-hf", help="a moe-train checkpoint, saved under any layout, into safetensors and config.json"
    )
    exp.add_argument(
        "checkpoint",
        metavar="CKPT_DIR",
        type=Path,
        help="a run's checkpoint folder (its newest complete step) or one step-N folder",
    )
    exp.add_argument(
        "--config", required=True, type=Path, metavar="PROFILE.yaml", help="the profile the run trained with"
    )
    exp.add_argument("--output", required=True, type=Path, metavar="HF_DIR", help="the folder to write (new or empty)")
    exp.add_argument("--step", type=int, help="export step-N rather than the newest complete step")
    exp.add_argument(
        "--dtype", choices=list(DTYPES), help="default: the imported model's torch_dtype, else the checkpoint's"
    )
    exp.add_argument(
        "--family",
        choices=list(FAMILIES),
        help="the format to write; default: the imported model's (CKPT_DIR/hf/config.json)",
    )
    ver = commands.add_parser(
        "verify",
        help="read a checkpoint in full and check every file's size and checksums",
        description="Checks each step-N folder's completion marker, file sizes and checksums, and the CRC32C "
        "of every stored item of every data file, as a resume would. Prints one line per step.",
    )
    ver.add_argument(
        "checkpoint",
        metavar="CKPT_DIR",
        type=Path,
        help="a run's checkpoint folder (every step-N in it) or one step-N folder",
    )
    ver.add_argument("--step", type=int, help="check step-N of CKPT_DIR only")
    return parser


def _verify(root: Path, step: int | None) -> int:
    """Print each step's verdict; 1 when any step is not intact."""
    from moe_cdk.training.checkpoints.manager import MARKER, step_dirs, verify_step

    if (root / MARKER).is_file() or (root.is_dir() and root.name.startswith("step-") and step is None):
        steps = [root]
    else:
        steps = [path for number, path in step_dirs(root) if step is None or number == step]
    if not steps:
        wanted = f"step-{step}" if step is not None else "step-N folder"
        return report(
            str(root),
            ConfigError([Problem("CKPT_DIR", f"holds no {wanted}", got=str(root), allowed="a checkpoint folder")]),
            EXIT_CONFIG,
        )
    failed = 0
    for path in steps:
        problems = verify_step(path)
        print(f"{path}: {'intact' if not problems else 'NOT INTACT'}")
        for line in problems:
            print(f"  {line}")
        failed += bool(problems)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    # The conversion holds the whole model on one rank: in host memory, never on one GPU (30B
    # parameters in fp32 with their gradients are 245 GB). It counts only before torch is imported,
    # which the parser's imports do.
    if "torch" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("megatron", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "verify":  # reads files only: no megatron
        return _verify(args.checkpoint, args.step)
    from moe_cdk.training.step import _megatron

    _megatron.import_core()
    from moe_cdk.training.checkpoints import hf_convert

    source = str(args.hf_dir if args.command == "import-hf" else args.config)
    try:
        if args.command == "import-hf":
            step = hf_convert.import_hf(args.hf_dir, args.output, args.write_config, args.set)
            print(f"wrote {step} and {args.write_config}")
        else:
            out = hf_convert.export_hf(
                args.checkpoint,
                args.config,
                args.output,
                family_name=args.family,
                step=args.step,
                dtype_name=args.dtype,
            )
            print(f"wrote {out}")
    except ConfigError as error:
        return report(source, error, EXIT_CONFIG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
