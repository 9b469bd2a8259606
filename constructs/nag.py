"""cdk-nag finding ids, worded as cdk-nag writes them, for acknowledgments: one spelling for
every construct and stack that acknowledges a finding."""

from __future__ import annotations

import re

import aws_cdk as cdk


def nag_text(stack: cdk.Stack, value: str) -> str:
    """``value`` as cdk-nag writes it in a finding id: pseudo parameters as ``<AWS::X>``, in plain
    strings, ``Ref``, ``Fn::Sub`` and ``Fn::Join``."""
    return _nag_text(stack.resolve(value))


def _nag_text(resolved) -> str:
    if isinstance(resolved, str):
        return resolved
    if "Ref" in resolved:
        return f"<{resolved['Ref']}>"
    if "Fn::Sub" in resolved:
        return re.sub(r"\$\{([^}]+)\}", r"<\1>", resolved["Fn::Sub"])
    return "".join(_nag_text(part) for part in resolved["Fn::Join"][1])


def managed_policy_finding(name: str) -> str:
    """The AwsSolutions-IAM4 finding id for the AWS managed policy ``name`` (e.g. ``service-role/X``)."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"
