"""What training/checkpoints/format.py does when a torch or megatron-core internal it uses is not
there, as a release of either could leave it (a script, not a test file).

Run as ``python tests/checkpoint_fallback_probe.py DIR``. For each internal that format.py checks,
it takes the internal away, re-imports format.py, and records the problems it found, which save and
load strategies it then hands out and what it warned; the internal is put back afterwards. Then it
saves and loads with the strategies handed out while an internal is away, and once more with
megatron's save request not running the writer format.py replaces, and prints JSON.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import logging
import sys
import types
from pathlib import Path

import torch
from checkpoint_format_probe import sharded


@contextlib.contextmanager
def replaced(owner, name: str, value=None):
    """``owner.name`` set to ``value`` for the block; with no value, deleted where ``owner`` holds it
    itself, else (an instance's method) shadowed by None."""
    missing = object()
    previous = vars(owner).get(name, missing)
    if value is None and previous is not missing:
        delattr(owner, name)
    else:
        setattr(owner, name, value)
    try:
        yield
    finally:
        if previous is missing:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, previous)


@contextlib.contextmanager
def in_sys_modules(name: str, module):
    previous = sys.modules[name]
    sys.modules[name] = module
    try:
        yield
    finally:
        sys.modules[name] = previous


def _not_reading(self, *args, **kwargs):  # a method that no longer reads the attribute checked
    return None


def removal(key: str):
    """How to take away the internal a check of format.py is named by."""
    from moe_cdk.training.compat import lookup

    if key.startswith("torch.utils.serialization.config."):
        return in_sys_modules("torch.utils.serialization.config", types.ModuleType("config"))
    path = key.split("(")[0]
    owner, name = path.rsplit(".", 1)
    if name == "_intermediate_read_item_and_target":
        return replaced(lookup(owner), "resolve_tensor", _not_reading)
    if name == "storage_data":
        return replaced(lookup(owner), "set_up_storage_reader", _not_reading)
    if name == "async_fn":
        owner, name = owner.rsplit(".", 1)
        return replaced(lookup(owner), name, collections.namedtuple(name, ["fn"]))
    return replaced(lookup(owner), name)


def main(root: Path) -> dict:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state

    from moe_cdk.training import compat
    from moe_cdk.training.checkpoints import format as checkpoint_format
    from moe_cdk.training.step import cpu_compat

    cpu_compat.activate()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("moe_cdk.training.compat").addHandler(handler)

    def handed_out(module) -> dict:
        compat._warned.clear()
        warnings.clear()
        return {
            "save": type(module.save_strategy().base_strategy).__name__,
            "load": type(module.load_strategy().base_strategy).__name__,
            "warnings": list(warnings),
        }

    def round_trip(name: str, save, load) -> bool:
        folder = root / name
        folder.mkdir()
        saved = {"weights": torch.randn(64, 32), "steps": torch.arange(10)}
        dist_checkpointing.save(sharded(saved), str(folder), sharded_strategy=save)
        targets = {key: torch.zeros_like(value) for key, value in saved.items()}
        dist_checkpointing.load(sharded(targets), str(folder), sharded_strategy=load)
        return all(torch.equal(targets[key], saved[key]) for key in saved)

    result = {"versions": compat.versions(), "internals": {}}
    keys = [*checkpoint_format._save_checks(), *checkpoint_format._load_checks()]
    for key in keys:
        with removal(key):
            module = importlib.reload(checkpoint_format)
            result["internals"][key] = {
                "save_problems": module.SAVE_PROBLEMS,
                "load_problems": module.LOAD_PROBLEMS,
                **handed_out(module),
            }
            save, load = module.save_strategy(), module.load_strategy()
        result["internals"][key]["round_trip"] = round_trip(f"without-{len(result['internals'])}", save, load)

    module = importlib.reload(checkpoint_format)
    result["all_present"] = {"save_problems": module.SAVE_PROBLEMS, "load_problems": module.LOAD_PROBLEMS}
    compat._warned.clear()
    warnings.clear()
    with replaced(module, "_STOCK_WRITER", "builtins.print"):  # a writer megatron's request does not run
        folder = root / "other-writer"
        result["other_writer"] = {
            "round_trip": round_trip(folder.name, module.save_strategy(), module.load_strategy()),
            "checksum_records": len(list(folder.glob("*.crc32c"))),
            "warnings": list(warnings),
        }
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
