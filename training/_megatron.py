"""megatron-core imported for the data path, without the warnings its package import emits."""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def quiet_import(module: str) -> Any:
    """Import a megatron-core module without the warnings its package import emits (missing
    Transformer Engine/Apex kernels, deprecations in model code), which the data path never uses."""

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)
