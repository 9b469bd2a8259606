"""Loads YAML into frozen dataclasses, collecting every problem with its dotted key path.

Shared by the infrastructure configuration (stacks/config.py) and the trainer's
configuration, so both report problems the same way. Standard library only: the training
container imports it without CDK.

Every problem reads ``<key>: <what is wrong> (got <value>; allowed <what is allowed>)``.

The loader knows the handful of field types the configuration uses: str, int, float,
bool, enums, nested dataclasses, ``X | None`` and ``tuple[X, ...]``. Unknown keys are
errors. Attribute docstrings double as the reference documentation (``render_docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any



def problem(what: str, *, got: object, allowed: str) -> str:
    """Word one problem without its key: ``what (got X; allowed Y)``."""
    return f"{what} (got {got!r}; allowed {allowed})"


def report_problems(source: str, lines: list[str], exit_code: int = 2) -> int:
    """Print every problem on stderr, one indented line each under the file they concern;
    return ``exit_code`` (2: invalid input). The one format of every moe-cdk command line."""
    print(f"{source}: {len(lines)} problem(s)", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    return exit_code


class ConfigError(Exception):
    """A configuration that cannot be used. ``errors`` holds one ``key: message`` line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _describe(tp: Any) -> str:
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"a mapping of {_describe(key)} to {_describe(value)}"
    if origin is types.UnionType or origin is typing.Union:
        return " or ".join("null" if a is type(None) else _describe(a) for a in typing.get_args(tp))
    return str(tp)


def _convert(tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin is types.UnionType or origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, path, errors)
    if origin is tuple:
        if not isinstance(value, list):
            errors.append(f"{path}: {problem('must be a list', got=value, allowed=_describe(tp))}")
            return ()
        item_type = typing.get_args(tp)[0]
        return tuple(_convert(item_type, item, f"{path}[{i}]", errors) for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: {problem('must be a mapping', got=value, allowed=_describe(tp))}")
            return {}
        key_type, value_type = typing.get_args(tp)
        return {_convert(key_type, k, f"{path}.{k}", errors): _convert(value_type, v, f"{path}.{k}", errors)
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path, errors)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value:
                return member
        errors.append(f"{path}: {problem('unknown value', got=value, allowed=', '.join(str(m.value) for m in tp))}")
        return None
    ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        errors.append(f"{path}: {problem('wrong type', got=value, allowed=_describe(tp))}")
        return None
    return value


def build(cls: type, data: Any, path: str, errors: list[str]) -> Any:
    """An instance of dataclass ``cls`` from ``data``, or None; problems go to ``errors``."""
    prefix = f"{path}." if path else ""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(f"{path or '<top level>'}: {problem('must be a mapping', got=data, allowed='key: value pairs')}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            errors.append(f"{prefix}{key}: {problem('unknown key', got=key, allowed=', '.join(fields))}")
    values = {}
    before = len(errors)
    for name, f in fields.items():
        if name in data:
            values[name] = _convert(hints[name], data[name], f"{prefix}{name}", errors)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(f"{prefix}{name}: {problem('required key is missing', got=None, allowed=_describe(hints[name]))}")
    if len(errors) > before:
        return None
    instance = cls(**values)
    check = getattr(instance, "problems", None)
    if check is not None:
        errors.extend(f"{prefix}{key}: {message}" if key else f"{path}: {message}" for key, message in check())
    return instance


# -- reference documentation -------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstring written under each attribute of a dataclass."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def _default_text(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "required"
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if dataclasses.is_dataclass(value):
        return "see section"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return "see section"
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value) + "]`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _sections(cls: type, path: str) -> Iterator[tuple[str, type]]:
    yield path, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = hints[f.name]
        suffix = ""
        for _ in range(3):
            origin = typing.get_origin(inner)
            if origin is tuple:
                inner, suffix = typing.get_args(inner)[0], suffix + "[]"
            elif origin is types.UnionType or origin is typing.Union:
                inner = next(a for a in typing.get_args(inner) if a is not type(None))
        if dataclasses.is_dataclass(inner):
            yield from _sections(inner, f"{path}.{f.name}{suffix}" if path else f"{f.name}{suffix}")


def render_docs(root: type, title: str, intro: str) -> str:
    """A Markdown reference of every key under ``root``, one table per section."""
    lines = [f"# {title}", "", intro.strip(), ""]
    for path, cls in _sections(root, ""):
        lines += [f"## `{path or '<top level>'}`", ""]
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
            lines += [" ".join(cls.__doc__.split()), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        docs = attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            lines.append(f"| `{f.name}` | {_describe(hints[f.name])} | {_default_text(f)} | {docs.get(f.name, '')} |")
        lines.append("")
    return "\n".join(lines)
