"""The ``moe-cdk`` command line, and the synth entry point that app.py calls.

Exit codes: 0 success, 1 the synthesized app failed a check (cdk-nag, CloudFormation
validation), 2 the configuration or the command line is invalid.
"""

from __future__ import annotations

import os

# jsii prints a Node end-of-life banner on every start unless this is set; it must be set
# before aws_cdk is first imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import aws_cdk as cdk  # noqa: E402
from jsii.errors import JSIIError  # noqa: E402

from moe_cdk.constructs.validation import PropsError  # noqa: E402
from moe_cdk.stacks.config import Config, load_config, reference_docs  # noqa: E402
from moe_cdk.stacks.deployment import DEFAULT_CONFIG, add_nag_checks, add_stacks, cdk_json_context, summary_lines  # noqa: E402
from moe_cdk.training.schema import ConfigError  # noqa: E402

EXIT_CHECK_FAILED = 1
EXIT_INVALID = 2


def _report_invalid(config_path: str, errors: list[str]) -> int:
    print(f"{config_path}: {len(errors)} problem(s)", file=sys.stderr)
    for line in errors:
        print(f"  {line}", file=sys.stderr)
    return EXIT_INVALID


def check_config(config_path: str, app: cdk.App) -> tuple[Config | None, list[str]]:
    """Everything synth checks before it writes anything: the file, then the construct props
    as the stacks are added to ``app``. Returns the config and no errors, or None and every error line.
    """
    try:
        config = load_config(config_path)
    except ConfigError as error:
        return None, error.errors
    try:
        add_stacks(app, config)
    except PropsError as error:
        return None, error.problems
    return config, []


def synth_main() -> int:
    """``python app.py`` and ``cdk synth``: synthesize the selected configuration into cdk.out."""
    # cdk.json's context is the default; what the CDK CLI passes (CDK_CONTEXT_JSON) overrides it.
    # The CLI also names the output folder (CDK_OUTDIR); run directly, it is cdk.out.
    app = cdk.App(context=cdk_json_context(), outdir=None if "CDK_OUTDIR" in os.environ else "cdk.out")
    config_path = app.node.try_get_context("config") or DEFAULT_CONFIG
    config, errors = check_config(config_path, app)
    if config is None:
        return _report_invalid(config_path, errors)
    add_nag_checks(app)
    try:
        assembly = app.synth()
    except (JSIIError, RuntimeError) as error:  # jsii raises RuntimeError for a failed validation
        print(f"{config_path}: synth failed its checks\n{error}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    for line in summary_lines(assembly):
        print(line)
    return 0


def _validate(args: argparse.Namespace) -> int:
    config, errors = check_config(args.config, cdk.App())
    if config is None:
        return _report_invalid(args.config, errors)
    print(f"{args.config}: valid")
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    text = reference_docs()
    if args.check:
        current = Path(args.check).read_text() if Path(args.check).exists() else ""
        if current != text:
            print(f"{args.check} is out of date; run: moe-cdk config-docs > {args.check}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        return 0
    sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-cdk", description="moe-cdk: MoE training infrastructure on AWS.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a configuration file; exit 0 if valid, 2 if not")
    validate.add_argument("--config", required=True, help="YAML configuration, e.g. config/default.yaml")
    validate.set_defaults(run=_validate)

    docs = commands.add_parser("config-docs", help="print the configuration reference (docs/configuration.md)")
    docs.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated reference")
    docs.set_defaults(run=_config_docs)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
