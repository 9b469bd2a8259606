"""``cdk synth`` and ``python app.py``: the selected configuration, checked, into cdk.out.

The one command-line module that loads the CDK. Exit codes: 0 success, 1 the synthesized
app failed a check (cdk-nag, CloudFormation validation), 2 the configuration is invalid.
"""

from __future__ import annotations

import os

# jsii prints a Node end-of-life banner on every start unless this is set; it must be set
# before aws_cdk is first imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import sys  # noqa: E402

import aws_cdk as cdk  # noqa: E402
from jsii.errors import JSIIError  # noqa: E402

from moe_cdk.cli.report import report  # noqa: E402
from moe_cdk.core.problems import ConfigError  # noqa: E402
from moe_cdk.schema.config import load_config  # noqa: E402
from moe_cdk.stacks.deployment import DEFAULT_CONFIG, add_nag_checks, add_stacks, cdk_json_context, summary_lines  # noqa: E402

EXIT_CHECK_FAILED = 1


def main() -> int:
    """``python app.py`` and ``cdk synth``: synthesize the selected configuration into cdk.out."""
    # cdk.json's context is the default; what the CDK CLI passes (CDK_CONTEXT_JSON) overrides it.
    # The CLI also names the output folder (CDK_OUTDIR); run directly, it is cdk.out.
    app = cdk.App(context=cdk_json_context(), outdir=None if "CDK_OUTDIR" in os.environ else "cdk.out")
    config_path = app.node.try_get_context("config") or DEFAULT_CONFIG
    # Everything synth checks before it writes anything: the file, then each construct's props
    # as the stacks are added.
    try:
        add_stacks(app, load_config(config_path))
    except ConfigError as error:
        return report(config_path, error)
    add_nag_checks(app)
    try:
        assembly = app.synth()
    except (JSIIError, RuntimeError) as error:  # jsii raises RuntimeError for a failed validation
        print(f"{config_path}: synth failed its checks\n{error}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    for line in summary_lines(assembly):
        print(line)
    return 0
