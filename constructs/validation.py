"""One error format for construct props and configuration files alike.

Every problem reads ``<key>: <what is wrong> (got <value>; allowed <what is allowed>)``.
A construct's key is the prop name; a configuration file's key is the dotted path.
Rule functions in the construct modules return the part after ``<key>: `` so that the
construct and the configuration loader word a problem the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Token

from moe_cdk.training.schema import problem

__all__ = ["PropsError", "is_unresolved", "problem", "raise_if_any"]


def is_unresolved(value: object) -> bool:
    """True for a CDK token, whose value is only known at deploy time and is not checked."""
    return isinstance(value, str | int | float) and Token.is_unresolved(value)


class PropsError(ValueError):
    """A construct was given props it cannot build. Carries every problem found, not only the first."""

    def __init__(self, construct: str, problems: Iterable[str]):
        self.problems = list(problems)
        super().__init__(f"invalid {construct} props:\n" + "\n".join(f"  {p}" for p in self.problems))


def raise_if_any(construct: str, problems: list[str]) -> None:
    if problems:
        raise PropsError(construct, problems)
