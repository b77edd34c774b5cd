"""A compile report as text (`loadax-mesh compile`): memory against HBM, FLOPs, the roofline,
and the collectives per kind and mesh axes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hardware.given import GIVEN
from .picture import shape_text
from .report import size_text, text_table

if TYPE_CHECKING:
    from ..compiler.report import CompileReport


def _recipe(report: CompileReport) -> list[str]:
    """The recipe's lines a compile of a MoE model or a pipelined mesh adds: the path and the
    pipeline as the step ran them (the resolved `CompileReport.train`)."""
    t, out = report.train, []
    if report.moe is not None:
        out.append(f"moe        {report.moe}")
    if t is not None and report.mesh.get("pipeline", 1) > 1:
        out.append(
            f"pipeline   {report.mesh['pipeline']} stages, pipeline microbatches "
            f"{t.pipeline_microbatches}, repeats {t.pipeline_repeats}, layers "
            f"{t.pipeline_layers}, remat per {t.pipeline_remat}, schedule {t.pipeline_schedule}"
        )
    return out


def render_report(report: CompileReport, notes: list[str]) -> str:
    """The compile report as text: memory against HBM, FLOPs, collectives per kind and axes."""
    mesh = shape_text(report.mesh)
    quantization = report.train.quantization if report.train is not None else "none"
    lines = [
        f"compiled   {report.model}"
        + ("" if report.seq_len is None else f", sequence length {report.seq_len}")
        + f", global batch {report.global_batch}, remat {report.remat}, "
        f"attention {report.attention}"
        + (f", quantization {quantization}" if quantization != "none" else ""),
        f"hardware   {report.hardware}; mesh {mesh}",
        *_recipe(report),
        *(f"given      {k} = {v} ({GIVEN})" for k, v in report.given.items()),
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
    if report.hbm_bytes is not None and report.profile and report.profile.traits.preallocated_pool:
        lines.append("           " + gpu_pool_text(report.hbm_bytes))
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
    low = report.quantized_flops
    if low is not None and (low or quantization != "none") and report.flops:
        lines.append(
            f"           {low:.3e} of them ({low / report.flops:.0%}) in matmuls of fp8 or int8 "
            "operands"
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
    if report.profile is not None and not report.profile.traits.device_memory:
        return (
            ": not judged (CPU devices share the host's memory; the catalogue gives a CPU "
            "device no memory of its own to hold this against)"
        )
    return ": not judged (the catalogue gives no HBM for this hardware)"


def gpu_pool_text(usable: float) -> str:
    """Where a GPU's usable memory comes from: the share of it jax's client preallocates."""
    from ..hardware.gpu_targets import gpu_pool_fraction

    fraction, where = gpu_pool_fraction()
    return (
        f"{size_text(usable)}: the pool jax's GPU client preallocates, {fraction:g} of the "
        f"{size_text(usable / fraction)} the GPU reports ({where})"
    )


def _gb_or_unknown(n: float | None) -> str:
    return "?" if n is None else size_text(n)
