"""FLOPs per device per step of an optimised HLO module, every loop trip counted.

XLA's HLO cost analysis (the CPU backend's, over the module text) counts a while body once and
knows nothing of custom calls: each one adds -1 (HloCostAnalysis::HandleCustomCall marks its
cost unknown). So the body of every loop is analysed on its own and multiplied by its trip
count, and the kernels the step runs are counted here from their shapes: cuDNN's fused
attention (`__cudnn$fmha...`, what `jax.nn.dot_product_attention` with implementation="cudnn"
compiles to), tokamax's grouped matmuls (Mosaic GPU kernels, `mosaic_gpu...`), cuBLAS GEMMs
and libtpu's grouped matmuls (jax's ragged_dot on TPU). Of them, `quantized_flops` counts those
in matmuls of fp8 or int8 operands.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from typing import Any

from .hlo import ARRAY, HloText, Instruction, braced, call_target, operand_dims, operand_types

CUDNN_ATTENTION = "__cudnn$fmha"  # the prefix of XLA's cuDNN fused-attention targets
MOSAIC_GPU = "mosaic_gpu"  # the prefix of a Mosaic GPU (Pallas) kernel's target


def step_flops(compiled: Any, hlo: HloText) -> float | None:
    """FLOPs per device per step: XLA's cost analysis with every while body counted once per
    trip, T(c) = CA(c) - sum CA(body) + sum trips * T(body) over the loops in c, plus the GPU
    kernels (`kernel_flops`) times how often a step runs them. None where this jaxlib offers
    no cost analysis of a module, or a kernel is of a kind not counted here (no figure rather
    than a wrong one)."""
    try:
        import jax
        from jax._src.lib import _jax
        from jaxlib._hlo import hlo_module_from_text

        client = jax.devices("cpu")[0].client
    except (ImportError, RuntimeError):
        return None

    @cache
    def analysed(computation: str) -> float:
        module = hlo_module_from_text(_rooted(hlo.text, computation, hlo.entry))
        return float(_jax.hlo_module_cost_analysis(client, module).get("flops", 0.0))

    def total(computation: str) -> float:
        flops = analysed(computation)
        for where, loop, trips in hlo.loops():
            if where != computation:
                continue
            body = dict(loop.called())["body"]
            flops += (trips or 1) * total(body) - analysed(body)
        for i in hlo.computations[computation]:
            # XLA counts a conditional as its costliest branch; so here, with the loops of
            # each branch counted per trip (ring attention's tiles sit in such branches)
            branches = [b for how, b in i.called() if how.endswith(("branch", "computation"))]
            if i.opcode == "conditional" and branches:
                flops += max(map(total, branches)) - max(map(analysed, branches))
        return flops

    try:
        flops = total(hlo.entry)
    except (RuntimeError, ValueError):  # the module text did not parse back: no figure
        return None
    for name, body in hlo.computations.items():
        local = {i.name: i for i in body}
        for i in body:
            if i.opcode == "custom-call" and counted_call(i):
                counted = kernel_flops(i, operand_arrays(local, hlo, i))
                if counted is None:
                    return None
                # XLA's analysis gave this call -1: undo that, add what it computes.
                flops += hlo.multiplicity.get(name, 0) * (counted + 1)
    return flops if flops >= 0 else None


# cuBLAS's GEMMs as XLA's GPU compiler calls them (`__cublas$gemm`, `__cublas$lt$matmul`, and
# `__cublas$lt$matmul$f8` for fp8 operands with their scale factors)
CUBLAS = "__cublas$"
_COUNTED = (CUDNN_ATTENTION, MOSAIC_GPU, CUBLAS)


def counted_call(call: Instruction) -> bool:
    """A custom call whose FLOPs `kernel_flops` counts: cuDNN's attention, a Mosaic GPU
    kernel, a cuBLAS GEMM, or libtpu's grouped matmul (jax's ragged_dot on TPU: a Mosaic TPU
    kernel with a `ragged_dot_tiling`)."""
    return call_target(call).startswith(_COUNTED) or _tpu_ragged_dot(call)


def _tpu_ragged_dot(call: Instruction) -> bool:
    return call_target(call) == "tpu_custom_call" and "ragged_dot_tiling=" in call.attributes


def quantized_flops(hlo: HloText) -> float | None:
    """FLOPs per device per step in matmuls whose two operands are fp8 or int8 (`low_precision`
    of every instruction, inside fusions too: XLA's GPU compiler puts its GEMMs in Triton
    fusions, libtpu its matmuls in convolution fusions), times how often a step runs its
    computation (loop trips counted). None where such a matmul's size cannot be read (no
    figure rather than a wrong one)."""
    total = 0.0
    for name, body in hlo.computations.items():
        times = hlo.multiplicity.get(name, 0)
        local = {i.name: i for i in body}
        for i in body if times else ():
            found = low_precision(i, local, hlo)
            if found is None:
                return None
            total += times * found[1]
    return total


def low_precision(
    i: Instruction, local: dict[str, Instruction], hlo: HloText
) -> tuple[str, float] | None:
    """("fp8" or "int8", FLOPs) of a matmul whose two operands are of that precision: a dot,
    a convolution, a cuBLAS GEMM call or libtpu's grouped matmul; ("", 0.0) for any other
    instruction; None where such a matmul's size cannot be read. `local`: the instructions of
    its computation, by name."""
    matmul = i.opcode in ("dot", "convolution") or (
        i.opcode == "custom-call" and (call_target(i).startswith(CUBLAS) or _tpu_ragged_dot(i))
    )
    operands = operand_arrays(local, hlo, i) if matmul else []
    if _tpu_ragged_dot(i):  # after the groups' metadata: the rows and the weights
        operands = operands[-2:]
    kinds = {_precision(a[0]) if a is not None else "" for a in operands[:2]}
    if len(operands) < 2 or len(kinds) != 1 or "" in kinds:
        return "", 0.0
    flops = matmul_flops(i, operands)  # type: ignore[arg-type]
    return None if flops is None else (kinds.pop(), flops)


def _precision(dtype: str) -> str:
    """ "fp8" for every float8 format, "int8" for int8 and narrower integers, else ""."""
    if dtype.startswith("f8"):
        return "fp8"
    return "int8" if dtype.startswith(("s8", "u8", "s4", "u4")) else ""


def matmul_flops(i: Instruction, operands: list[tuple[str, tuple[int, ...]]]) -> float | None:
    """The FLOPs of a dot or cuBLAS GEMM call (2 x result elements x the lhs's contracting
    dims, a GEMM's read from its backend config), of libtpu's grouped matmul (rows [M, K]
    against their group's weights: 2 M K N), or of a convolution (XLA's cost analysis of it
    alone: libtpu writes matmuls as convolutions, some with padded windows that hold one
    valid position); `operands` their (element type, dims). None where they cannot be read."""
    shapes = ARRAY.findall(i.shape)
    if not shapes:
        return None
    if i.opcode == "convolution":
        return _convolution_flops(i, operands, f"{shapes[0][0]}[{shapes[0][1]}]")
    out = tuple(int(d) for d in shapes[0][1].split(",") if d)  # a GEMM's: its first array
    if _tpu_ragged_dot(i):
        (_, rows), (_, weights) = operands[-2:]
        if len(rows) != 2 or len(out) != 2 or sorted(weights[1:]) != sorted((rows[1], out[1])):
            return None
        return float(2 * rows[0] * rows[1] * out[1])
    if i.opcode == "dot":
        found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", i.attributes)
        contracting = found[1] if found else ""
    else:
        config = _backend_config(i).get("gemm_backend_config", {})
        numbers = config.get("dot_dimension_numbers", {})
        contracting = ",".join(numbers.get("lhs_contracting_dimensions", []))
    lhs = operands[0][1]
    axes = [int(a) for a in contracting.split(",") if a]
    if not axes or max(axes) >= len(lhs):
        return None
    return float(2 * math.prod(out) * math.prod(lhs[a] for a in axes))


# A convolution's attributes that say what it computes.
_CONVOLUTION = re.compile(
    r"\b(?:window=\{[^}]*\}|dim_labels=[\w>-]+|feature_group_count=\d+|batch_group_count=\d+)"
)


def _convolution_flops(
    i: Instruction, operands: list[tuple[str, tuple[int, ...]]], result: str
) -> float | None:
    try:
        import jax
        from jax._src.lib import _jax
        from jaxlib._hlo import hlo_module_from_text

        client = jax.devices("cpu")[0].client
    except (ImportError, RuntimeError):
        return None
    params = [
        f"  p{k} = {dtype}[{','.join(map(str, dims))}] parameter({k})"
        for k, (dtype, dims) in enumerate(operands[:2])
    ]
    attributes = ", ".join(_CONVOLUTION.findall(i.attributes))
    root = f"  ROOT r = {result} convolution(p0, p1), {attributes}"
    text = "\n".join(["HloModule one", "ENTRY e {", *params, root, "}"])
    try:
        cost = _jax.hlo_module_cost_analysis(client, hlo_module_from_text(text))
    except (RuntimeError, ValueError):
        return None
    return float(cost.get("flops", 0.0)) or None


def operand_arrays(
    local: dict[str, Instruction], hlo: HloText, i: Instruction
) -> list[tuple[str, tuple[int, ...]] | None]:
    """An instruction's operands' element types and dims: a custom call's from its operand
    layouts where it gives them, else from the instructions that define them."""
    given = operand_types(i)
    if given:
        return list(given)
    return [_array(local, hlo, o) for o in _operands(i)]


def _operands(i: Instruction) -> list[str]:
    return [o.strip().split(" ")[-1].lstrip("%") for o in i.operands.split(",") if o.strip()]


def _array(
    local: dict[str, Instruction], hlo: HloText, name: str
) -> tuple[str, tuple[int, ...]] | None:
    """An operand's element type and dims, from the instruction that defines it (in the same
    computation, else anywhere in the module)."""
    found = local.get(name) or hlo.by_name.get(name)
    arrays = ARRAY.findall(found.shape) if found is not None else []
    if len(arrays) != 1:
        return None
    dtype, dims = arrays[0]
    return dtype, tuple(int(d) for d in dims.split(",") if d)


def kernel_flops(
    call: Instruction, operands: list[tuple[str, tuple[int, ...]] | None] | None = None
) -> float | None:
    """The FLOPs of one kernel call (cuDNN's attention, a grouped matmul, a cuBLAS GEMM),
    None where its kind is not counted here; `operands`: its operands' (element type, dims),
    which a cuBLAS call does not print with it."""
    target = call_target(call)
    if target.startswith(CUDNN_ATTENTION):
        return attention_flops(call)
    if target.startswith(MOSAIC_GPU):
        return grouped_matmul_flops(call)
    if target.startswith(CUBLAS) or _tpu_ragged_dot(call):
        if operands is None or len(operands) < 2 or None in operands:
            return None
        return matmul_flops(call, operands)  # type: ignore[arg-type]
    return None


def grouped_matmul_flops(call: Instruction) -> int | None:
    """The FLOPs of one grouped-matmul kernel (tokamax's ragged_dot on GPU), from its float
    operands (int32 operands carry the groups' sizes or tiles): rows [M, K] grouped by expert
    with the experts' weights [G, K, N] giving rows [M, N] (the forward pass and the input
    gradient), or the rows ([M, K] or as [K, M]) with the output's gradient [M, N] giving the
    weights' gradient [G, K, N]. Either way each of the M rows meets one expert: 2 M K N, the
    routed rows only. None for a Mosaic GPU kernel of any other shape (no figure rather than a
    wrong one)."""
    floats = [dims for dtype, dims in operand_types(call) if not dtype.startswith(("s", "u"))]
    shapes = ARRAY.findall(call.shape)
    if len(floats) != 2 or len(shapes) != 1:
        return None
    result = tuple(int(d) for d in shapes[0][1].split(",") if d)
    (a, b) = floats
    if len(result) == 2 and len(a) == 2 and len(b) == 3 and b[1:] == (a[1], result[1]):
        m, k, n = a[0], a[1], result[1]
    elif len(result) == 3 and len(a) == 2 and len(b) == 2 and result[1] in a:
        k, n = result[1:]
        m = a[0] * a[1] // k
        if b != (m, n):
            return None
    else:
        return None
    return 2 * m * k * n


def attention_flops(call: Instruction) -> int | None:
    """The matmul FLOPs of one cuDNN fused-attention call, forward or backward.

    From the scores' shape [B, H, Sq, Skv] (the call's `intermediate_tensor_shape`) and q, k,
    v's sizes (head dims Dqk and Dv). Per query-key pair a forward call does S = QK^T (2 Dqk)
    and O = PV (2 Dv); a backward call recomputes S (2 Dqk) and does dV = P^T dO, dP = dO V^T
    (2 Dv each), dQ = dS K and dK = dS^T Q (2 Dqk each). Pairs a mask removes are not counted:
    a causal mask keeps query i with keys 0..i, Sq(Sq+1)/2 of Sq^2 pairs when Sq = Skv (cuDNN
    skips the blocks above the diagonal; XLA's own attention computes and counts the square),
    and with a sliding window W keys i - W + 1 .. i (the blocks outside the band skipped too).
    A mask given as a bias (the step's masks from positions) keeps every pair: the kernel
    computes them all. None for masks that depend on data (padding), a sliding window
    without the causal mask or off the square, or an unreadable call."""
    config = _backend_config(call).get("cudnn_fmha_backend_config", {})
    scores = [int(d) for d in config.get("intermediate_tensor_shape", {}).get("dimensions", [])]
    arrays = [math.prod(dims) for dims in operand_dims(call)]
    window = int(config.get("sliding_window_length", 0))
    if len(scores) != 4 or len(arrays) < 3:
        return None
    b, h, sq, skv = scores
    q, k, v = arrays[:3]
    dqk = q // (b * h * sq)
    kv_heads = k // (b * skv * dqk) if dqk else 0
    dv = v // (b * skv * kv_heads) if kv_heads else 0
    if not dqk or not dv:
        return None
    mask = config.get("mask_type", "NO_MASK")
    if window and (mask != "CAUSAL" or sq != skv):
        return None
    if window:
        w = min(window, sq)
        pairs = w * (w + 1) // 2 + (sq - w) * w
    elif mask == "NO_MASK":
        pairs = sq * skv
    elif mask == "CAUSAL":  # query i sees keys 0..i
        pairs = sq * (sq + 1) // 2 if sq <= skv else skv * (skv + 1) // 2 + (sq - skv) * skv
    else:
        return None
    per_pair = 2 * (3 * dqk + 2 * dv) if "Backward" in call_target(call) else 2 * (dqk + dv)
    return b * h * pairs * per_pair


def _backend_config(call: Instruction) -> dict[str, Any]:
    try:
        data = json.loads(braced(call.attributes, "backend_config="))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _rooted(text: str, computation: str, entry: str) -> str:
    """The module text with `computation` as its entry (header attributes dropped)."""
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if k == 0 and line.startswith("HloModule"):
            lines[k] = line.split(",")[0]
        elif line.startswith(("ENTRY %", "ENTRY ")) and computation != entry:
            lines[k] = line.removeprefix("ENTRY ")
        elif computation != entry and line.startswith((f"%{computation} (", f"{computation} (")):
            lines[k] = "ENTRY " + line
    return "\n".join(lines)
