"""Step time, as a sum of priced parts: what a device does below its peak (docs/design.md
section 8; the evidence for each term: docs/cost-terms.md).

- Matmuls (timing/matmuls.py) and attention kernels (timing/attention.py) at the calibrated
  share of the peak, or at their operands' bytes where that is longer; memory-bound operations
  (timing/memory_bound.py) at HBM bandwidth.
- Collectives (parts/traffic.py, priced by timing/axes.py): those inside a granule that
  overlap hide behind the compute, those that feed the next operation are exposed, and every
  collective across granules is exposed.
- Host offload: on TPU each direction's copies hide behind their own pass (out: the forward,
  in: the backward) and only what exceeds it is exposed; on GPU both directions wait.

step = max(compute, hidden) + exposed + across granules + exposed offload. `efficiency` and
`intensity` are named calibrations per platform (configs/calibration.toml, fitted by
benchmarks/bench_time.py on the calibration set alone); where the catalogue has a chip's
measured shares of its peak and HBM bandwidth, they price it in place of the efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from ..parts.saved import runs_again
from .attention import attention
from .device import Device
from .matmuls import matmuls
from .memory_bound import logits_accesses, memory_bound


@dataclass(frozen=True)
class Compute:
    """A step's compute seconds by kind; parts add and subtract kind by kind (the pipelined
    step is the step outside its stages plus a stage's layers, less what both count)."""

    matmul: float  # projections and head, recompute included
    attention: float  # the flash kernels, or plain attention's matmuls
    memory_bound: float  # norms, rotary, gates, residuals, loss, optimizer update (and plain
    # attention's softmax)
    forward: float  # of the three, the forward pass's share

    @property
    def seconds(self) -> float:
        return self.matmul + self.attention + self.memory_bound

    def __add__(self, other: Compute) -> Compute:
        return Compute(
            self.matmul + other.matmul,
            self.attention + other.attention,
            self.memory_bound + other.memory_bound,
            self.forward + other.forward,
        )

    def __sub__(self, other: Compute) -> Compute:
        return Compute(
            self.matmul - other.matmul,
            self.attention - other.attention,
            self.memory_bound - other.memory_bound,
            self.forward - other.forward,
        )


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

    @property
    def work(self) -> Compute:
        """The compute part alone."""
        return Compute(self.matmul, self.attention, self.memory_bound, self.forward)

    @classmethod
    def of(
        cls,
        work: Compute,
        waits: tuple[float, float, float],
        *,
        compute: float | None = None,
        offload: float = 0.0,
    ) -> StepTime:
        """The step of `work` beside its collectives' (hidden, exposed, across-granule)
        seconds; `compute` the compute seconds as summed by the caller (None: `work.seconds`)."""
        hidden, exposed, across = waits
        total = work.seconds if compute is None else compute
        return cls(
            matmul=work.matmul,
            attention=work.attention,
            memory_bound=work.memory_bound,
            forward=work.forward,
            hidden=hidden,
            exposed=exposed,
            across_granules=across,
            offload=offload,
            seconds=max(total, hidden) + exposed + across + offload,
        )


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
    `facts` has the chip's measured shares), and the FLOPs a matmul does per byte it reads
    from HBM as the compiler tiles it (None: no limit). `hidden`, `exposed` and
    `across_granules` are the collectives' seconds, `offload_bytes` what goes to host memory
    and back each way in a step, `kept_bytes` what the layers keep on the device for one
    micro-batch's backward pass (the memory model's "activations"); `permute_share` the named
    calibration `permute_bandwidth` (None: no limit; timing/moe.py); `layer_runs` the layers
    each micro-batch runs through (None: the model's; a pipeline stage's differ), of them
    `moe_runs` MoE layers' (None: the model's)."""
    d = Device.of(
        model, train, roles, facts, efficiency=efficiency, intensity=intensity,
        layer_runs=layer_runs,
    )  # fmt: skip
    moe = model.num_moe_layers if moe_runs is None else moe_runs
    again = "attention_out" in runs_again(train, parallel=model.parallel_block)
    mm = matmuls(model, train, roles, facts, d, moe=moe, permute_share=permute_share)
    att = attention(model, train, roles, facts, d, again=again)
    memory, elementwise_fwd = memory_bound(
        model, train, roles, d, moe=moe, again=mm.recomputes or again, softmax=att.softmax,
        permute=mm.permute, kept_bytes=kept_bytes,
    )  # fmt: skip
    micro, layers, streamed = d.micro, d.layers, d.streamed
    layer_fwd = mm.layer_forward + att.forward + att.softmax_forward
    forward = micro * (layers * (layer_fwd + d.tokens * elementwise_fwd / streamed) + mm.head)
    work = Compute(micro * mm.seconds, micro * att.seconds, memory, forward)
    compute = micro * (mm.seconds + att.seconds) + memory
    offload = _offload(facts, offload_bytes, forward, compute)
    waits = (hidden, exposed, across_granules)
    return StepTime.of(work, waits, compute=compute, offload=offload)


def head_time(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    facts: DeviceFacts,
    *,
    efficiency: float,
    intensity: float | None,
) -> Compute:
    """The head's part of `step_time`, priced as there: its matmul (forward, both gradients,
    the forward again with logits chunks) and the loss's memory-bound passes over the logits,
    every micro-batch (a 1F1B pipeline runs it on its last stage, cost/pipeline/time.py)."""
    d = Device.of(
        model, train, roles, facts, efficiency=efficiency, intensity=intensity, layer_runs=0
    )
    chunked = train.logits_chunks > 1
    head = d.matmul(model.d_model, d.vocab)
    loss = d.tokens * logits_accesses(chunked) * d.vocab * d.act / d.streamed
    return Compute(d.micro * head * (3 + chunked), 0.0, d.micro * loss, d.micro * head)


def _offload(facts: DeviceFacts, each_way_bytes: float, forward: float, compute: float) -> float:
    """What host-offload copies add to the step: on TPU each direction beyond its pass's
    compute (out: the forward, in: the rest), elsewhere both directions in full. Without a
    host link bandwidth TPU copies are priced as hidden: the estimate answers on that
    condition (cost/conditions.py); copies that wait need the fact."""
    overlaps = facts.traits.offload_overlaps_compute
    if not each_way_bytes or (facts.host_link_bandwidth is None and overlaps):
        return 0.0
    each_way = each_way_bytes / facts.need("host_link_bandwidth")
    if overlaps:
        return max(0.0, each_way - forward) + max(0.0, each_way - (compute - forward))
    return 2 * each_way
