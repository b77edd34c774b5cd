"""One device's view of a step, for pricing it: the rates its matmuls and attention kernels
reach, and the sizes of one micro-batch on it (its tokens, and the widths the tensor axis cuts:
heads, kv heads, d_ff, the vocabulary and the residual stream's d_model).

With `TrainSpec.quantization` the projections' and MLP matmuls run on 1-byte operands at the
precision's peak (`DeviceFacts.matmul_peak`: refused by name where the chip has none) times a
share: the chip's measured share of that peak where the catalogue has it, else the share its
bf16 matmuls reach times the calibrated `quantized_share` (cost/calibration.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..calibration import quantized_share


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
    quantized: bool = False  # the projections' and MLP matmuls run in low precision
    q_rate: float = 0.0  # FLOP/s of such a matmul
    q_act: int = 1  # bytes of one of its operands' elements (fp8, int8)

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
        rate = facts.peak_flops * (facts.matmul_share or efficiency) * fed
        act = dtype_bytes(train.compute_dtype)
        q_rate = _quantized_rate(train.quantization, facts, efficiency, intensity, hbm, act)
        tensor, micro = roles.size("model"), train.microbatches
        rows = train.global_batch // roles.size("batch")
        heads, kv_heads = model.num_heads // tensor, model.num_kv_heads // tensor
        latent = model.attention == "mla"
        return cls(
            hbm=hbm,
            fed=fed,
            # the chip's measured shares of its peak where the catalogue has them, else the
            # calibrated efficiency
            rate=rate,
            kernel_rate=facts.peak_flops * (facts.attention_share or efficiency) * fed,
            # the catalogue's measured share of HBM bandwidth for a layer's memory-bound bytes
            # as counted here (GPU: XLA's fusions move more than this count)
            streamed=hbm * (facts.memory_share or 1.0),
            mxu=facts.mxu or (1, 1),
            act=act,
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
            quantized=q_rate is not None,
            q_rate=rate if q_rate is None else q_rate,
        )

    def matmul(self, k: int, n: int) -> float:
        """[tokens, k] x [k, n]: its FLOPs at `rate` (the contraction and output dims padded to
        whole matrix-unit tiles), or where longer its operands' and result's bytes at HBM
        bandwidth (a matmul too thin for the matrix units)."""
        rows_unit, cols_unit = self.mxu
        flops = 2.0 * self.tokens * whole(k, rows_unit) * whole(n, cols_unit)
        tokens = self.tokens
        return max(flops / self.rate, (tokens * k + k * n + tokens * n) * self.act / self.hbm)

    def projection(self, k: int, n: int) -> float:
        """A projection or MLP matmul: `matmul`, or with quantized operands their 1-byte
        elements at the quantized rate (the result in the compute dtype)."""
        if not self.quantized:
            return self.matmul(k, n)
        rows_unit, cols_unit = self.mxu
        flops = 2.0 * self.tokens * whole(k, rows_unit) * whole(n, cols_unit)
        t = self.tokens
        moved = (t * k + k * n) * self.q_act + t * n * self.act
        return max(flops / self.q_rate, moved / self.hbm)


def _quantized_rate(
    quantization: str,
    facts: DeviceFacts,
    efficiency: float,
    intensity: float | None,
    hbm: float,
    act: int,
) -> float | None:
    """FLOP/s of a quantized projection or MLP matmul (None unquantized): the precision's peak
    times the chip's measured share of it, else the share its bf16 matmuls reach times the
    calibrated `quantized_share`; fed as `Device.fed` with 1-byte operands (a tile does the same
    FLOPs per element on `act` times fewer bytes: `act` x `intensity` FLOPs per byte)."""
    if quantization == "none":
        return None
    peak = facts.matmul_peak(quantization)
    measured = facts.quantized_share(quantization)
    share = measured or (facts.matmul_share or efficiency) * quantized_share(
        facts.platform, quantization
    )
    fed = 1.0 if intensity is None else min(1.0, act * intensity * hbm / peak)
    return peak * share * fed


def whole(n: int, unit: int) -> int:
    """`n` rounded up to whole tiles of `unit`."""
    return -(-n // unit) * unit
