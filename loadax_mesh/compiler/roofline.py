"""The compiled program's own lower bound on its run time: a roofline per operation.

For every operation a step runs (the entry and the bodies of its loops, each loop trip
counted), max(FLOPs / peak, bytes / HBM bandwidth), summed. FLOPs and bytes of each operation
come from XLA's HLO cost analysis: every operation is wrapped alone in a module of its own (its
operands as parameters, a fusion with its fused computation) and analysed there, so a fusion's
bytes are what XLA counts for it (a dynamic slice of a stacked weight reads the slice, not the
stack). XLA gives kernels no cost (a custom call adds -1: libtpu's `optimal_seconds` goes
negative on the splash kernels, docs/facts/production_runs.md), so they are counted here from
their shapes: jax's splash-attention kernels on TPU, cuDNN's fused attention and tokamax's
grouped matmuls on GPU. A matmul of fp8 or int8 operands (flops.low_precision: inside a fusion
or a cuBLAS call) runs at that precision's peak, the rest of its operation's FLOPs at the peak.

Collectives, host transfers and control flow are not operations of the chip's cores: they add
nothing here (the cost model prices them). Pure text work plus XLA's analysis on the CPU client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .flops import CUBLAS, CUDNN_ATTENTION, MOSAIC_GPU, kernel_flops, low_precision, operand_arrays
from .hlo import (
    COLLECTIVES,
    HloText,
    Instruction,
    call_target,
    closing,
    operand_dims,
    shape_bytes,
)

# Operations that move no data through the cores, or whose cost lives elsewhere: bookkeeping,
# control flow (the bodies they run are counted themselves), collectives and host transfers.
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
    "call", "after-all", "partition-id", "replica-id", "opt-barrier", "send", "send-done",
    "recv", "recv-done", "copy-start", "copy-done", "async-start", "async-update", "async-done",
    "add-dependency", "domain", "infeed", "outfeed", "rng-get-and-update-state",
    # asynchronous transfers by DMA, as copy-start/done: the host offload's to and from host
    # memory (S(5)), and slices prefetched into on-chip memory (S(1))
    "dynamic-update-slice-start", "dynamic-update-slice-done", "dynamic-slice-start",
    "dynamic-slice-done", "slice-start", "slice-done",
    # asynchronous calls on another execution thread: TPU7x runs its collectives on the
    # SparseCores (`async_execution_thread="sparsecore"`), beside the TensorCores
    "call-start", "call-update", "call-done",
}  # fmt: skip

# jax's splash kernels (the instruction takes the kernel's name) and the matmul FLOPs each does
# per query-key pair, in units of head_dim: the forward S = QK^T and O = PV; the dq kernel
# recomputes S, then dP = dO V^T and dQ = dS K; the dkv kernel recomputes S, then dP, dV = P^T dO
# and dK = dS^T Q.
_SPLASH = re.compile(r"^splash_mha_(fwd|dq|dkv)")
_SPLASH_PER_PAIR = {"fwd": 4, "dq": 6, "dkv": 8}


@dataclass(frozen=True)
class Roofline:
    """A step's roofline: seconds in all, and the parts that bound them."""

    seconds: float  # sum over operations of max(flops / peak, bytes / bandwidth)
    flops: float  # every operation's FLOPs, kernels included
    bytes: float  # every operation's HBM bytes
    compute_seconds: float  # of `seconds`, operations bound by FLOPs
    memory_seconds: float  # of `seconds`, operations bound by HBM bandwidth
    kernel_seconds: float  # of `seconds`, the attention kernels counted from their shapes


@dataclass(frozen=True)
class OperationCost:
    """One operation a step runs: where, how often, and its FLOPs and HBM bytes per run."""

    computation: str
    times: int  # runs a step: its computation's loop trips
    name: str
    opcode: str
    shape: str
    flops: float
    bytes: float
    kernel: bool  # a custom call: the attention kernels counted from their shapes, others 0
    fp8_flops: float = 0.0  # of `flops`, those in matmuls of fp8 operands
    int8_flops: float = 0.0  # of `flops`, those in matmuls of int8 operands

    def seconds(self, peak_flops: float, hbm_bandwidth: float, low: dict[str, float]) -> float:
        """One run's roofline: max(FLOPs / peak, bytes / bandwidth), the fp8 and int8 matmuls'
        FLOPs at `low`'s peaks ("fp8", "int8"; FLOP/s)."""
        quantized = self.fp8_flops + self.int8_flops
        compute = (self.flops - quantized) / peak_flops
        if quantized:
            compute += self.fp8_flops / low["fp8"] if self.fp8_flops else 0.0
            compute += self.int8_flops / low["int8"] if self.int8_flops else 0.0
        return max(compute, self.bytes / hbm_bandwidth)


def roofline(
    text: str,
    *,
    peak_flops: float,
    hbm_bandwidth: float,
    peak_fp8: float | None = None,
    peak_int8: float | None = None,
) -> Roofline | None:
    """The roofline of an optimised HLO module's text on a device with `peak_flops` (FLOP/s),
    `peak_fp8` and `peak_int8` for matmuls of those operands, and `hbm_bandwidth` (bytes/s).
    None where this jaxlib offers no cost analysis, an operation could not be analysed or a
    kernel not counted, or the program runs matmuls of a precision without a peak given (no
    figure rather than a low one)."""
    costs = operation_costs(text)
    if costs is None:
        return None
    low = {k: v for k, v in (("fp8", peak_fp8), ("int8", peak_int8)) if v is not None}
    if ("fp8" not in low and any(c.fp8_flops for c in costs)) or (
        "int8" not in low and any(c.int8_flops for c in costs)
    ):
        return None
    total = flops = size = compute = memory = kernels = 0.0
    for c in costs:
        seconds = c.times * c.seconds(peak_flops, hbm_bandwidth, low)
        total += seconds
        flops += c.times * c.flops
        size += c.times * c.bytes
        if c.kernel:
            kernels += seconds
        elif c.seconds(peak_flops, hbm_bandwidth, low) > c.bytes / hbm_bandwidth:
            compute += seconds
        else:
            memory += seconds
    return Roofline(total, flops, size, compute, memory, kernels)


def operation_costs(text: str) -> list[OperationCost] | None:
    """Every operation of an optimised HLO module's text that the chip's cores run, with its
    FLOPs and bytes (None as `roofline` gives None)."""
    try:
        import jax
        from jax._src.lib import _jax
        from jaxlib._hlo import hlo_module_from_text

        client = jax.devices("cpu")[0].client
    except (ImportError, RuntimeError):
        return None
    clean = _normalised(text)
    hlo = HloText(clean)
    blocks = _blocks(clean)
    seen: dict[str, tuple[float, float]] = {}

    def analysed(i: Instruction) -> tuple[float, float]:
        module = _wrapped(i, hlo, blocks)
        if module not in seen:
            cost = _jax.hlo_module_cost_analysis(client, hlo_module_from_text(module))
            seen[module] = (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))
        return seen[module]

    out: list[OperationCost] = []
    for name, times in _scheduled(hlo).items():
        local = {i.name: i for i in hlo.computations[name]}
        for i in hlo.computations[name]:
            if i.opcode in _FREE or _collective(i.opcode):
                continue
            if i.opcode == "custom-call":
                counted = _kernel(i, hlo, local)
                if counted is None:
                    return None
                f, b = counted
            else:
                try:
                    f, b = analysed(i)
                except (RuntimeError, ValueError):
                    return None
            low = _low_precision_flops(i, hlo, local)
            if low is None:
                return None
            kernel = i.opcode == "custom-call"
            cost = OperationCost(name, times, i.name, i.opcode, i.shape, f, b, kernel, *low)
            out.append(cost)
    return out


def _low_precision_flops(
    i: Instruction, hlo: HloText, local: dict[str, Instruction]
) -> tuple[float, float] | None:
    """(fp8, int8) matmul FLOPs of one operation (`local`: its computation's instructions):
    its own (a cuBLAS call) and those of the computations it calls (a fusion's), None where
    such a matmul cannot be read."""
    found = {"fp8": 0.0, "int8": 0.0, "": 0.0}
    todo, seen = [(i, local)], set()
    while todo:
        j, where = todo.pop()
        one = low_precision(j, where, hlo)
        if one is None:
            return None
        found[one[0]] += one[1]
        for _, callee in j.called():
            if callee not in seen:
                seen.add(callee)
                inner = {k.name: k for k in hlo.computations.get(callee, [])}
                todo.extend((k, inner) for k in inner.values())
    return found["fp8"], found["int8"]


def _collective(opcode: str) -> bool:
    return opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES


def _scheduled(hlo: HloText) -> dict[str, int]:
    """The computations whose operations the device runs one by one (the entry, loop bodies
    and conditions, conditional branches, called computations), each with how many times a step
    runs it; fused computations and reducers belong to the operation that calls them."""
    out: dict[str, int] = {}

    def visit(name: str, times: int) -> None:
        out[name] = out.get(name, 0) + times
        for i in hlo.computations.get(name, []):
            if i.opcode == "while":
                trips = hlo.trip_count(i) or 1
                for how, callee in i.called():
                    visit(callee, times * (trips if how == "body" else trips + 1))
            elif i.opcode in ("conditional", "call"):
                for _, callee in i.called():
                    visit(callee, times)

    visit(hlo.entry, 1)
    return out


def _kernel(
    call: Instruction, hlo: HloText, local: dict[str, Instruction]
) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a custom call: the attention, grouped-matmul and cuBLAS kernels from
    their shapes (bytes: their operands and results), other calls (buffer bookkeeping, index
    hints) nothing. None for a TPU kernel that is not one of jax's splash kernels, or a GPU
    kernel of a shape not read here: no way to count it."""
    target = call_target(call)
    moved = _bytes_of(call, hlo)
    if target.startswith((CUDNN_ATTENTION, MOSAIC_GPU, CUBLAS)):
        counted = kernel_flops(call, operand_arrays(local, hlo, call))
        return None if counted is None else (float(counted), float(moved))
    if target != "tpu_custom_call":
        return 0.0, 0.0
    kind = _SPLASH.match(call.name)
    shapes = operand_dims(call)
    # after the two scalar-prefetch operands, q: [rows, heads, seq, head_dim] under the step's
    # vmap over rows, [heads, seq, head_dim] where a device holds one row
    if kind is None or len(shapes) < 5 or len(shapes[2]) not in (3, 4):
        return None
    rows, heads, seq, head_dim = shapes[2] if len(shapes[2]) == 4 else (1, *shapes[2])
    pairs = seq * (seq + 1) // 2  # the reference step's causal mask: query i sees keys 0..i
    return float(rows * heads * pairs * head_dim * _SPLASH_PER_PAIR[kind[1]]), float(moved)


def _bytes_of(call: Instruction, hlo: HloText) -> int:
    """Bytes a call reads and writes: its operands' and its result's."""
    names = [o.strip().lstrip("%") for o in call.operands.split(",") if o.strip()]
    read = sum(shape_bytes(hlo.by_name[n].shape) for n in names if n in hlo.by_name)
    return read + shape_bytes(call.shape)


# -- the text of one operation as a module of its own ---------------------------------------


def _normalised(text: str) -> str:
    """The module text with each instruction on one line and without what the parser of a
    wrapped operation would trip on or need not read: metadata, operand index comments,
    control dependencies."""
    lines: list[str] = []
    for line in text.splitlines():
        starts = (
            not lines
            or line.startswith(("  %", "  ROOT", "}", "HloModule", "ENTRY", "%"))
            or re.match(r"^\s*$|^[\w.\-]+ \(|^\s+[\w.\-]+ = ", line)
        )
        if starts:
            lines.append(line)
        else:
            lines[-1] += line
    joined = _drop_braced("\n".join(lines), ", frontend_attributes=")
    joined = re.sub(r", metadata=\{[^{}]*\}", "", joined)
    joined = re.sub(r"/\*index=\d+\*/", "", joined)
    return re.sub(r", control-predecessors=\{[^}]*\}", "", joined)


def _drop_braced(text: str, key: str) -> str:
    """`text` without every `key{...}` (nested braces and quoted JSON included)."""
    parts: list[str] = []
    start = 0
    while (found := text.find(key, start)) >= 0:
        parts.append(text[start:found])
        start = closing(text, found + len(key)) + 1
    return "".join([*parts, text[start:]])


def _blocks(text: str) -> dict[str, str]:
    """Each computation's text, by name (as a non-entry computation)."""
    found: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%?([\w.\-]+) \(.*\{$", line)
        if header:
            name, lines = header[2], [line.removeprefix("ENTRY ")]
        elif name is not None:
            lines.append(line)
            if line.startswith("}"):  # "}" or, on TPU's SparseCore, `}, execution_thread=...`
                found[name], name = "\n".join(lines), None
    return found


def _wrapped(i: Instruction, hlo: HloText, blocks: dict[str, str]) -> str:
    """A module whose entry runs `i` alone on parameters shaped like its operands, with the
    computations it calls (callees first)."""
    needed: dict[str, None] = {}

    def need(name: str) -> None:
        if name in needed:
            return
        for j in hlo.computations.get(name, []):
            for _, callee in j.called():
                need(callee)
        needed[name] = None

    for _, callee in i.called():
        need(callee)
    names = [o.strip().split(" ")[-1].lstrip("%") for o in i.operands.split(",") if o.strip()]
    params = [f"  p{k} = {hlo.by_name[n].shape} parameter({k})" for k, n in enumerate(names)]
    args = ", ".join(f"p{k}" for k in range(len(names)))
    attributes = f", {i.attributes}" if i.attributes else ""
    body = [*params, f"  ROOT r = {i.shape} {i.opcode}({args}){attributes}"]
    parts = ["HloModule wrapped", *(blocks[c] for c in needed), "ENTRY e {", *body, "}"]
    return "\n".join(parts)
