"""Step time, term by term: what a device does below its peak (docs/design.md section 8).

- Matmuls: every projection of a layer and the head's, per micro-batch, forward, backward (its
  two matmuls, for the input and the weight gradient) and again where the remat placement
  recomputes it, each max(FLOPs / (peak x efficiency), bytes / HBM bandwidth): a matmul too
  thin for the matrix units reads its weights at HBM speed (the shape term).
- Attention: the flash kernel's FLOPs over the causal pairs, forward and backward (TPU:
  jax's splash kernels, whose dq and dkv kernels each recompute the scores: 14 FLOPs per
  pair and head_dim against the forward's 4; GPU: cuDNN's fused backward, 10), at the same
  efficiency, or its operands' bytes where that is longer; the forward runs again in every
  checkpointed layer, its output kept or not (saved.runs_again). Plain attention
  (`TrainSpec.attention`) as cost/parts/plain_attention.py counts it: its matmuls over the whole
  square, each priced as a projection is, and its softmax and the softmax's gradient over
  the score-sized tensors among the memory-bound operations.
- Memory-bound operations at HBM bandwidth: a layer's norms, rotary, MLP activation (SwiGLU's
  gate, or a two-matrix MLP's ReLU or GELU) and residual adds (forward, backward, and the
  forward again where a tensor is recomputed), the copies of what a layer keeps into the layer
  scan's stacks and back out, the loss over the vocabulary and the optimizer's update of every
  parameter shard.
- Collectives (cost/parts/traffic.py): those inside a granule that overlap hide behind the compute;
  those that feed the next operation, or that the compiler runs in line (on TPU a layer's
  attention weights gathered each pass), are exposed; every collective across granules (DCN, the
  scale-out network) is exposed. The measured runs say so: MaxText's LLaMA-2 7B on A3 hosts
  runs its data-parallel reduction inside the layer loop, where its time at the network's
  rate would hide behind the backward pass, yet the step grows by 17-31% from 1 to 2-16 hosts
  (docs/facts/production_runs.md).
- MoE layers (cost/timing/moe.py): the dropping path's one-hot dispatch and combine einsums
  beside the matmuls, priced by shape; the dropless path's token copies moved by row index
  among the memory-bound operations, at the named calibration `permute_bandwidth`.
- Host offload: on TPU each direction's copies are DMAs beside the cores and hide behind their
  own pass (out: the forward, in: the backward); only what exceeds it is exposed (the v6e
  calibration runs all offload). On GPU both directions are counted exposed: on one H200 (jax
  0.11.2, benchmarks/bench_gpu_step.py) offloading added 40-80% of the transfers' serial time to
  the step, where hiding them would add none.

`efficiency` and `intensity` are named calibrations per platform (configs/calibration.toml),
as are the latency of a ring step across granules and what a TPU slice sends across slices in
all (cost/estimate.py's `across_granules`), all fitted by benchmarks/bench_time.py on the
calibration set alone. Where the catalogue has a chip's measured shares (the H100's: of its
peak, its matmuls and cuDNN attention kernels, benchmarks/bench_gpu_matmul.py; of its HBM
bandwidth, its layers' memory-bound operations, benchmarks/probe_gpu_profile.py), they price it
in place of the efficiency, and the calibration set judges them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..parts import mla
from ..parts.moe import MoeShapes, moe_intermediates
from ..parts.plain_attention import Pass, plain_attention
from ..parts.saved import runs_again
from ..parts.shapes import shard_bytes
from .moe import dispatch_einsums, permute_seconds

# FLOPs per causal query-key pair, forward and backward, by the platform's fused kernel (the
# kernels' own matmuls; see compiler/roofline.py), as (per unit of the query/key head_dim, per
# unit of the value's): forward QK^T and PV; splash's backward recomputes QK^T in its dq and
# its dkv kernel and dO V^T in both (4 + 4 per pair and head_dim when the two are alike, 14 in
# all), cuDNN's once (10), whose count other kernels take.
_ATTENTION = {"splash": ((2, 2), (8, 6)), "cudnn": ((2, 2), (6, 4))}


@dataclass(frozen=True)
class StepTime:
    """A step's seconds per device, term by term."""

    matmul: float  # projections and head, recompute included
    attention: float  # the flash kernels, or plain attention's matmuls
    memory_bound: float  # norms, rotary, gates, residuals, loss, optimizer update (and plain
    # attention's softmax)
    forward: float  # of matmul + attention + memory_bound, the forward pass's share
    hidden: float  # overlapping collectives inside granules (they hide up to the compute)
    exposed: float  # collectives that cannot overlap
    across_granules: float  # collectives over DCN or the scale-out network, exposed
    offload: float  # host-offload copies beyond what their pass hides
    seconds: float  # max(compute, hidden) + exposed + across_granules + offload

    @property
    def compute(self) -> float:
        return self.matmul + self.attention + self.memory_bound


def step_time(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    facts: DeviceFacts,
    *,
    efficiency: float,
    intensity: float | None,
    hidden: float,
    exposed: float,
    across_granules: float,
    offload_bytes: float,
    kept_bytes: float = 0.0,
    permute_share: float | None = None,
    layer_runs: float | None = None,
    moe_runs: float | None = None,
) -> StepTime:
    """The step's time on one device. `efficiency` and `intensity` are the named calibrations
    (`calibration`): the share of the peak a matmul reaches when its operands keep up (unless
    `facts` has the chip's measured shares), and the FLOPs a
    matmul does per byte it reads from HBM as the compiler tiles it (None: no limit).
    `hidden`, `exposed` and `across_granules` are the collectives' seconds (cost/parts/traffic.py),
    `offload_bytes` what goes to host memory and back each way in a step, `kept_bytes` what
    the layers keep on the device for one micro-batch's backward pass (the memory model's
    "activations"); `permute_share` the
    named calibration `permute_bandwidth` (None: no limit; cost/timing/moe.py); `layer_runs`
    the layers each micro-batch runs through (None: the model's; a pipeline stage's differ,
    cost/pipeline/stages.py), of them `moe_runs` MoE layers' (None: the model's).

    Every size below is one device's: a micro-batch's tokens, and the widths the tensor axis
    cuts (heads, kv heads, d_ff, the vocabulary and the residual stream's d_model)."""
    hbm = facts.need("hbm_bandwidth")
    # A chip whose peak outruns its HBM by more than the tiles' FLOPs per byte (its balance,
    # peak / bandwidth, above `intensity`) waits on its operands for that share of the time.
    fed = 1.0 if intensity is None else min(1.0, intensity * hbm / facts.peak_flops)
    # FLOP/s a matmul and an attention kernel reach: the chip's measured shares of its peak
    # where the catalogue has them, else the calibrated efficiency
    rate = facts.peak_flops * (facts.matmul_share or efficiency) * fed
    kernel_rate = facts.peak_flops * (facts.attention_share or efficiency) * fed
    rows_unit, cols_unit = facts.mxu or (1, 1)  # a TPU matrix unit: dims fill it in whole tiles
    act = dtype_bytes(train.compute_dtype)  # bytes of one activation element
    tensor, micro = roles.size("model"), train.microbatches
    rows = train.global_batch // roles.size("batch")  # sequences a device trains per step
    tokens = rows // micro * (model.seq_len // roles.size("seq"))  # of one micro-batch
    d_model, head_dim = model.d_model, model.head_dim
    layers = model.num_layers if layer_runs is None else layer_runs
    heads, kv_heads = model.num_heads // tensor, model.num_kv_heads // tensor
    d_ff, vocab = model.d_ff // tensor, model.vocab_size // tensor
    stream = d_model // tensor  # the residual stream's hidden dim is cut over the tensor axis
    q_width, kv_width = heads * head_dim, kv_heads * head_dim  # of q and k
    latent = model.attention == "mla"
    v_dim = model.v_head_dim if latent else head_dim  # of v and the attention's output
    # what rotary positions rotate per token: q and k, or latent attention's rope parts
    rotated = (heads * model.qk_rope_head_dim, model.qk_rope_head_dim) if latent else None

    def matmul(k: int, n: int) -> float:
        """[tokens, k] x [k, n]: its FLOPs at `rate` (the contraction and output dims padded to
        whole matrix-unit tiles), or where longer its operands' and result's bytes at HBM
        bandwidth (a matmul too thin for the matrix units)."""
        flops = 2.0 * tokens * _whole(k, rows_unit) * _whole(n, cols_unit)
        return max(flops / rate, (tokens * k + k * n + tokens * n) * act / hbm)

    # A layer's projections, forward; SwiGLU's input is two matmuls (gate and up), a
    # two-matrix MLP's one (up).
    inputs = 2 if model.mlp == "swiglu" else 1
    projections = {
        "query": matmul(d_model, q_width),
        "key": matmul(d_model, kv_width),
        "value": matmul(d_model, kv_width),
        "out_proj": matmul(q_width, d_model),
        "mlp_in": inputs * matmul(d_model, d_ff),
        "mlp_out": matmul(d_ff, d_model),
    }
    if latent:
        projections |= mla.projections(model, tensor, matmul)
    fwd_pair, bwd_pair = _ATTENTION.get(facts.traits.fused_attention, _ATTENTION["cudnn"])
    # causal query-key pairs of a micro-batch's rows on this device's share of the sequence
    pairs = rows // micro * _causal_pairs(model.seq_len) / roles.size("seq")
    # q, k, v read, output written
    kernel_bytes = tokens * (q_width + kv_width + (kv_heads + heads) * v_dim) * act

    # Each of the kernel's matmuls has head_dim as its contraction (QK^T) or output (PV, dQ, dK,
    # dV) dim: a head narrower than the matrix unit leaves the rest of it idle.
    unit = max(rows_unit, cols_unit)
    head_width, v_width = _whole(head_dim, unit), _whole(v_dim, unit)

    def attention(per_pair: tuple[int, int]) -> float:
        """One pass of the flash kernel: its FLOPs over the pairs, or its operands' bytes."""
        flops = pairs * heads * (per_pair[0] * head_width + per_pair[1] * v_width)
        return max(flops / kernel_rate, kernel_bytes / hbm)

    placed = train.placements
    again_ops = runs_again(train, parallel=model.parallel_block)
    recomputed = [op for op in again_ops if op in projections]
    attention_again = "attention_out" in again_ops
    layer_fwd = sum(projections.values())
    # Each matmul runs three times (forward; backward for the input's gradient and the
    # weight's), and once more where the backward pass recomputes its output.
    matmuls = layers * (3 * layer_fwd + sum(projections[op] for op in recomputed))
    moe = model.num_moe_layers if moe_runs is None else moe_runs
    permute = 0.0
    if moe:  # its dense layers as above, its MoE layers with their own MLP
        ms = MoeShapes.of(model, train, roles)

        # The dropless path's grouped kernel, where its rate was measured (GPU), and the rows
        # of the tile each group adds at its boundary (`PlatformTraits.grouped_tile_rows`).
        dropless = train.moe == "dropless"
        kernel = facts.grouped_matmul_share if dropless else None
        grouped_rate = facts.peak_flops * kernel * fed if kernel else rate
        boundary = facts.traits.grouped_tile_rows if dropless else 0

        def grouped(k: int, n: int) -> float:
            """A grouped matmul: each of the device's experts [its group's rows, k] x [k, n],
            priced as `matmul` prices a matmul of that height (a thin group reads its weights
            at HBM speed), at the grouped kernel's rate."""
            g = ms.group_rows + boundary
            flops = 2.0 * g * _whole(k, rows_unit) * _whole(n, cols_unit)
            return ms.groups * max(flops / grouped_rate, (g * k + k * n + g * n) * act / hbm)

        shared = model.num_shared_experts * model.moe_d_ff // tensor
        mixed = projections | {
            "mlp_in": matmul(d_model, model.num_experts)  # the router (float32: counted bf16)
            + 2 * grouped(d_model, ms.width)
            + (2 * matmul(d_model, shared) if shared else 0.0),
            "mlp_out": grouped(ms.width, d_model) + (matmul(shared, d_model) if shared else 0.0),
        }
        mlp_again = placed["mlp_in"] == "recompute"
        routing_fwd, routing = dispatch_einsums(  # the dropping path's one-hot einsums
            model, train, roles, rate=rate, hbm=hbm, mxu=(rows_unit, cols_unit),
            recomputed=mlp_again, einsums=facts.traits.capacity_dispatch == "einsum",
        )  # fmt: skip
        # the dropless path's gathers and scatters by row index: memory-bound, per layer
        permute = permute_seconds(
            model, train, roles, hbm=hbm, share=permute_share, recomputed=mlp_again
        )
        moe_fwd = sum(mixed.values())
        matmuls = (layers - moe) * (3 * layer_fwd + sum(projections[op] for op in recomputed))
        again_moe = [op for op in runs_again(train, moe=True) if op in mixed]
        matmuls += moe * (3 * moe_fwd + sum(mixed[op] for op in again_moe) + routing)
        layer_fwd = ((layers - moe) * layer_fwd + moe * (moe_fwd + routing_fwd)) / layers
    head = matmul(d_model, vocab)
    chunked = train.logits_chunks > 1  # each chunk's logits recomputed in the backward pass
    matmuls += head * (3 + chunked)
    kernels = layers * (attention(fwd_pair) * (1 + attention_again) + attention(bwd_pair))
    kernel_fwd = attention(fwd_pair)
    # a layer's and the loss's memory-bound bytes as counted here move at the chip's measured
    # share of its HBM bandwidth where the catalogue has one (GPU: XLA's fusions move more than
    # this count); the optimizer's update streams at the full bandwidth
    streamed = hbm * (facts.memory_share or 1.0)
    softmax = softmax_fwd = 0.0  # plain attention's memory-bound seconds: a layer's, forward
    if attention_kernel(train.attention, facts.platform) == "plain":
        # the whole square: a micro-batch's rows x heads x this device's queries x every key
        squares = rows // micro * heads * (model.seq_len // roles.size("seq")) * model.seq_len
        passes = plain_attention(model, train, widths=(head_width, v_width)).passes

        def plain(p: Pass) -> tuple[float, float]:
            """(matmul seconds, memory-bound seconds) of one of a layer's passes; a matmul
            reads or writes one score-sized tensor and two of the head-sized operands."""
            matmuls = sum(
                max(squares * f / rate, (squares * b + kernel_bytes / 2) / hbm)
                for f, b in p.matmuls
            )
            return matmuls, squares * p.elementwise / streamed

        priced = [plain(p) for p in passes]
        kernel_fwd, softmax_fwd = priced[0]
        kernels = layers * sum(m for m, _ in priced)
        softmax = sum(e for _, e in priced)

    # Memory-bound operations at HBM bandwidth: a layer's bytes per token, each pass, and the
    # loss's; the optimizer's update per parameter.
    rot_q, rot_k = rotated or (q_width, kv_width)
    extra_fwd, extra_bwd = mla.elementwise(model, tensor) if latent else (0, 0)
    fwd_elements, bwd_elements = _layer_elementwise(
        stream, rot_q, rot_k, d_ff, model.mlp, norms=model.norms
    )
    fwd_elements, bwd_elements = fwd_elements + extra_fwd, bwd_elements + extra_bwd
    elementwise_fwd, elementwise_bwd = fwd_elements * act, bwd_elements * act
    again = elementwise_fwd if recomputed or attention_again else 0  # the forward recomputed
    loss = _logits_accesses(chunked) * vocab * act
    per_token: float = layers * (elementwise_fwd + elementwise_bwd + again) + loss
    shard = model.num_params / (roles.size("fsdp") * tensor)  # parameters this device updates
    if moe:
        fwd_moe, bwd_moe = (
            (n + extra) * act
            for n, extra in zip(
                _moe_elementwise(model, train, roles, stream, rot_q, rot_k),
                (extra_fwd, extra_bwd),
                strict=True,
            )
        )
        moe_again = fwd_moe if recomputed or attention_again else 0
        per_token = (layers - moe) * (elementwise_fwd + elementwise_bwd + again) + loss
        per_token += moe * (fwd_moe + bwd_moe + moe_again)
    if model.num_experts:
        shard = float(shard_bytes(model, roles, 1, None))  # experts over the expert axis too
    update = shard * update_bytes(train)
    # What the layers keep for the backward pass is copied into the layer scan's stacks and
    # back out each micro-batch: 4 accesses of its bytes (profiled on one H100: the stacks'
    # update and slice fusions, 7.8 ms more under minimal_flash than full remat over 4 layers
    # of LLaMA-2 7B, about 4 x the bytes it keeps more, at HBM speed; benchmarks/RESULTS.md).
    stacks = 4 * kept_bytes / hbm
    memory = micro * (tokens * per_token / streamed + layers * softmax + moe * permute + stacks)
    memory += update / hbm
    compute = micro * (matmuls + kernels) + memory
    forward = micro * (
        layers * (layer_fwd + kernel_fwd + softmax_fwd + tokens * elementwise_fwd / streamed) + head
    )
    offload = 0.0
    overlaps = facts.traits.offload_overlaps_compute
    # without a host link bandwidth, TPU copies are priced as hidden: the estimate answers on
    # that condition (cost/conditions.py); copies that wait need the fact
    if offload_bytes and (facts.host_link_bandwidth is not None or not overlaps):
        each_way = offload_bytes / facts.need("host_link_bandwidth")
        if overlaps:
            offload = max(0.0, each_way - forward) + max(0.0, each_way - (compute - forward))
        else:
            offload = 2 * each_way
    return StepTime(
        matmul=micro * matmuls,
        attention=micro * kernels,
        memory_bound=memory,
        forward=forward,
        hidden=hidden,
        exposed=exposed,
        across_granules=across_granules,
        offload=offload,
        seconds=max(compute, hidden) + exposed + across_granules + offload,
    )


def _layer_elementwise(
    stream: int, q_width: int, kv_width: int, d_ff: int, mlp: str, *, norms: int = 2
) -> tuple[int, int]:
    """Activation elements a layer's memory-bound operations read and write per token, forward
    and backward. Forward: `norms` RMSNorms (two; a parallel block's one), each reading the
    stream and writing it, two residual adds (each reads two streams, writes one), rotary (q
    and k read and written), the MLP's activation: the SwiGLU gate (gate and up read, their
    product written), a two-matrix MLP's ReLU or GELU (up read, its activation written).
    Backward: each norm reads its input and its output's gradient and writes its input's, each
    add reads the two gradients it sums and writes the sum, rotary reads and writes the
    gradients of q and k, the gate reads gate, up and the product's gradient and writes the
    gradients of gate and up, a ReLU or GELU reads up (or its sign) and the activation's
    gradient and writes up's."""
    rotary = 2 * (q_width + kv_width)
    gate_fwd, gate_bwd = (3 * d_ff, 5 * d_ff) if mlp == "swiglu" else (2 * d_ff, 3 * d_ff)
    norms_fwd, adds_fwd = norms * (stream + stream), 2 * (2 * stream + stream)
    norms_bwd, adds_bwd = norms * 3 * stream, 2 * 3 * stream
    return norms_fwd + adds_fwd + rotary + gate_fwd, norms_bwd + adds_bwd + rotary + gate_bwd


def _moe_elementwise(
    model: ModelSpec, train: TrainSpec, roles: Roles, stream: int, q_width: int, kv_width: int
) -> tuple[float, float]:
    """A MoE layer's memory-bound elements per token, forward and backward: a dense layer's
    (`_layer_elementwise`) with the SwiGLU gate over the rows its experts compute (capacity
    padding included) and its shared experts, and every d_model-wide buffer of the block (the
    sorted copies, dispatch buffers, the experts' output, the results combined and unsorted,
    the weighted sum) written and read once each pass."""
    ms = MoeShapes.of(model, train, roles)
    shared = model.num_shared_experts * model.moe_d_ff // roles.size("model")
    width = ms.rows * ms.width / ms.tokens + shared
    fwd, bwd = _layer_elementwise(stream, q_width, kv_width, round(width), "swiglu")
    rows = train.global_batch // roles.size("batch")
    r, s = max(1, rows // train.microbatches), model.seq_len // roles.size("seq")
    found = moe_intermediates(model, train, roles, r, s)
    wide = sum(math.prod(shape) for shape, _ in found.values() if shape[-1] == model.d_model)
    return fwd + 2 * wide / ms.tokens, bwd + 2 * wide / ms.tokens


def _logits_accesses(chunked: bool) -> int:
    """How often the loss reads or writes the logits: written, read twice, their gradient read
    and written; chunked, each chunk's logits are recomputed in the backward pass (written and
    read once more)."""
    return 1 + 2 + 2 + 2 * chunked


def update_bytes(train: TrainSpec) -> int:
    """Bytes Adam's update moves per parameter: the parameter and its gradient read, both
    moments read and written, the parameter written; with micro-batches also the float32
    gradient accumulator read and written."""
    param, moment = dtype_bytes(train.param_dtype), dtype_bytes(train.opt_state_dtype)
    accumulator = 2 * dtype_bytes("float32") if train.microbatches > 1 else 0
    return 2 * param + 4 * moment + param + accumulator


def _whole(n: int, unit: int) -> int:
    """`n` rounded up to whole tiles of `unit`."""
    return -(-n // unit) * unit


def _causal_pairs(seq: int) -> float:
    """Query-key pairs a causal mask keeps: query i sees keys 0..i."""
    return seq * (seq + 1) / 2
