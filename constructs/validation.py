"""What every construct's props check shares: deploy-time values are not checked, and every
problem is raised at once, under the construct's name, as the one ``ConfigError``.

Each problem reads ``<prop>: <what is wrong> (got <value>; allowed <what is allowed>)``; the
rules themselves (rules/) are the ones the configuration loader applies, so both word a
problem the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Token

from moe_cdk.core import problems as _problems
from moe_cdk.core.problems import Problem, problem

__all__ = ["Problem", "is_unresolved", "problem", "raise_if_any"]


def is_unresolved(value: object) -> bool:
    """True for a CDK token, whose value is only known at deploy time and is not checked."""
    return isinstance(value, str | int | float) and Token.is_unresolved(value)


def raise_if_any(construct: str, found: Iterable[Problem]) -> None:
    """Raise ``ConfigError`` naming ``construct`` when its props have any problem."""
    _problems.raise_if_any(found, subject=f"{construct} props")
