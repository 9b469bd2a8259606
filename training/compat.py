"""The torch and megatron-core internals the trainer leans on, checked for the shape it expects.

The training image runs the versions in training/image.env, the suite runs pyproject.toml's
(docs/training.md, "Versions"). A private function or attribute can change between releases
without notice, and where one did, the failure would come at the first checkpoint or resume,
hours into a paid run. So each module that uses one lists it as a check, built from the helpers
here, runs its checks at import, and where any fails takes the public path instead (megatron-core's
stock strategies, or no patch), warning once with the versions it runs on. Nothing here raises.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import platform
from collections.abc import Callable
from importlib import metadata

log = logging.getLogger(__name__)

Check = Callable[[], object]


def versions() -> str:
    """This process's torch, megatron-core and Python, as a warning names them."""
    import torch

    try:
        mcore = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        mcore = "(not installed)"
    return f"torch {torch.__version__}, megatron-core {mcore}, Python {platform.python_version()}"


def lookup(path: str):
    """The object a dotted path names: its longest importable module, then attributes. Raises
    ImportError or AttributeError, naming what is missing, where the path no longer leads anywhere."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            if split == 1:
                raise
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found


def parameters(function) -> list[str]:
    """The parameter names of ``function``, in order."""
    return list(inspect.signature(function).parameters)


def uses_attribute(function, name: str) -> bool:
    """Whether ``function``'s own code reads or sets an attribute called ``name``."""
    return name in inspect.unwrap(function).__code__.co_names


def problems(checks: dict[str, Check]) -> list[str]:
    """The checks that fail, each as "INTERNAL: what was found". A check passes by returning a
    true value without raising; an internal that has gone fails with the error its lookup gave."""
    found = []
    for internal, check in checks.items():
        try:
            ok = check()
        except Exception as error:  # an absent module or attribute: the point of the check
            found.append(f"{internal}: {type(error).__name__}: {error}")
            continue
        if not ok:
            found.append(f"{internal}: not the shape this code was written for")
    return found


_warned: set[str] = set()


def warn_fallback(feature: str, found: list[str], instead: str) -> None:
    """Say once per process that ``feature`` is off because of ``found``, and what runs instead."""
    if feature in _warned:
        return
    _warned.add(feature)
    log.warning("%s is off on %s, %s runs instead: %s", feature, versions(), instead, "; ".join(found))
