"""Step time, term by term: what a device does below its peak (docs/design.md section 8).

- Matmuls: every projection of a layer and the head's, per micro-batch, forward, backward (its
  two matmuls, for the input and the weight gradient) and again where the remat placement
  recomputes it, each max(FLOPs / (peak x efficiency), bytes / HBM bandwidth): a matmul too
  thin for the matrix units reads its weights at HBM speed (the shape term).
- Attention: the flash kernel's FLOPs over the causal pairs, forward and backward (TPU:
  jax's splash kernels, whose dq and dkv kernels each recompute the scores: 14 FLOPs per
  pair and head_dim against the forward's 4; GPU: cuDNN's fused backward, 10), at the same
  efficiency, or its operands' bytes where that is longer.
- Memory-bound operations at HBM bandwidth: a layer's norms, rotary, SwiGLU gate and residual
  adds (forward, backward, and the forward again where a tensor is recomputed), the loss over
  the vocabulary and the optimizer's update of every parameter shard.
- Collectives (cost/traffic.py): those inside a granule that overlap hide behind the compute;
  those that feed the next operation are exposed; every collective across granules (DCN, the
  scale-out network) is exposed. The measured runs say so: MaxText's LLaMA-2 7B on A3 hosts
  runs its data-parallel reduction inside the layer loop, where its time at the network's
  rate would hide behind the backward pass, yet the step grows by 17-31% from 1 to 2-16 hosts
  (docs/facts/production_runs.md).
- Host offload: on TPU each direction's copies are DMAs beside the cores and hide behind their
  own pass (out: the forward, in: the backward); only what exceeds it is exposed (the v6e
  calibration runs all offload). On GPU both directions are counted exposed: on one H200 (jax
  0.11.2, benchmarks/bench_gpu_step.py) offloading added 40-80% of the transfers' serial time to
  the step, where hiding them would add none.

`efficiency` is the one fitted number: the share of the peak a step's matmuls and attention
kernels reach, a named calibration per platform (configs/calibration.toml), fitted by
benchmarks/bench_time.py on the calibration set alone.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache

from .._configs import config_path
from ..errors import MeshConfigError
from ..hardware.profile import DeviceFacts, Platform
from ..workload.layout import Roles
from ..workload.spec import ModelSpec, TrainSpec, dtype_bytes

# FLOPs per causal query-key pair and unit of head_dim, forward and backward, by the platform's
# fused kernel (the kernels' own matmuls; see compiler/roofline.py): splash's backward pass
# recomputes more than cuDNN's, whose count other kernels take.
_ATTENTION = {"splash": (4, 14), "cudnn": (4, 10)}


@dataclass(frozen=True)
class StepTime:
    """A step's seconds per device, term by term."""

    matmul: float  # projections and head, recompute included
    attention: float  # the flash kernels
    memory_bound: float  # norms, rotary, gates, residuals, loss, optimizer update
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
    hidden: float,
    exposed: float,
    across_granules: float,
    offload_bytes: float,
) -> StepTime:
    """The step's time on one device. `hidden`, `exposed` and `across_granules` are the
    collectives' seconds (cost/traffic.py), `offload_bytes` what goes to host memory and back
    each way in a step."""
    rate = facts.peak_flops * efficiency
    hbm = facts.need("hbm_bandwidth")
    cd = dtype_bytes(train.compute_dtype)
    m, M = roles.size("model"), train.microbatches
    rows = train.global_batch // roles.size("batch")
    seq = model.seq_len // roles.size("seq")
    t = rows // M * seq  # tokens of one micro-batch on one device
    d, hd, L = model.d_model, model.head_dim, model.num_layers
    h, kv, f, v = (
        model.num_heads // m,
        model.num_kv_heads // m,
        model.d_ff // m,
        model.vocab_size // m,
    )

    def matmul(k: int, n: int) -> float:
        return max(2.0 * t * k * n / rate, (t * k + k * n + t * n) * cd / hbm)

    ops = {
        "query": matmul(d, h * hd),
        "key": matmul(d, kv * hd),
        "value": matmul(d, kv * hd),
        "out_proj": matmul(h * hd, d),
        "mlp_in": 2 * matmul(d, f),
        "mlp_out": matmul(f, d),
    }
    fwd_pair, bwd_pair = _ATTENTION.get(facts.traits.fused_attention, _ATTENTION["cudnn"])
    pairs = rows // M * _causal_pairs(model.seq_len) / roles.size("seq")
    kernel_bytes = t * (2 * h + 2 * kv) * hd * cd

    def attention(per_pair: int) -> float:
        return max(pairs * h * hd * per_pair / rate, kernel_bytes / hbm)

    placed = train.placements
    recomputed = [op for op in ops if placed[op] == "recompute"]
    attention_again = placed["attention_out"] == "recompute"
    layer_fwd = sum(ops.values())
    matmuls = L * (3 * layer_fwd + sum(ops[op] for op in recomputed))
    head = matmul(d, v)
    chunked = train.logits_chunks > 1  # each chunk's logits recomputed in the backward pass
    matmuls += head * (3 + chunked)
    kernels = L * (attention(fwd_pair) * (1 + attention_again) + attention(bwd_pair))
    stream = d // m  # the residual stream's hidden dim is cut over the tensor axis
    elementwise_fwd = (10 * stream + 2 * (h + kv) * hd + 3 * f) * cd
    elementwise_bwd = (12 * stream + 2 * (h + kv) * hd + 5 * f) * cd
    again = elementwise_fwd if recomputed or attention_again else 0
    loss = (5 + 2 * chunked) * v * cd  # logits written, read twice; gradient read and written
    per_token = L * (elementwise_fwd + elementwise_bwd + again) + loss
    shard = model.num_params / (roles.size("fsdp") * m)
    pd, od = dtype_bytes(train.param_dtype), dtype_bytes(train.opt_state_dtype)
    update = shard * (2 * pd + 4 * od + pd + (M > 1) * 2 * 4)  # read p, g, m, v; write p, m, v
    memory = (M * t * per_token + update) / hbm
    compute = M * (matmuls + kernels) + memory
    forward = M * (L * (layer_fwd + attention(fwd_pair)) + head + t * L * elementwise_fwd / hbm)
    offload = 0.0
    if offload_bytes:
        each_way = offload_bytes / facts.need("host_link_bandwidth")
        if facts.traits.offload_overlaps_compute:
            offload = max(0.0, each_way - forward) + max(0.0, each_way - (compute - forward))
        else:
            offload = 2 * each_way
    return StepTime(
        matmul=M * matmuls,
        attention=M * kernels,
        memory_bound=memory,
        forward=forward,
        hidden=hidden,
        exposed=exposed,
        across_granules=across_granules,
        offload=offload,
        seconds=max(compute, hidden) + exposed + across_granules + offload,
    )


@cache
def calibration(name: str, platform: Platform) -> float:
    """A named calibration of configs/calibration.toml for a platform (measured runs cover TPU
    and GPU)."""
    with open(config_path("calibration.toml"), "rb") as f:
        table = tomllib.load(f).get(name, {})
    entry = table.get(platform)
    if entry is None:
        raise MeshConfigError(
            f"configs/calibration.toml has no {name} for {platform}; accepted: {sorted(table)}"
        )
    return float(entry["value"])


def _causal_pairs(seq: int) -> float:
    """Query-key pairs a causal mask keeps: query i sees keys 0..i."""
    return seq * (seq + 1) / 2
