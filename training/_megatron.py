"""megatron-core imported once per process: with its fused kernels compiled when first called rather
than prepared at import, and for the data path without the warnings its package import emits."""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from typing import Any


def import_core() -> None:
    """Import ``megatron.core`` with torch.compile deferred to each fused function's first call.

    megatron-core's jit module binds ``jit_fuser = torch.compile`` (megatron/core/jit.py), and its
    fusion modules decorate their functions with it at import. Each decoration imports TorchDynamo
    and Inductor (``python -X importtime``: ``torch._inductor.compile_fx`` alone 2.1 s): the model code
    imported here in 11.8-12.5 s, and in 7.8-8.4 s deferred, a cost paid by every rank and every CLI
    call whether or not a fused function ever runs. While megatron-core is imported, torch.compile is a
    stand-in that calls the real one with the same arguments at the function's first call, and
    ``jit_fuser`` keeps that stand-in for the fusions imported later. torch.compile itself compiles at
    the first call too, so what runs is the same. No-op once megatron-core is imported."""
    if "megatron.core" in sys.modules:
        return
    import torch

    compile_now = torch.compile
    torch.compile = functools.partial(compile_on_first_call, compile_now)
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = compile_now


def compile_on_first_call(compile_now, model=None, **options):
    """``compile_now(model, **options)``, made when the returned function is first called; used as a
    decorator with options when ``model`` is None, as torch.compile can be."""
    if model is None:
        return functools.partial(compile_on_first_call, compile_now, **options)
    compiled = None

    @functools.wraps(model)
    def run(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = compile_now(model, **options)
        return compiled(*args, **kwargs)

    return run


def quiet_import(module: str) -> Any:
    """Import a megatron-core module without the warnings its package import emits (missing
    Transformer Engine/Apex kernels, deprecations in model code), which the data path never uses."""

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        warnings.simplefilter("ignore", DeprecationWarning)
        import_core()
        return importlib.import_module(module)
