"""The ``moe-data`` command line: turn raw text into the .bin/.idx files the trainer reads.

    moe-data prepare --input FILE [--input FILE ...] --output-prefix PREFIX
                     [--tokenizer byte|PATH/tokenizer.json] [--json-key text]

Exit codes: 0 success, 2 bad input (missing file, bad JSON line, missing key, bad tokenizer);
problems are printed to stderr one per line, never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.training.prepare import prepare
from moe_cdk.training.tokenizers import load_tokenizer

logger = logging.getLogger(__name__)


def _prepare(args: argparse.Namespace) -> int:
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        result = prepare([Path(p) for p in args.input], Path(args.output_prefix), tokenizer, json_key=args.json_key)
    except ConfigError as error:
        return report("moe-data prepare", error)
    print(f"prepared {result['documents']} documents, {result['tokens']} tokens: {result['bin']} {result['idx']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-data", description="moe-data: training data preparation.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (moe_cdk messages only)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prep = commands.add_parser(
        "prepare",
        help="tokenize text into PREFIX.bin and PREFIX.idx (megatron-core indexed dataset)",
        description=(
            "Tokenize documents into PREFIX.bin/PREFIX.idx. .jsonl/.json inputs hold one JSON object per "
            "line with the text under --json-key; other files are plain text, documents separated by "
            "blank lines. Each document ends with the end-of-document token."
        ),
    )
    prep.add_argument("--input", action="append", required=True, metavar="FILE", help="input file; repeat for more")
    prep.add_argument("--output-prefix", required=True, metavar="PREFIX", help="write PREFIX.bin and PREFIX.idx")
    prep.add_argument(
        "--tokenizer", default="byte", metavar="byte|PATH", help="'byte' (default) or a Hugging Face tokenizer.json"
    )
    prep.add_argument("--json-key", default="text", metavar="KEY", help="JSON key holding the text (default: text)")
    prep.set_defaults(run=_prepare)

    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors (2) and --help (0): argparse has printed the message
        return int(exit_.code or 0)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("moe_cdk").setLevel(logging.INFO)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
