"""``make diagram``: draw the architecture of a synthesized app (cdk.out) with Graphviz.

    python -m moe_cdk.cli.diagram --cdk-out cdk.out --output docs/architecture.png --dot docs/architecture.dot

Exit codes: 0 written, 2 no synthesized app in --cdk-out, or Graphviz's dot missing or failing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import EXIT_INVALID, ConfigError
from moe_cdk.tools.diagram import architecture_graph, render_png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_cdk.cli.diagram", description=__doc__.splitlines()[0])
    parser.add_argument("--cdk-out", default="cdk.out", help="the synthesized app (default: cdk.out)")
    parser.add_argument(
        "--output", default="docs/architecture.png", help="the PNG to write (default: docs/architecture.png)"
    )
    parser.add_argument("--dot", default=None, help="also write the DOT source here (e.g. docs/architecture.dot)")
    args = parser.parse_args(argv)
    try:
        graph = architecture_graph(Path(args.cdk_out))
    except ConfigError as error:
        return report("moe-cdk diagram", error)
    if args.dot:
        Path(args.dot).parent.mkdir(parents=True, exist_ok=True)
        Path(args.dot).write_text(graph.source)
        print(f"wrote {args.dot}")
    try:
        render_png(graph, Path(args.output))
    except RuntimeError as error:  # Graphviz's dot is missing or failed
        print(error, file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
