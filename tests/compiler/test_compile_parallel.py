"""A parallel block compiled by libtpu: fewer activation collectives over the tensor axis than
a sequential layer, as the cost model counts them (the counts themselves were read from a
tensor-16 step of model width: benchmarks/probes/probe_overlap.py --parallel)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, estimate
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec

SEQUENTIAL = replace(
    ModelSpec.from_name("tiny"),
    name="tiny-2023",
    num_layers=2,
    num_kv_heads=8,
    head_dim=32,
    tied_embeddings=True,
    mlp="relu",
)


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_a_parallel_block_runs_fewer_tensor_collectives(remat):
    plan = MeshConfig.from_preset("fsdp_tp").plan(topology_devices("tpu-v5litepod-8"))
    train = TrainSpec(global_batch=8, remat=remat)
    activation = 8 // 2 * SEQUENTIAL.seq_len * SEQUENTIAL.d_model * 2  # fsdp 2 x model 4

    def compiled(model: ModelSpec) -> Counter[str]:
        runs: Counter[str] = Counter()
        for c in compile_step(plan, model, train).collectives:
            if c.axes == ("model",) and c.bytes == activation:
                runs["gather" if c.kind == "all-gather" else "reduce"] += c.count
        return runs

    def estimated(model: ModelSpec) -> Counter[str]:
        runs: Counter[str] = Counter()
        for c in estimate(plan, model, train).axes["model"].collectives:
            runs["gather" if c.kind == "all-gather" else "reduce"] += c.count
        return runs

    parallel = replace(SEQUENTIAL, parallel_block=True)
    for count in (compiled, estimated):
        seq, par = count(SEQUENTIAL), count(parallel)
        assert par["gather"] < seq["gather"] and par["reduce"] <= seq["reduce"], (count, seq, par)
