"""A parallel block priced as it runs: one norm, the output projection never recomputed or
saved, and the tensor-parallel collectives its compiled step shows (cost/parts/traffic.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.parts.flops import op_flops
from loadax_mesh.workload import ModelSpec, TrainSpec

SEQUENTIAL = ModelSpec(
    "small-2023", 2, 1024, 4096, 8, 8, 128, 1024, 128, tied_embeddings=True, mlp="relu"
)
PARALLEL = replace(SEQUENTIAL, parallel_block=True)
L = SEQUENTIAL.num_layers


def tensor(model, hardware="tpu-v5p-16", **recipe):
    plan = MeshConfig.from_preset("fsdp_tp", tp=2).plan(simulate_devices(hardware))
    e = estimate(plan, model, TrainSpec(global_batch=8, **recipe))
    return e, {c.what: (c.kind, c.count, c.overlaps) for c in e.axes["model"].collectives}


def test_tensor_collectives_of_a_parallel_block_follow_its_compile():
    """Per layer (probe_overlap.py --parallel): under full remat 2 gathers and 2 reductions
    wait (a sequential layer: 4 and 3), 4 gathers and 2 reductions hide; under dots 3 and 2
    wait (as a sequential layer), 2 reductions hide; on GPU all of them wait. Outside the
    layers 3 gathers, a reduction and the lookup's all-reduce, as for a sequential layer."""
    full = tensor(PARALLEL, remat="full")[1]
    assert full["hidden-cut activations"] == ("all-gather", 2 * L + 3, False)
    assert full["backward gathers beside matmuls"] == ("all-gather", 4 * L, True)
    assert full["block outputs and gradients"] == ("reduce-scatter", 2 * L + 1, False)
    assert full["windowed-matmul reductions"] == ("reduce-scatter", 2 * L, True)
    dots = tensor(PARALLEL, remat="dots")[1]
    assert dots["hidden-cut activations"] == ("all-gather", 3 * L + 3, False)
    assert dots["backward gathers beside matmuls"][1] == 0
    assert dots["block outputs and gradients"] == ("reduce-scatter", 2 * L + 1, False)
    gpu = tensor(PARALLEL, "gpu-a3-highgpu-8g-16", remat="full")[1]
    assert gpu["hidden-cut activations"] == ("all-gather", 6 * L + 3, False)
    assert gpu["block outputs and gradients"] == ("reduce-scatter", 4 * L + 1, False)
    sequential = tensor(SEQUENTIAL, remat="full")[1]
    assert sequential["hidden-cut activations"][1] == 4 * L + 3


def test_the_parallel_block_waits_less_and_recomputes_no_output_projection():
    s = SEQUENTIAL.seq_len
    (par, _), (seq, _) = tensor(PARALLEL, remat="full"), tensor(SEQUENTIAL, remat="full")
    assert par.axes["model"].exposed_seconds < seq.axes["model"].exposed_seconds
    # the recompute: the whole layer but the down projection, and (parallel) the output one
    tokens_per_device = 8 * s / 4 / 2  # fsdp 4 x tensor 2: 2 rows a device, over 2 of tensor
    out_proj = op_flops(PARALLEL)["out_proj"]
    per_layer = (seq.recompute_flops - par.recompute_flops) / (tokens_per_device * L)
    assert per_layer == pytest.approx(out_proj)
    # one norm a layer: d_model fewer weights, and fewer bytes for its float32 input and output
    # (on GPU: on TPU the sequential layer's MLP phase leaves out q, k and v, which its step
    # gathers again, layout.regathered, and the parallel block's holds them)
    assert SEQUENTIAL.num_params - PARALLEL.num_params == L * SEQUENTIAL.d_model
    gpu = [tensor(m, "gpu-a3-highgpu-8g-16", remat="full")[0] for m in (PARALLEL, SEQUENTIAL)]
    assert gpu[0].memory_bytes < gpu[1].memory_bytes


def test_dots_saves_no_output_projection_of_a_parallel_block():
    """The output projection only feeds the sum added to the residual: autodiff keeps nothing
    of it, as of the down projection, so a recipe that saves it saves nothing more."""
    keep = {"out_proj": "device"}
    par = [tensor(PARALLEL, remat=r)[0].terms["activations"] for r in ("full", keep)]
    seq = [tensor(SEQUENTIAL, remat=r)[0].terms["activations"] for r in ("full", keep)]
    assert par[0] == par[1] and seq[1] > seq[0]
