"""The CLI's workload commands: `models` (the model catalogue) and `compile` (the reference step
compiled for a plan, with what the compiler says), as text or JSON."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .args import positive_int, print_json, size_text

if TYPE_CHECKING:
    from ..compiler.report import CompileReport
    from ..plan import MeshPlan

# The workload flags of `compile`, `estimate` and `plan --strategy auto` (where --model is
# needed only for auto and --global-batch is the plan's own flag).
WORKLOAD_FLAGS: dict[str, tuple[dict[str, Any], str]] = {
    "--model": ({"metavar": "M"}, "a model (`loadax-mesh models`)"),
    "--remat": (
        {"metavar": "POLICY"},
        "where the backward pass finds each tensor of a layer: a policy (full, the default: "
        "only layer inputs saved; dots; none; offload: layer inputs in host memory) or "
        "tensor=placement pairs such as layer_input=offload,query=offload (placements: "
        "recompute, device, offload; tensors not named are recomputed); with --strategy auto "
        "it narrows the recipe search",
    ),
    "--microbatches": (
        {"type": positive_int, "metavar": "M"},
        "gradient accumulation: the step's batch run in M slices (default 1; with --strategy "
        "auto: searched unless given)",
    ),
    "--logits-chunks": (
        {"type": positive_int, "metavar": "C"},
        "the loss computed over C slices of the tokens (default 1; with --strategy auto: "
        "searched unless given)",
    ),
    "--attention": (
        {"default": "flash", "choices": ["flash", "plain"]},
        "flash: splash kernel on TPU, cuDNN on GPU; plain: XLA with the scores written out",
    ),
}


def models_command(args: argparse.Namespace) -> int:
    from ..view.report import text_table
    from ..workload import ModelSpec, list_models

    models = [ModelSpec.from_name(name) for name in list_models()]
    if args.format == "json":
        print_json([{**vars(m), "num_params": m.num_params} for m in models])
        return 0
    keys = ["num_layers", "d_model", "d_ff", "num_heads", "num_kv_heads", "head_dim"]
    rows: list[list[Any]] = [
        ["model", "params", "layers", "d_model", "d_ff", "heads", "kv", "head", "vocab", "seq"]
    ]
    for m in models:
        rows.append(
            [m.name, _count(m.num_params), *(getattr(m, k) for k in keys), m.vocab_size, m.seq_len]
        )
    print(text_table(rows))
    print("\nSources: configs/models/<name>.toml (or --format json)")
    return 0


def compile_command(args: argparse.Namespace, plan: MeshPlan, notes: list[str]) -> int:
    from ..compiler.report import compile_step
    from .cost import specs

    model, train = specs(args)
    with _progress(f"compiling {model.name} for {plan.hardware}"):
        report = compile_step(plan, model, train)
    if args.format == "json":
        print_json({**report.to_dict(), "notes": notes})
    else:
        print(render_report(report, notes))
    return 0


def render_report(report: CompileReport, notes: list[str]) -> str:
    """The compile report as text: memory against HBM, FLOPs, collectives per kind and axes."""
    from ..view.picture import shape_text

    mesh = shape_text(report.mesh)
    lines = [
        f"compiled   {report.model}, global batch {report.global_batch}, remat {report.remat}, "
        f"attention {report.attention}",
        f"hardware   {report.hardware}; mesh {mesh}",
        *(f"note       {n}" for n in notes),
        f"time       {report.compile_seconds:.1f} s",
        "",
    ]
    if report.message:
        lines.append(f"refused    {report.message}")
        if report.squeezed_bytes is not None:
            lines.append(
                f"           (the figure below is the step as written; the compiler's own extra "
                f"remat got it to {size_text(report.squeezed_bytes)}, the message's GiB in GB)"
            )
    lines.append(f"memory     {size_text(report.total_bytes)} per device{_judged(report)}")
    if report.hbm_bytes is not None and report.hardware.startswith("gpu-"):
        lines.append("           " + _gpu_pool(report.hbm_bytes))
    if report.assigned_bytes is not None:
        lines.append(
            f"           libtpu assigns {size_text(report.assigned_bytes)} (arguments and its "
            "temp block: what its HBM check counts)"
        )
    if report.argument_bytes is not None:
        parts = ("argument", "output", "temp", "alias")
        lines.append(
            "           "
            + ", ".join(f"{p} {size_text(getattr(report, f'{p}_bytes'))}" for p in parts)
            + " (total = argument + output + temp - alias)"
        )
    if report.flops is not None:
        counted = "; cuDNN attention on the pairs its mask keeps" * (report.attention == "cudnn")
        lines.append(
            f"flops      {report.flops:.3e} per device per step (loop trips counted{counted})"
        )
    if report.roofline_seconds is not None:
        lines.append(
            f"roofline   {report.roofline_seconds:.3f} s per step: the compiled program's own "
            "lower bound (per operation, max of FLOPs at peak and bytes at HBM bandwidth)"
        )
    if report.collectives:
        lines += ["", collective_table(report)]
    return "\n".join(lines)


def collective_table(report: CompileReport) -> str:
    """Collectives per kind and axes: runs and bytes per step, and how many of the bytes stay
    inside hosts and cross them (a column for granules where they are not the hosts)."""
    from ..view.report import text_table

    parts = ("bytes", "across_hosts", "across_granules")
    grouped: dict[tuple[str, tuple[str, ...] | None], list[Any]] = {}
    for c in report.collectives:
        total = grouped.setdefault((c.kind, c.axes), [0, 0, 0, 0])
        total[0] += c.count
        for k, part in enumerate(parts, start=1):
            size = getattr(c, part)
            total[k] = None if size is None or total[k] is None else total[k] + size * c.count
    granules = any(c.across_granules != c.across_hosts for c in report.collectives)
    header = ["collective", "axes", "per step", "bytes per step", "inside hosts", "across hosts"]
    rows: list[list[Any]] = [header + ["across granules"] * granules]
    for (kind, axes), (count, size, hosts, across) in sorted(
        grouped.items(), key=lambda kv: -kv[1][1]
    ):
        shown = ",".join(axes) if axes else "(part of an axis)"
        inside = None if hosts is None else size - hosts
        row = [kind, shown, count, size_text(size), *(_gb_or_unknown(v) for v in (inside, hosts))]
        rows.append(row + [_gb_or_unknown(across)] * granules)
    totals = report.bytes_across()
    rows.append(
        ["all", "", sum(c.count for c in report.collectives), size_text(totals["total"] or 0)]
        + [_gb_or_unknown(totals[k]) for k in ("inside_hosts", "across_hosts")]
        + [_gb_or_unknown(totals["across_granules"])] * granules
    )
    return text_table(rows)


def _judged(report: CompileReport) -> str:
    """What the memory is held against, in words: the device's HBM, or why nothing."""
    if report.hbm_bytes is not None:
        verdict = "fits" if report.fits else "does NOT fit"
        if report.fits and report.total_bytes > report.hbm_bytes:  # TPU: the compiler judged
            verdict = (
                "fits by the compiler's own check (libtpu refuses a program over its HBM; "
                "memory_analysis() counts temporaries beyond the buffers it assigns)"
            )
        return f" of {size_text(report.hbm_bytes)}: {verdict}"
    if report.hardware.startswith("cpu-"):
        return (
            ": not judged (CPU devices share the host's memory; the catalogue gives a CPU "
            "device no memory of its own to hold this against)"
        )
    return ": not judged (the catalogue gives no HBM for this hardware)"


def _gpu_pool(usable: int) -> str:
    from ..hardware.gpu_targets import gpu_pool_fraction

    fraction, where = gpu_pool_fraction()
    return (
        f"{size_text(usable)}: the pool jax's GPU client preallocates, {fraction:g} of the "
        f"{size_text(usable / fraction)} the GPU reports ({where})"
    )


def _gb_or_unknown(n: float | None) -> str:
    return "?" if n is None else size_text(n)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """A line on stderr that counts seconds while XLA compiles (a plain line if not a TTY)."""
    if not sys.stderr.isatty():
        print(f"{what} (XLA; this can take a minute) ...", file=sys.stderr, flush=True)
        yield
        return
    done = threading.Event()
    start = time.perf_counter()

    def tick() -> None:
        spin = "|/-\\"
        k = 0
        while not done.wait(0.25):
            seconds = time.perf_counter() - start
            print(f"\r{spin[k % 4]} {what}: {seconds:.0f} s", end="", file=sys.stderr, flush=True)
            k += 1
        print("\r\033[K", end="", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
