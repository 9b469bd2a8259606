"""``moe-train plot``: a run's ``metrics.jsonl`` as one PNG, to look at a local or finished run.

Three panels, from the records the trainer writes (training/metrics.py):

* the loss over the steps, with the learning rate on a second axis;
* the experts' load: a heatmap over layers (rows) and experts (columns) of each expert's tokens relative
  to an even share of its layer's (1.0 is even; a collapsed router shows one hot cell per row), averaged
  over the last ``window`` records; dense layers are left out;
* each MoE layer's imbalance (the busiest expert's load over the mean) over the steps;
* when the run was profiled (``profile`` in the trainer configuration): where each profiled step's time went, one
  stacked bar per step of the shares ``training/profiler.py`` records, averaged over the profiling ranks.

A run that restarted from a checkpoint appends to the same file; a step written twice keeps its last
record, so the lines follow the run that continued.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from moe_cdk.core.problems import ConfigError, problem

log = logging.getLogger(__name__)

PNG_DPI = 120


def read_records(path: str | Path) -> list[dict]:
    """The records of ``path`` by step (the last of a step written twice). Raises ``ConfigError`` at the file,
    or at its line, for a file that cannot be read, a line that is not a record, or no record at all."""
    path = Path(path)
    allowed = "a metrics.jsonl the trainer wrote"
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        found = problem("cannot read the file", got=error.strerror, allowed=allowed)
        raise ConfigError([found.at(str(path))]) from None
    except UnicodeDecodeError as error:
        got = f"byte 0x{error.object[error.start]:02x} at offset {error.start}"
        raise ConfigError([problem("not UTF-8 text", got=got, allowed=allowed).at(str(path))]) from None
    lines = text.splitlines()
    # A running or crashed trainer leaves a last line without its newline: that one record is left out.
    unfinished = len(lines) if lines and not text.endswith("\n") else None
    by_step: dict[int, dict] = {}
    problems = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            by_step[int(record["step"])] = record
            float(record["loss"])
        except (ValueError, KeyError, TypeError) as error:
            if number == unfinished:
                log.warning("%s:%d: left out an unfinished last line (the run was still writing it)", path, number)
                continue
            problems.append(
                problem(
                    "not a metrics record",
                    got=f"{type(error).__name__}: {error}",
                    allowed="one JSON object a line, with step and loss",
                ).at(f"{path}:{number}")
            )
    if problems:
        raise ConfigError(problems)
    if not by_step:
        raise ConfigError(
            [problem("no records", got=0, allowed="a metrics.jsonl with one record or more").at(str(path))]
        )
    return [by_step[step] for step in sorted(by_step)]


def expert_load(records: list[dict], window: int | None = None) -> tuple[list[int], list[list[float]]]:
    """(MoE layer indices, their rows): each expert's tokens over an even share of its layer's, averaged over
    the last ``window`` records (all when None). Layers whose every record routed nothing (dense layers) are
    left out."""
    chosen = records[-window:] if window else records
    tables = [r["tokens_per_expert"] for r in chosen if r.get("tokens_per_expert")]
    if not tables:
        return [], []
    layers, rows = [], []
    for layer in range(len(tables[0])):
        loads = []
        for table in tables:
            counts = table[layer]
            total = sum(counts)
            if total > 0:
                loads.append([c * len(counts) / total for c in counts])
        if loads:
            layers.append(layer)
            rows.append([sum(column) / len(loads) for column in zip(*loads)])
    return layers, rows


BREAKDOWN = (
    "dispatch",
    "combine",
    "experts",
    "attention",
    "forward_rest",
    "backward_rest",
    "optimizer",
    "data",
    "grad_reduce",
    "other",
)
"""The categories of a profiled step, as training/profiler.py's ``CATEGORIES`` (not imported: that module needs
torch, and plotting does not)."""


def breakdown(records: list[dict]) -> tuple[list[int], dict[str, list[float]]]:
    """(profiled steps, each category's share of those steps): the mean over the ranks that profiled the step."""
    steps, shares = [], {category: [] for category in BREAKDOWN}
    for record in records:
        ranks = record.get("profile") or []
        if not ranks:
            continue
        steps.append(record["step"])
        for category in BREAKDOWN:
            shares[category].append(sum(r["share"].get(category, 0.0) for r in ranks) / len(ranks))
    return steps, shares


def render(records: list[dict], output: str | Path, *, title: str, window: int | None = None) -> Path:
    """Write the panels of ``records`` to ``output`` (PNG) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = [r["step"] for r in records]
    layers, load = expert_load(records, window)
    profiled, shares = breakdown(records)
    ratios = [3, max(2, len(layers) / 4), 2] + ([max(2, len(profiled) / 3)] if profiled else [])
    figure, panels = pyplot.subplots(len(ratios), 1, figsize=(9, 11 + 3 * bool(profiled)), height_ratios=ratios)
    loss_axes, load_axes, imbalance_axes = panels[:3]
    figure.suptitle(title)

    loss_axes.plot(steps, [r["loss"] for r in records], color="tab:blue")
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("loss", color="tab:blue")
    if all("lr" in r for r in records):
        lr_axes = loss_axes.twinx()
        lr_axes.plot(steps, [r["lr"] for r in records], color="tab:gray", linewidth=0.8)
        lr_axes.set_ylabel("learning rate", color="tab:gray")

    if load:
        spread = max(1.0, max(abs(v - 1.0) for row in load for v in row))
        image = load_axes.imshow(
            load, aspect="auto", cmap="RdBu_r", vmin=1.0 - min(spread, 1.0), vmax=1.0 + spread, interpolation="nearest"
        )
        load_axes.set_yticks(range(len(layers)), [str(layer) for layer in layers])
        load_axes.set_xticks(range(len(load[0])))
        load_axes.set_xlabel("expert")
        load_axes.set_ylabel("layer")
        span = f"last {min(window, len(records))} records" if window else f"{len(records)} records"
        load_axes.set_title(f"tokens per expert over an even share ({span})")
        figure.colorbar(image, ax=load_axes, label="1.0 = even")
    else:
        load_axes.set_axis_off()
        load_axes.set_title("no tokens_per_expert in these records")

    for layer in layers:
        values = [r["expert_imbalance"][layer] for r in records if r.get("expert_imbalance")]
        if values and not any(v is None or math.isnan(v) for v in values):
            imbalance_axes.plot(steps[-len(values) :], values, linewidth=0.8, label=f"layer {layer}")
    imbalance_axes.set_xlabel("step")
    imbalance_axes.set_ylabel("imbalance (max / mean)")
    if 0 < len(layers) <= 12:
        imbalance_axes.legend(fontsize="small", ncol=4)

    if profiled:
        _draw_breakdown(panels[3], profiled, shares, pyplot)

    figure.tight_layout()
    output = Path(output)
    partial = output.with_name(f".{output.name}.partial")  # renamed when whole: no half-written PNG
    try:
        figure.savefig(partial, dpi=PNG_DPI, format="png")
        os.replace(partial, output)
    finally:
        pyplot.close(figure)
        partial.unlink(missing_ok=True)
    return output


def _draw_breakdown(axes, steps: list[int], shares: dict[str, list[float]], pyplot) -> None:
    """One stacked bar per profiled step: each category's share of the step."""
    rows = range(len(steps))
    left = [0.0] * len(steps)
    colors = pyplot.get_cmap("tab10")
    for index, category in enumerate(BREAKDOWN):
        widths = shares[category]
        axes.barh(rows, widths, left=left, color=colors(index), label=category)
        left = [a + b for a, b in zip(left, widths)]
    axes.set_yticks(rows, [f"step {step}" for step in steps])
    axes.invert_yaxis()
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of the step (mean over the profiled ranks)")
    axes.set_title("where each profiled step's time went")
    axes.legend(fontsize="small", ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))


__all__ = ["BREAKDOWN", "breakdown", "expert_load", "read_records", "render"]
