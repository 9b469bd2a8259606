"""megatron-core imported with torch.compile deferred to each fused function's first call."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from moe_cdk.training.step import _megatron
from moe_cdk.training.step._megatron import compile_on_first_call

IMPORT_MODEL_CODE = """
import sys
import torch
compile_now = torch.compile
from moe_cdk.training.step import _megatron
_megatron.import_core()
import moe_cdk.training.step.trainer, moe_cdk.training.step.model, megatron.core.models.gpt
from megatron.core import jit
print(torch.compile is compile_now, "torch._inductor.compile_fx" in sys.modules, jit.jit_fuser.func.__name__)
"""


def test_model_code_imports_without_inductor_and_leaves_torch_compile_as_it_was():
    done = subprocess.run([sys.executable, "-c", IMPORT_MODEL_CODE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False", "compile_on_first_call"]


# Counts the collections that run while megatron-core is imported; "gc.disable()" first where the caller turned the
# collector off itself.
GC_PROBE = """
import gc, sys
if sys.argv[1] == "off":
    gc.disable()
from moe_cdk.training.step import _megatron
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
_megatron.import_core()
print(len(collections), gc.get_freeze_count(), gc.isenabled())
"""


@pytest.mark.parametrize("collector", ["on", "off"])
def test_the_import_runs_no_collection_freezes_what_it_built_and_leaves_the_collector_as_it_was(collector):
    done = subprocess.run(
        [sys.executable, "-c", GC_PROBE, collector], capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    collections, frozen, enabled = done.stdout.split()
    assert (collections, enabled) == ("0", str(collector == "on"))
    assert int(frozen) > 200_000, frozen  # torch's and megatron-core's modules, functions and types


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(_megatron, "compiles", lambda: True)


def test_deferred_compile_compiles_once_at_the_first_call_with_the_same_options(on_a_gpu):
    calls = []

    def compile_now(model, **options):
        calls.append(options)
        return lambda x: model(x) + 1

    square = compile_on_first_call(compile_now, lambda x: x * x, dynamic=False)
    assert calls == []
    assert [square(3), square(4)] == [10, 17]
    assert calls == [{"dynamic": False}]


def test_deferred_compile_as_a_decorator_with_options(on_a_gpu):
    calls = []

    def compile_now(model, **options):
        calls.append(options)
        return model

    @compile_on_first_call(compile_now, mode="max-autotune")
    def double(x):
        return 2 * x

    assert double.__name__ == "double" and calls == []
    assert double(5) == 10 and calls == [{"mode": "max-autotune"}]


def test_deferred_compile_computes_what_torch_compile_computes(on_a_gpu):
    def gelu_like(x):
        return x * torch.sigmoid(1.702 * x)

    x = torch.linspace(-3, 3, 64)
    deferred = compile_on_first_call(torch.compile, gelu_like, backend="eager")
    assert torch.equal(deferred(x), torch.compile(gelu_like, backend="eager")(x))


def test_without_cuda_a_deferred_function_runs_uncompiled(monkeypatch):
    monkeypatch.setattr(_megatron, "compiles", lambda: False)
    calls = []
    square = compile_on_first_call(lambda model, **options: calls.append(options), lambda x: x * x, dynamic=False)
    assert square(3) == 9 and calls == []
