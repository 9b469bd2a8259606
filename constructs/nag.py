"""cdk-nag finding ids, worded as cdk-nag writes them, for acknowledgments: one spelling for
every construct and stack that acknowledges a finding."""

from __future__ import annotations

import aws_cdk as cdk


def nag_text(stack: cdk.Stack, value: str) -> str:
    """``value`` as cdk-nag writes it in a finding id: pseudo parameters as ``<AWS::X>``."""
    resolved = stack.resolve(value)
    if isinstance(resolved, str):
        return resolved
    parts = resolved["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else f"<{p['Ref']}>" for p in parts)


def managed_policy_finding(name: str) -> str:
    """The AwsSolutions-IAM4 finding id for the AWS managed policy ``name`` (e.g. ``service-role/X``)."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"
