"""The one problem type and the one error type of every moe-cdk input: configuration files,
construct props, trainer profiles, launch environments and command lines.

A problem reads ``<key>: <what is wrong> (got <value>; allowed <what is allowed>)``. The key is a
dotted path into a YAML file (``cluster.instance_groups[1].instance_type``), a construct prop
(``storage_capacity_gib``) or a command-line option (``--group``). A rule that does not know where
its value came from returns a problem without a key, and its caller places it with ``at``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

_NOTHING = object()

EXIT_INVALID = 2
"""The exit code of every moe-cdk command for an input it cannot use: permanent, never retried."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input."""

    key: str
    """Where: a dotted path, a prop name or an option; empty while the rule that found it does not know."""
    message: str
    """What is wrong, e.g. ``not a CloudWatch Logs retention``."""
    got: object = _NOTHING
    """The value given; left out of the text when the problem is not about one value."""
    allowed: str = ""
    """What would be accepted, in words."""

    def at(self, key: str) -> Problem:
        """This problem under ``key``: ``a.b`` then ``c`` gives ``a.b.c``, ``[2]`` gives ``a.b[2]``."""
        if not key:
            return self
        if not self.key:
            return replace(self, key=key)
        return replace(self, key=f"{key}{'' if self.key.startswith('[') else '.'}{self.key}")

    @property
    def text(self) -> str:
        """The problem without its key: ``what (got X; allowed Y)``."""
        if self.got is _NOTHING and not self.allowed:
            return self.message
        parts = ([] if self.got is _NOTHING else [f"got {self.got!r}"]) + (
            [f"allowed {self.allowed}"] if self.allowed else []
        )
        return f"{self.message} ({'; '.join(parts)})"

    def __str__(self) -> str:
        return f"{self.key}: {self.text}" if self.key else self.text


def problem(what: str, *, got: object, allowed: str) -> Problem:
    """A problem a rule found, without its key: the caller knows where the value came from (``Problem.at``)."""
    return Problem("", what, got, allowed)


class ConfigError(ValueError):
    """An input moe-cdk cannot use, with every problem found in it, not only the first.

    The one error type: the configuration loader, the constructs (``subject`` names the construct),
    the trainer and the command lines all raise it, and cli/ prints it the one way.
    """

    def __init__(self, problems: Iterable[Problem], *, subject: str | None = None):
        self.problems: list[Problem] = list(problems)
        self.subject = subject
        head = f"invalid {subject}:\n" if subject else ""
        super().__init__(head + "\n".join(f"  {line}" if subject else line for line in self.errors))

    @property
    def errors(self) -> list[str]:
        """One ``key: what (got X; allowed Y)`` line per problem."""
        return [str(p) for p in self.problems]


def raise_if_any(problems: Iterable[Problem], *, subject: str | None = None) -> None:
    """Raise ``ConfigError`` when ``problems`` holds any."""
    found = list(problems)
    if found:
        raise ConfigError(found, subject=subject)
