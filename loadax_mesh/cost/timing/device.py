"""One device's view of a step, for pricing it: the rates its matmuls and attention kernels
reach, and the sizes of one micro-batch on it (its tokens, and the widths the tensor axis cuts:
heads, kv heads, d_ff, the vocabulary and the residual stream's d_model)."""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes


@dataclass(frozen=True, kw_only=True)
class Device:
    """The rates (FLOP/s, bytes/s) and one micro-batch's sizes on one device."""

    hbm: float  # HBM bandwidth
    fed: float  # the share of its peak a chip's HBM can feed (`intensity`)
    rate: float  # FLOP/s of a matmul
    kernel_rate: float  # FLOP/s of an attention kernel
    streamed: float  # bytes/s of a layer's memory-bound operations
    mxu: tuple[int, int]  # a matrix unit's rows and columns (1, 1: none)
    act: int  # bytes of one activation element
    tensor: int  # the tensor axis's size
    micro: int  # gradient-accumulation micro-batches
    rows: int  # sequences the device trains per step
    tokens: int  # of one micro-batch, on the device's share of the sequence
    layers: float  # layers a micro-batch runs through
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    stream: int  # the residual stream's hidden dim, cut over the tensor axis
    q_width: int  # of q (and the attention's input to the output projection)
    kv_width: int  # of k
    v_dim: int  # of v and the attention's output, a head
    rotated: tuple[int, int] | None  # what rotary rotates a token: latent attention's rope parts

    @classmethod
    def of(
        cls,
        model: ModelSpec,
        train: TrainSpec,
        roles: Roles,
        facts: DeviceFacts,
        *,
        efficiency: float,
        intensity: float | None,
        layer_runs: float | None,
    ) -> Device:
        """`efficiency` and `intensity` the named calibrations (timing/step.py); `layer_runs`
        the layers a micro-batch runs through (None: the model's)."""
        hbm = facts.need("hbm_bandwidth")
        # A chip whose peak outruns its HBM by more than the tiles' FLOPs per byte (its
        # balance, peak / bandwidth, above `intensity`) waits on its operands for that share.
        fed = 1.0 if intensity is None else min(1.0, intensity * hbm / facts.peak_flops)
        tensor, micro = roles.size("model"), train.microbatches
        rows = train.global_batch // roles.size("batch")
        heads, kv_heads = model.num_heads // tensor, model.num_kv_heads // tensor
        latent = model.attention == "mla"
        return cls(
            hbm=hbm,
            fed=fed,
            # the chip's measured shares of its peak where the catalogue has them, else the
            # calibrated efficiency
            rate=facts.peak_flops * (facts.matmul_share or efficiency) * fed,
            kernel_rate=facts.peak_flops * (facts.attention_share or efficiency) * fed,
            # the catalogue's measured share of HBM bandwidth for a layer's memory-bound bytes
            # as counted here (GPU: XLA's fusions move more than this count)
            streamed=hbm * (facts.memory_share or 1.0),
            mxu=facts.mxu or (1, 1),
            act=dtype_bytes(train.compute_dtype),
            tensor=tensor,
            micro=micro,
            rows=rows,
            tokens=rows // micro * (model.seq_len // roles.size("seq")),
            layers=model.num_layers if layer_runs is None else layer_runs,
            heads=heads,
            kv_heads=kv_heads,
            d_ff=model.d_ff // tensor,
            vocab=model.vocab_size // tensor,
            stream=model.d_model // tensor,
            q_width=heads * model.head_dim,
            kv_width=kv_heads * model.head_dim,
            v_dim=model.v_head_dim if latent else model.head_dim,
            rotated=(heads * model.qk_rope_head_dim, model.qk_rope_head_dim) if latent else None,
        )

    def matmul(self, k: int, n: int) -> float:
        """[tokens, k] x [k, n]: its FLOPs at `rate` (the contraction and output dims padded to
        whole matrix-unit tiles), or where longer its operands' and result's bytes at HBM
        bandwidth (a matmul too thin for the matrix units)."""
        rows_unit, cols_unit = self.mxu
        flops = 2.0 * self.tokens * whole(k, rows_unit) * whole(n, cols_unit)
        tokens = self.tokens
        return max(flops / self.rate, (tokens * k + k * n + tokens * n) * self.act / self.hbm)


def whole(n: int, unit: int) -> int:
    """`n` rounded up to whole tiles of `unit`."""
    return -(-n // unit) * unit
