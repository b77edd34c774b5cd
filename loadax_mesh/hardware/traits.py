"""What sets one platform apart from another, each difference a named trait.

A platform differs from another in ways the cost model, the compiler wing and the views each
need: whether memory is tiled, which fused attention kernel jax runs, whether the compiler
itself refuses a program that does not fit, how gradients and host offloads behave. Each is a
named trait here, so no module above tests a platform's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

Platform = Literal["tpu", "gpu", "cpu"]


@dataclass(frozen=True)
class PlatformTraits:
    """What sets one platform apart, each trait named for what it changes."""

    platform: Platform
    unit: str  # what one catalogue row counts: "chip", "GPU" or "device"
    granule: str  # what one granule of `granule="auto"` is called
    compiler: str  # whose compiler the compile-only devices run
    fused_attention: str  # jax's fused attention kernel here: "splash", "cudnn" or "xla"
    # jax's Pallas kernels for TPU (Mosaic: splash attention, megablox grouped matmuls) run here.
    mosaic_kernels: bool
    # How the dropless experts' grouped matmuls run (workload/kernels.py): "libtpu" (jax's
    # ragged_dot, which libtpu groups for the forward pass and the input gradient; its weight
    # gradient is a dense masked matmul over every expert), "tokamax" (its grouped kernels for
    # all three passes; XLA's GPU compiler would make ragged_dot dense) or "dense" (every
    # expert over every row, as XLA's CPU compiler lowers ragged_dot).
    grouped_matmul: str
    # Rows of one tile of that grouped kernel: the tile that straddles two groups' boundary is
    # computed for each, so every group adds up to one (tokamax 0.0.12's sm90 heuristic
    # block_m; 0 where the time model's calibration already holds the kernel's).
    grouped_tile_rows: int
    # The kernels pick their variant from the process's own device (tokamax: the default
    # device's compute capability; jax's cuDNN attention: whether the backend is CUDA), so
    # compiling for compile-only devices must present the target as that device.
    kernels_read_own_device: bool
    # How the capacity path's tokens reach their slots in the program the estimate prices: by
    # one-hot "einsum"s (MaxText's dropping runs, the TPU calibration set) or by "index" (the
    # reference step's scatter and gather, memory-bound: what a GPU step is refereed by).
    capacity_dispatch: str
    catalogue_facts: tuple[str, ...]  # the facts the catalogue gives per unit
    # TPU slices are granules joined over DCN: a hardware string may end in a slice count, and
    # jax's and AXLearn's hybrid meshes take slices (elsewhere processes) as granules.
    multislice: bool
    # GPUs sit in NVLink domains of one or more hosts; jax names a device's domain in its
    # slice_index.
    nvlink_domains: bool
    # A device has memory of its own (HBM); CPU devices share their host's.
    device_memory: bool
    # TPU memory holds arrays in whole tiles (the catalogue's memory_tile).
    tiled_memory: bool
    # libtpu refuses a program that exceeds its HBM and its own check counts what fits; XLA's
    # GPU compiler never refuses, so a GPU step is judged by its figures against the pool.
    compiler_judges_fit: bool
    # jax's GPU client preallocates a share of the GPU's memory as the pool a step runs in.
    preallocated_pool: bool
    # libtpu reduces data-parallel gradients after the layer loop, so the step holds a
    # compute-dtype copy of them (and, across slices, the embedding tables' gradients); XLA's
    # GPU compiler reduces each layer's inside the loop body (shared HLO: A3 7B, 4 layers).
    holds_reduced_gradients: bool
    # TPU host-offload copies run beside their own pass's compute; on GPU they wait
    # (measured on an H200: benchmarks/bench_gpu_step.py).
    offload_overlaps_compute: bool
    # The backward pass of a fully recomputed layer holds one sublayer's intermediates at a
    # time (the compiler's live ranges at the peak): libtpu's, and XLA's GPU compiler's (its
    # heap at the peak of GPT-3 175B's layer loop, one H200 compile-only: the MLP's recompute
    # beside the attention's residuals, not the whole layer's intermediates twice).
    one_sublayer_at_a_time: bool
    # libtpu also holds the weights one sublayer at a time (that sublayer's gathered and their
    # gradient, the other's gathered ahead); XLA's GPU compiler holds the whole layer's
    # weights gathered twice (prefetch) and once as their gradient before it is reduced.
    sublayer_weights: bool
    # Whether the count one sublayer at a time holds over a tensor axis: on GPU, where XLA runs
    # the tensor collectives in line, a layer cut over one holds more at its peak than one
    # sublayer's intermediates (compile-only H100/H200: LLaMA-3 70B at fsdp 64 x tensor 8 0.75
    # of the compiled step so counted, GPT-3 175B and Mistral 7B at tensor 8 0.93 and 0.88), so
    # there the whole layer's are counted as before.
    sublayer_over_tensor_axis: bool
    # With one layer XLA's loop simplifier removes the layer scan, and XLA's GPU compiler then
    # fuses each weight's compute-dtype gradient into its optimizer update: no float32 set of
    # gradient shards is held (GPT-3 175B cut to one layer, one H200 compile-only: a 12.95 GB
    # temp block with no float32 gradient in it; with two layers the scan's float32 gradient
    # stacks are all live). Not measured on libtpu.
    fuses_unlooped_gradients: bool
    # XLA's GPU compiler lays the routed experts' stacked parameters out a second time for the
    # whole step, so that each layer's slice gathers over fsdp as one block (fsdp shards their
    # d_model, not their slice's major dim): f32[layers, E, d / fsdp, f] copied as
    # [d / fsdp, layers, E, f] (Mixtral 8x7B over fsdp 8, compiled for H200s: XLA's heap).
    relayouts_experts: bool
    # libtpu overlaps most tensor-parallel collectives with matmuls: the backward pass's
    # gathers as async collective fusions, one reduce-scatter a pass as a windowed (collective)
    # matmul; only the forward's and the recompute's gathers and the other reductions wait
    # (a tensor-16 step, full and dots remat). XLA's GPU compiler runs them in line.
    overlaps_tensor_collectives: bool
    # The step gathers the q, k and v weights again for their input gradient where it
    # recomputes the projections, as MaxText's does: libtpu otherwise holds the recompute's
    # gathered copies through the MLP's backward (0.9 GB on GPT-3 175B at fsdp 256). Not
    # measured on GPU, where the step keeps them (its memory model was fitted so).
    regathers_attention_weights: bool
    # XLA's GPU compiler takes the unembedding's weight gradient after the backward layer loop
    # and sets up the input table's gradient before it: the logits' gradient and one table's
    # gradient (compute dtype) are live through the loop where their gradients are reduced
    # across devices (its live ranges: LLaMA-3 8B x2 layers over fsdp 8 at 16k and over fsdp
    # 2 x seq 4 at 64k, compile-only H100s; on one H200 it takes them at the head). libtpu
    # takes both at the head. Not measured under a pipeline (its own "kept logits").
    holds_head_gradients_in_loop: bool

    def compile_options(self, dump_dir: str) -> dict[str, Any] | None:
        """Options for `Lowered.compile`: where the compiler judges fit (libtpu), a dump
        directory, into which it writes its buffer assignment's memory report (what its own
        HBM check counts)."""
        return {"xla_dump_to": dump_dir} if self.compiler_judges_fit else None


_TRAITS: dict[Platform, PlatformTraits] = {
    "tpu": PlatformTraits(
        platform="tpu",
        unit="chip",
        granule="slice",
        compiler="libtpu",
        fused_attention="splash",
        mosaic_kernels=True,
        grouped_matmul="libtpu",
        grouped_tile_rows=0,
        kernels_read_own_device=False,
        capacity_dispatch="einsum",
        catalogue_facts=("hbm", "peak_bf16", "ici_bandwidth", "dcn_bandwidth"),
        multislice=True,
        nvlink_domains=False,
        device_memory=True,
        tiled_memory=True,
        compiler_judges_fit=True,
        preallocated_pool=False,
        holds_reduced_gradients=True,
        offload_overlaps_compute=True,
        one_sublayer_at_a_time=True,
        sublayer_weights=True,
        sublayer_over_tensor_axis=True,
        fuses_unlooped_gradients=False,
        relayouts_experts=False,
        overlaps_tensor_collectives=True,
        regathers_attention_weights=True,
        holds_head_gradients_in_loop=False,
    ),
    "gpu": PlatformTraits(
        platform="gpu",
        unit="GPU",
        granule="NVLink domain",
        compiler="XLA's CUDA client",
        fused_attention="cudnn",
        mosaic_kernels=False,
        grouped_matmul="tokamax",
        grouped_tile_rows=64,
        kernels_read_own_device=True,
        capacity_dispatch="index",
        catalogue_facts=("hbm", "peak_bf16", "nvlink_bandwidth", "network_per_gpu"),
        multislice=False,
        nvlink_domains=True,
        device_memory=True,
        tiled_memory=False,
        compiler_judges_fit=False,
        preallocated_pool=True,
        holds_reduced_gradients=False,
        offload_overlaps_compute=False,
        one_sublayer_at_a_time=True,
        sublayer_weights=False,
        sublayer_over_tensor_axis=False,
        fuses_unlooped_gradients=True,
        relayouts_experts=True,
        overlaps_tensor_collectives=False,
        regathers_attention_weights=False,
        holds_head_gradients_in_loop=True,
    ),
    "cpu": PlatformTraits(
        platform="cpu",
        unit="device",
        granule="process",
        compiler="XLA's CPU client",
        fused_attention="xla",
        mosaic_kernels=False,
        grouped_matmul="dense",
        grouped_tile_rows=0,
        kernels_read_own_device=False,
        capacity_dispatch="index",
        catalogue_facts=(),
        multislice=False,
        nvlink_domains=False,
        device_memory=False,
        tiled_memory=False,
        compiler_judges_fit=False,
        preallocated_pool=False,
        holds_reduced_gradients=False,
        offload_overlaps_compute=False,
        one_sublayer_at_a_time=False,
        sublayer_weights=False,
        sublayer_over_tensor_axis=False,
        fuses_unlooped_gradients=False,
        relayouts_experts=False,
        overlaps_tensor_collectives=False,
        regathers_attention_weights=False,
        holds_head_gradients_in_loop=False,
    ),
}


def platform_traits(platform: str) -> PlatformTraits:
    """The traits of a platform as jax names it ("tpu", "gpu"); any other platform's devices
    are plain devices in processes, as CPU's are."""
    return _TRAITS.get(cast(Platform, platform), _TRAITS["cpu"])


def attention_kernel(kind: str, platform: str) -> str:
    """What attention of `kind` runs as on `platform`: "plain" stays plain; otherwise jax's
    fused kernel there ("splash" on TPU, "cudnn" on GPU, "xla" elsewhere)."""
    return "plain" if kind == "plain" else platform_traits(platform).fused_attention
