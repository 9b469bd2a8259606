"""Lets megatron-core 0.16.1 train on CPU with gloo, for tests and laptops.

megatron-core assumes CUDA in a few places that a CPU run reaches. ``activate()`` patches
exactly those, and only when CUDA is absent; on a GPU it does nothing. What it fixes, as
found for megatron-core 0.16.1 on Python 3.11 with the CPU build of torch 2.13:

- ``torch.cuda.current_device()``: the router moves its weight there (router.py). On CPU
  it returns the CPU device.
- ``torch.cuda.Stream`` / ``current_stream`` / ``stream`` / ``Event`` / ``synchronize``: the
  alltoall dispatcher copies split sizes device-to-host on a side stream and synchronises
  on an event; checkpoint save calls ``torch.cuda.synchronize``. On CPU there is one
  stream and nothing to wait for.
- ``token_dispatcher.maybe_move_tensor_to_cpu``: converts only CUDA tensors to numpy, so
  on CPU the alltoall split sizes stay tensors, which ``all_to_all_single`` rejects. On
  CPU it converts CPU tensors when numpy is asked for.
- Megatron's CUDA RNG tracker: replaced by a tracker with the same state names that
  keeps CPU generator states, so dropout forks and checkpointed RNG states work.
- ``device="cuda"`` in tensor factories: the pipeline schedules
  (pipeline_parallel/schedules.py, p2p_communication.py), the optimizer's loss-scale and
  overflow buffers (optimizer/optimizer.py) and the grad buffer's warm-up tensor
  (distributed/param_and_grad_buffer.py) create tensors on "cuda". ``cuda_factories_on_cpu()``
  is a ``TorchFunctionMode`` that sends those factory calls to the CPU; the trainer enters it
  around megatron's step and the construction of its DDP and optimizer.
- ``clip_grad_by_total_norm_fp32`` (optimizer/clip_grads.py) asserts every gradient is a
  ``torch.cuda.FloatTensor``. On CPU the same scaling runs with the same assertion for a CPU
  fp32 tensor.

On every machine, CUDA or not, ``activate()`` also binds ``moe_utils.te_general_gemm`` to
None when Transformer Engine is absent: the router's gating linear
(transformer/moe/moe_utils.py) tests it against None but it is only defined when
Transformer Engine imports, so a GPU without Transformer Engine raised NameError.

Likewise ``multi_latent_attention.HAVE_TE`` is set False when Transformer Engine is absent: that
module finds megatron's Transformer Engine wrappers importable as placeholders (MagicMock
objects) without the package, sets HAVE_TE True, and then ``isinstance(self.linear_proj,
TELinear)`` raised TypeError while building any multi-latent attention layer.

None of these changes the arithmetic: each answers a device call or an assertion.

Callers must also pass an explicit causal attention mask (with ``attention_mask=None``
megatron builds one on "cuda") and build the model with ``add_bias_linear=False``.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from moe_cdk.training import compat

log = logging.getLogger(__name__)
_active = False


class _CpuEvent:
    def synchronize(self) -> None: ...
    def wait(self, stream=None) -> None: ...
    def record(self, stream=None) -> None: ...
    def query(self) -> bool:
        return True


class _CpuStream:
    """The one stream a CPU has: every instance is the same stream."""

    def __init__(self, *args, **kwargs) -> None: ...
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CpuStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, other) -> None: ...
    def wait_event(self, event) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool:
        return True

    def record_event(self, event=None):
        return event or _CpuEvent()


def _host_copy(tensor, as_numpy: bool = False, record_stream: bool = False):
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


def _cpu_rng_tracker_class():
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's tracker, keeping CPU generator states under the same names."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


class _CudaFactoriesOnCpu(torch.overrides.TorchFunctionMode):
    """Sends tensor factory calls that name the "cuda" device to the CPU, and makes
    ``Tensor.cuda()`` return the tensor itself (the fully parallel checkpoint load moves each
    shard to "cuda" to broadcast it, dist_checkpointing/exchange_utils.py)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cuda_factories_on_cpu():
    """A context in which ``device="cuda"`` and ``.cuda()`` mean the CPU; a no-op context where CUDA exists."""
    return contextlib.nullcontext() if torch.cuda.is_available() else _CudaFactoriesOnCpu()


def _clip_grad_by_total_norm_fp32_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron's clip_grad_by_total_norm_fp32 (optimizer/clip_grads.py) for CPU tensors:
    the same fp32 check, and the same scale by max_norm / (total_norm + 1e-6) below 1."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    name = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, name).detach() for p in parameters if getattr(p, name, None) is not None]
    for grad in grads:
        assert grad.dtype == torch.float32, f"gradient clipping expects fp32 main gradients, got {grad.dtype}"
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


def _bind_missing_te_general_gemm() -> None:
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _unmask_mla_without_te() -> None:
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        from megatron.core.transformer import multi_latent_attention

        multi_latent_attention.HAVE_TE = False


def activate() -> bool:
    """Patch megatron-core for this machine: the Transformer Engine gap everywhere, the CPU
    shims when CUDA is absent. Returns True if the CPU shims are on. Idempotent."""
    global _active
    _bind_missing_te_general_gemm()
    _unmask_mla_without_te()
    if torch.cuda.is_available():
        return False
    if _active:
        return True
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher

    # The megatron internals replaced below, checked first (training/compat.py): one that has gone
    # is left alone, with a warning, rather than set anew where nothing reads it.
    replaced = {
        (token_dispatcher, "maybe_move_tensor_to_cpu"): _host_copy,
        (moptimizer, "clip_grad_by_total_norm_fp32"): _clip_grad_by_total_norm_fp32_cpu,
        # Activation recompute (tensor_parallel/random.py, CheckpointFunction) saves and restores
        # the "CUDA" generator around the recomputed forward; on CPU that generator is the CPU
        # one, so the recomputed forward draws the same dropout masks.
        (mrandom, "_get_cuda_rng_state"): lambda *args, **kwargs: torch.get_rng_state(),
        (mrandom, "_set_cuda_rng_state"): lambda state, *args, **kwargs: torch.set_rng_state(state),
    }
    missing = [
        f"{module.__name__}.{name}: absent"
        for module, name in [*replaced, (mrandom, "_CUDA_RNG_STATE_TRACKER")]
        if not hasattr(module, name)
    ]
    if missing:
        compat.warn_fallback("Some of moe-cdk's CPU shims for megatron-core", missing, "megatron-core's own code")
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.default_stream = lambda device=None: _CpuStream()
    torch.cuda.Stream = _CpuStream
    torch.cuda.Event = lambda *args, **kwargs: _CpuEvent()
    torch.cuda.current_stream = lambda device=None: _CpuStream()
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    for (module, name), replacement in replaced.items():
        if hasattr(module, name):
            setattr(module, name, replacement)
    if hasattr(mrandom, "_CUDA_RNG_STATE_TRACKER"):
        mrandom._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    _active = True
    log.info("CUDA is absent: megatron-core runs on CPU through moe_cdk.training.step.cpu_compat")
    return True
