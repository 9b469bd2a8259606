"""YAML sections into typed dataclasses, every problem reported at once in the one form.

The sections of the deployment configuration (schema/config.py) and of the trainer's profile
(training/config.py) are pydantic dataclasses declared with ``config=SECTION``. Pydantic checks
their structure: unknown keys, missing keys, types and enum values. It runs in strict JSON mode,
so a YAML ``true`` is not an integer and ``"5"`` is not a number, as YAML's own types are meant.
Each section's ``problems()`` then checks what depends on the values. Pydantic's errors are
reworded here into ``key: what (got X; allowed Y)``. The same classes give the JSON Schema that
editors read (``json_schema``) and the reference tables of the docs (``render_docs``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from moe_cdk.core.problems import Problem, problem

SECTION = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)
"""The pydantic settings of every configuration section: unknown keys are errors, no type is
coerced, and the docstring under each attribute is its description."""

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like in YAML, in words."""
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"a list of {describe(typing.get_args(tp)[0])}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"a mapping of {describe(key)} to {describe(value)}"
    if origin is types.UnionType or origin is typing.Union:
        return " or ".join("null" if a is type(None) else describe(a) for a in typing.get_args(tp))
    return str(tp)


def _inner(tp: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _type_at(root: type, loc: tuple) -> Any:
    """The declared type at ``loc`` under dataclass ``root`` (None once it cannot be followed)."""
    tp: Any = root
    for part in loc:
        tp = _inner(tp)
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) is tuple and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return tp


def _path(prefix: str, loc: tuple) -> str:
    text = prefix
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(root: type, prefix: str, error: dict) -> Problem:
    """One pydantic error in our words."""
    loc, kind, got = tuple(error["loc"]), error["type"], error.get("input")
    key = _path(prefix, loc)
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        parent = _inner(_type_at(root, loc[:-1]))
        fields = ", ".join(f.name for f in dataclasses.fields(parent)) if dataclasses.is_dataclass(parent) else ""
        return problem("unknown key", got=loc[-1], allowed=fields).at(key)
    expected = _type_at(root, loc)
    allowed = describe(expected) if expected is not None else error["msg"]
    if kind in ("missing", "missing_keyword_only_argument", "missing_argument"):
        return problem("required key is missing", got=None, allowed=allowed).at(key)
    if kind == "enum":
        return problem("unknown value", got=got, allowed=", ".join(str(m.value) for m in _inner(expected))).at(key)
    if kind in ("dataclass_type", "dataclass_exact_type", "model_type") and not loc:
        return problem("must be a mapping", got=got, allowed="key: value pairs").at(prefix or "<top level>")
    if kind in ("dataclass_type", "dataclass_exact_type", "dict_type", "model_type"):
        return problem("must be a mapping", got=got, allowed=allowed).at(key)
    if kind in ("list_type", "tuple_type"):
        return problem("must be a list", got=got, allowed=allowed).at(key)
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return problem("wrong type", got=got, allowed=allowed).at(key)
    return problem(error["msg"], got=got, allowed=allowed).at(key)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def parse(cls: type, data: Any, errors: list[Problem], prefix: str = "") -> Any:
    """An instance of section ``cls`` from parsed YAML (None: an empty file), or None when it has
    problems; every problem goes to ``errors``, under ``prefix``."""
    try:
        # JSON in, so that strict mode applies YAML's types (a YAML list is a tuple, a string an
        # enum value) and nothing else is coerced. Values YAML has and JSON lacks (dates) pass as
        # text and are then wrong types.
        instance = _adapter(cls).validate_json(json.dumps({} if data is None else data, default=str), strict=True)
    except ValidationError as error:
        refused = error.errors(include_url=False)
        errors.extend(_problem(cls, prefix, e) for e in refused)
        errors.extend(_checks_of_valid_sections(cls, data, {tuple(e["loc"]) for e in refused}, prefix))
        return None
    errors.extend(checks(instance, prefix))
    return instance


def _checks_of_valid_sections(cls: type, data: Any, refused: set[tuple], prefix: str) -> list[Problem]:
    """With ``data`` refused as a whole (the ``refused`` error locations), the checks of every section
    inside it that has no such error, so that a typo in one section does not hide a bad value in
    another: each given section (or list item) is validated on its own and checked; one with errors
    inside it is searched the same way."""
    if not dataclasses.is_dataclass(cls) or not isinstance(data, dict):
        return []
    found: list[Problem] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp, value, key = _inner(hints.get(f.name)), data[f.name], f"{prefix}.{f.name}" if prefix else f.name
        inside = {loc[1:] for loc in refused if loc[:1] == (f.name,)}
        if dataclasses.is_dataclass(tp):
            found += _checks_of(tp, value, inside, key)
        elif typing.get_origin(tp) is tuple and dataclasses.is_dataclass(_inner(typing.get_args(tp)[0])):
            if isinstance(value, list) and () not in inside:
                item_type = _inner(typing.get_args(tp)[0])
                for i, item in enumerate(value):
                    found += _checks_of(item_type, item, {loc[1:] for loc in inside if loc[:1] == (i,)}, f"{key}[{i}]")
    return found


def _checks_of(cls: type, data: Any, refused: set[tuple], key: str) -> list[Problem]:
    if refused:
        return _checks_of_valid_sections(cls, data, refused, key)
    try:
        instance = _adapter(cls).validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError:  # valid only where the whole is: a missing key or a wrong type at this level
        return []
    return checks(instance, key)


def checks(instance: Any, prefix: str = "") -> list[Problem]:
    """The ``problems()`` of every section in ``instance``, innermost first, each under its key.
    A section's own checks run only once the sections inside it have none: they may rely on
    their values (a cross-section rule never reports on a value already refused)."""
    found: list[Problem] = []
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value):
            found += checks(value, key)
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    found += checks(item, f"{key}[{i}]")
    own = getattr(instance, "problems", None)
    if own is not None and not found:
        found += [p.at(prefix) for p in own()]
    return found


def field_docs(cls: type) -> dict[str, str]:
    """The description of each key of section ``cls``: the docstring under its attribute."""
    return {name: " ".join((info.description or "").split()) for name, info in cls.__pydantic_fields__.items()}


def _one_line_descriptions(node: Any) -> Any:
    """``node`` with every ``description`` on one line: docstrings wrap at the code's line length."""
    if isinstance(node, dict):
        return {
            k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _one_line_descriptions(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_one_line_descriptions(v) for v in node]
    return node


def _schema(cls: type) -> dict:
    return _one_line_descriptions(_adapter(cls).json_schema())


def json_schema(cls: type, *, title: str) -> dict:
    """The JSON Schema of section ``cls`` (draft 2020-12), as editors' YAML language servers read it."""
    schema = _schema(cls)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        **{k: v for k, v in schema.items() if k != "title"},
    }


# -- reference documentation, from the JSON Schema -----------------------------------


def _schema_type(node: dict, defs: dict) -> str:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        if "enum" in target:
            return "one of " + ", ".join(str(v) for v in target["enum"])
        return "a mapping"
    if "anyOf" in node:
        return " or ".join(_schema_type(option, defs) for option in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        return f"a list of {_schema_type(node.get('items', {}), defs)}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"a mapping of a string to {_schema_type(values, defs)}" if isinstance(values, dict) else "a mapping"
    return {
        "string": "a string",
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
    }.get(kind, "any value")


def _default_text(name: str, node: dict, required: list[str], defs: dict) -> str:
    if name in required:
        return "required"
    if "default" not in node and node.get("type") == "object":
        return "`{}`"  # a mapping's default_factory, which the schema does not carry
    value = node.get("default")
    if (
        "default" not in node
        or (isinstance(value, dict) and value)
        or (isinstance(value, list) and value and isinstance(value[0], dict))
    ):
        return "see section"
    return f"`{json.dumps(value) if isinstance(value, bool | type(None)) else _plain(value)}`"


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _sections(node: dict, defs: dict, path: str) -> Iterator[tuple[str, dict]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        suffix, inner = "", prop
        for _ in range(3):
            if "anyOf" in inner:
                inner = next((o for o in inner["anyOf"] if o.get("type") != "null"), inner)
            elif inner.get("type") == "array":
                inner, suffix = inner.get("items", {}), suffix + "[]"
        if "$ref" in inner:
            target = defs[inner["$ref"].rsplit("/", 1)[-1]]
            if "properties" in target:
                yield from _sections(target, defs, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")


def render_docs(cls: type, title: str, intro: str) -> str:
    """A Markdown reference of every key under section ``cls``, one table per section, read from
    its JSON Schema: the keys, their types, defaults and descriptions."""
    schema = _schema(cls)
    defs = schema.get("$defs", {})
    lines = [f"# {title}", "", intro.strip(), ""]
    for path, node in _sections(schema, defs, ""):
        lines += [f"## `{path or '<top level>'}`", ""]
        if node.get("description"):
            lines += [" ".join(node["description"].split()), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        required = node.get("required", [])
        for name, prop in node.get("properties", {}).items():
            description = " ".join(prop.get("description", "").split())
            lines.append(
                f"| `{name}` | {_schema_type(prop, defs)} | {_default_text(name, prop, required, defs)} "
                f"| {description} |"
            )
        lines.append("")
    return "\n".join(lines)
