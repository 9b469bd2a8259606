"""The ``moe-data`` command line: turn raw text into the .bin/.idx files the trainer reads.

    moe-data prepare --input FILE [--input FILE ...] --output-prefix PREFIX
                     [--tokenizer byte|PATH/tokenizer.json] [--json-key text] [--workers N]

Progress goes to stderr: a bar redrawn in place on a terminal, else a line at every tenth of the input.

Exit codes: 0 success, 2 bad input (missing file, bad JSON line, missing key, bad tokenizer);
problems are printed to stderr one per line, never as a traceback.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.training.data.prepare import prepare
from moe_cdk.training.data.tokenizers import load_tokenizer
from moe_cdk.training.exit_codes import EXIT_INTERRUPTED

logger = logging.getLogger(__name__)


MIB = 2**20


class Progress:
    """``prepare``'s progress as ``45% 45.0/100.0 MiB 12.3 MiB/s eta 0:00:04`` on ``stream``:
    redrawn in place on a terminal, else one line at each tenth of the input."""

    def __init__(self, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.tenths_shown = 0

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f" eta {datetime.timedelta(seconds=round((total - done) / rate))}" if rate > 0 and done < total else ""
        line = f"{fraction:4.0%} {done / MIB:.1f}/{total / MIB:.1f} MiB {rate / MIB:.1f} MiB/s{eta}"
        if self.tty:
            bar = "#" * int(30 * fraction)
            self.stream.write(f"\r[{bar:.<30}] {line}\033[K" + ("\n" if done >= total else ""))
        elif int(10 * fraction) > self.tenths_shown:
            self.tenths_shown = int(10 * fraction)
            self.stream.write(f"moe-data prepare: {line}\n")
        self.stream.flush()


def _prepare(args: argparse.Namespace) -> int:
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        result = prepare(
            [Path(p) for p in args.input],
            Path(args.output_prefix),
            tokenizer,
            json_key=args.json_key,
            workers=args.workers,
            progress=Progress(),
        )
    except ConfigError as error:
        return report("moe-data prepare", error)
    except KeyboardInterrupt:
        print(f"interrupted: {args.output_prefix}.bin and .idx were not written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"prepared {result['documents']} documents, {result['tokens']} tokens: {result['bin']} {result['idx']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-data", description="moe-data: training data preparation.")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also log each input file as it is read (moe_cdk messages only)"
    )
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
    prep.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes that tokenize (default: 1); the output is the same bytes for any N",
    )
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
