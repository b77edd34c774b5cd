"""The step's matmul seconds on one device: every projection of a layer and the head's, per
micro-batch, forward, backward (its two matmuls, for the input and the weight gradient) and
again where the remat placement recomputes it, each priced by shape (`Device.matmul`); a MoE
layer's router, grouped expert matmuls and shared experts, and the dropping path's one-hot
dispatch and combine einsums (timing/moe.py). With `TrainSpec.quantization` the projections,
the MLP's and the experts' matmuls run at the quantized rate (`Device.projection`); the head,
the router and the dispatch einsums stay in the compute dtype."""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from ..parts import mla
from ..parts.moe import MoeShapes
from ..parts.saved import runs_again
from .device import Device, whole
from .moe import dispatch_einsums, permute_seconds


@dataclass(frozen=True)
class Matmuls:
    """A micro-batch's matmul seconds: in all (`seconds`), a layer's forward on average over
    the kinds of layer (`layer_forward`), the head's one matmul (`head`), and the dropless MoE
    path's row gathers and scatters of one MoE layer (memory-bound, `permute`)."""

    seconds: float
    layer_forward: float
    head: float
    permute: float
    recomputes: bool  # whether the backward pass runs a dense layer's projections again


def projections(model: ModelSpec, d: Device) -> dict[str, float]:
    """A layer's projections, forward; SwiGLU's input is two matmuls (gate and up), a
    two-matrix MLP's one (up)."""
    inputs = 2 if model.mlp == "swiglu" else 1
    d_model, mm = model.d_model, d.projection
    found = {
        "query": mm(d_model, d.q_width),
        "key": mm(d_model, d.kv_width),
        "value": mm(d_model, d.kv_width),
        "out_proj": mm(d.q_width, d_model),
        "mlp_in": inputs * mm(d_model, d.d_ff),
        "mlp_out": mm(d.d_ff, d_model),
    }
    if model.attention == "mla":
        found |= mla.projections(model, d.tensor, mm)
    return found


def matmuls(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    facts: DeviceFacts,
    d: Device,
    *,
    moe: float,
    permute_share: float | None,
) -> Matmuls:
    """Each matmul runs three times (forward; backward for the input's gradient and the
    weight's), and once more where the backward pass recomputes its output; `moe` of the
    layers are MoE layers with their own MLP (`permute_share`: timing/moe.py's)."""
    layer = projections(model, d)
    again = [op for op in runs_again(train, parallel=model.parallel_block) if op in layer]
    layer_fwd = sum(layer.values())
    seconds = d.layers * (3 * layer_fwd + sum(layer[op] for op in again))
    permute = 0.0
    if moe:
        seconds, layer_fwd, permute = _with_moe(
            model, train, roles, facts, d, layer, again, moe=moe, permute_share=permute_share
        )
    head = d.matmul(model.d_model, d.vocab)
    chunked = train.logits_chunks > 1  # each chunk's logits recomputed in the backward pass
    seconds += head * (3 + chunked)
    return Matmuls(seconds, layer_fwd, head, permute, bool(again))


def _with_moe(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    facts: DeviceFacts,
    d: Device,
    layer: dict[str, float],
    again: list[str],
    *,
    moe: float,
    permute_share: float | None,
) -> tuple[float, float, float]:
    """(seconds, a layer's mean forward, one MoE layer's permutes) of a model whose `moe` of
    `d.layers` layers are MoE layers: its dense layers as `matmuls` prices them, its MoE
    layers with the router, the experts' grouped matmuls and the shared experts as the MLP."""
    ms = MoeShapes.of(model, train, roles)
    rows_unit, cols_unit = d.mxu
    # The dropless path's grouped kernel, where its rate was measured (GPU), and the rows of
    # the tile each group adds at its boundary (`PlatformTraits.grouped_tile_rows`).
    dropless = train.moe == "dropless"
    kernel = facts.grouped_matmul_share if dropless else None
    grouped_rate = facts.peak_flops * kernel * d.fed if kernel else d.rate
    boundary = facts.traits.grouped_tile_rows if dropless else 0
    # quantized, the grouped kernel outruns its bf16 rate as a projection does (`Device.q_rate`)
    grouped_rate, operand = (
        (grouped_rate * d.q_rate / d.rate, d.q_act) if d.quantized else (grouped_rate, d.act)
    )

    def grouped(k: int, n: int) -> float:
        """A grouped matmul: each of the device's experts [its group's rows, k] x [k, n],
        priced as `Device.matmul` prices a matmul of that height (a thin group reads its
        weights at HBM speed), at the grouped kernel's rate."""
        g = ms.group_rows + boundary
        flops = 2.0 * g * whole(k, rows_unit) * whole(n, cols_unit)
        moved = (g * k + k * n) * operand + g * n * d.act
        return ms.groups * max(flops / grouped_rate, moved / d.hbm)

    mm, proj, d_model = d.matmul, d.projection, model.d_model
    shared = model.num_shared_experts * model.moe_d_ff // d.tensor
    mixed = layer | {
        "mlp_in": mm(d_model, model.num_experts)  # the router (float32: counted bf16)
        + 2 * grouped(d_model, ms.width)
        + (2 * proj(d_model, shared) if shared else 0.0),
        "mlp_out": grouped(ms.width, d_model) + (proj(shared, d_model) if shared else 0.0),
    }
    mlp_again = train.placements["mlp_in"] == "recompute"
    routing_fwd, routing = dispatch_einsums(  # the dropping path's one-hot einsums
        model, train, roles, rate=d.rate, hbm=d.hbm, mxu=d.mxu,
        recomputed=mlp_again, einsums=facts.traits.capacity_dispatch == "einsum",
    )  # fmt: skip
    # the dropless path's gathers and scatters by row index: memory-bound, per layer
    permute = permute_seconds(
        model, train, roles, hbm=d.hbm, share=permute_share, recomputed=mlp_again
    )
    layer_fwd, moe_fwd = sum(layer.values()), sum(mixed.values())
    layers = d.layers
    seconds = (layers - moe) * (3 * layer_fwd + sum(layer[op] for op in again))
    again_moe = [op for op in runs_again(train, moe=True) if op in mixed]
    seconds += moe * (3 * moe_fwd + sum(mixed[op] for op in again_moe) + routing)
    mean_fwd = ((layers - moe) * layer_fwd + moe * (moe_fwd + routing_fwd)) / layers
    return seconds, mean_fwd, permute
