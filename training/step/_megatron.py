"""megatron-core imported once per process: with its fused kernels compiled when first called rather
than prepared at import, and without the warnings its import and start-up emit about what a run
cannot act on; one line says which optional kernel libraries are absent instead."""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import logging
import sys
import warnings
from typing import Any

logger = logging.getLogger(__name__)

# What megatron-core 0.16 warns about on every run, each a fact about the image rather than the run: the
# fallbacks it takes when Transformer Engine or Apex is absent (once per module that falls back), which
# `import_core` reports in one line; and the rerun state machine, which it initializes on first use, in
# the mode moe-cdk runs it in (DISABLED), with two WARNING records.
_FALLBACK_WARNINGS = r"(Transformer Engine and )?Apex (is|are) not installed"
_QUIET_RECORDS = (
    "Implicit initialization of Rerun State Machine!",
    "RerunStateMachine initialized in mode RerunMode.DISABLED",
)


class _QuietRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in _QUIET_RECORDS


def import_core() -> None:
    """Import ``megatron.core`` with torch.compile deferred to each fused function's first call.

    megatron-core's jit module binds ``jit_fuser = torch.compile`` (megatron/core/jit.py), and its
    fusion modules decorate their functions with it at import. Each decoration imports TorchDynamo
    and Inductor (``python -X importtime``: ``torch._inductor.compile_fx`` alone 2.1 s): the model code
    imported here in 11.8-12.5 s, and in 7.8-8.4 s deferred, a cost paid by every rank and every CLI
    call whether or not a fused function ever runs. While megatron-core is imported, torch.compile is a
    stand-in that calls the real one with the same arguments at the function's first call, and
    ``jit_fuser`` keeps that stand-in for the fusions imported later. torch.compile itself compiles at
    the first call too, so what runs is the same. No-op once megatron-core is imported.

    The garbage collector is off during the import, and what the import built is frozen after it
    (``gc.freeze()``, the pattern Python's gc documentation gives for long-lived start-up objects): about 300,000
    objects, almost all modules, functions and types that live as long as the process. Collected while they grew,
    they were walked again at each full collection: in each rank of a two-rank tiny run, collections took 0.55 s
    of its 3.65 s of CPU, and 0.13 s of 3.2 s with this. The import's own garbage (about 6,500 objects, 0.6 MiB)
    stays frozen with them, which costs less than the 0.16 s that collecting it would take."""
    if "megatron.core" in sys.modules:
        return
    collecting = gc.isenabled()
    gc.disable()
    try:
        _import_core_deferring_compile()
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def _import_core_deferring_compile() -> None:
    import torch

    # For the whole process: the fallback warnings also come later, from the model specs.
    warnings.filterwarnings("ignore", message=_FALLBACK_WARNINGS, category=UserWarning)
    logging.getLogger("megatron.core.rerun_state_machine").addFilter(_QuietRecords())
    compile_now = torch.compile
    torch.compile = functools.partial(compile_on_first_call, compile_now)
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = compile_now


def report_kernel_libraries() -> None:
    """One line for the fallback warnings ``import_core`` silences: which kernel libraries are absent."""
    absent = [name for name, module in _KERNEL_LIBRARIES if importlib.util.find_spec(module) is None]
    if absent:
        logger.info(
            "%s absent: megatron-core uses its local layers, torch norms and torch optimizers", " and ".join(absent)
        )


_KERNEL_LIBRARIES = (("Transformer Engine", "transformer_engine"), ("Apex", "apex"))


def compiles() -> bool:
    """Whether the deferred functions are compiled: on a GPU. Without CUDA they run as written: Inductor's CPU code
    is not what a GPU rank runs, and making it took 1.4 s of a tiny 5-step CPU run's 7.0 s (the import of
    ``torch._inductor.compile_fx`` alone 1.0 s), in every process of the test suite that trains."""
    import torch

    return torch.cuda.is_available()


def compile_on_first_call(compile_now, model=None, **options):
    """``compile_now(model, **options)``, made when the returned function is first called (``model`` itself where
    nothing ``compiles``); used as a decorator with options when ``model`` is None, as torch.compile can be."""
    if model is None:
        return functools.partial(compile_on_first_call, compile_now, **options)
    compiled = None

    @functools.wraps(model)
    def run(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = compile_now(model, **options) if compiles() else model
        return compiled(*args, **kwargs)

    return run


def quiet_import(module: str) -> Any:
    """Import a megatron-core module without the warnings its package import emits (missing
    Transformer Engine/Apex kernels, deprecations in model code), which the data path never uses."""

    import_core()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)
