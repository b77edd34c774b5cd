"""A child of `loadax-mesh launch` for tests/multiprocess/test_pipeline_job.py: the tiny model
(four layers) trained by the reference step on a pipeline 2 x fsdp 4 mesh whose pipeline axis
spans the two processes (each process one stage of 4 CPU devices), under the schedule its
argument names ("gpipe" by default, or "1f1b"). Each host loads its rows of the batch by the
plan's batch axes; process 0 prints `step S loss L` for every step."""

from __future__ import annotations

import sys
from dataclasses import replace

from loadax_mesh import distributed

distributed.initialize()

import jax  # noqa: E402  (after initialize, which sets the CPU device count)
import numpy as np  # noqa: E402

import loadax_mesh as lm  # noqa: E402
from loadax_mesh.workload import ModelSpec, TrainSpec  # noqa: E402
from loadax_mesh.workload.step import make_step  # noqa: E402

MODEL = replace(ModelSpec.from_name("tiny"), num_layers=4)
TRAIN = TrainSpec(global_batch=8, learning_rate=1e-2, compute_dtype="float32")
STEPS = 3


def main() -> None:
    config = lm.MeshConfig((2, 4), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    plan = config.plan()
    assert plan.dcn_mesh_shape == (2, 1), plan.dcn_mesh_shape  # the stages across processes
    mesh = plan.to_jax_mesh()
    stage = {d.process_index for d in mesh.devices[jax.process_index()]}
    assert stage == {jax.process_index()}, stage
    schedule = sys.argv[1] if len(sys.argv) > 1 else "gpipe"
    train = replace(TRAIN, pipeline_schedule=schedule)
    step = make_step(mesh, MODEL, train, batch_axes=plan.batch_axis_names)
    assert step.stages is not None and step.stages.schedule == schedule
    params, opt = step.init(jax.random.key(0))
    # the batch of tests/workload/losses.py's step_losses: each host its rows of it
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, MODEL.vocab_size, (TRAIN.global_batch, MODEL.seq_len + 1))
    tokens = tokens.astype(np.int32)
    rows = lm.host_batch_slice(mesh, TRAIN.global_batch, plan.batch_axis_names)
    local = {
        "tokens": tokens[rows.start : rows.stop, :-1],
        "targets": tokens[rows.start : rows.stop, 1:],
    }
    batch = lm.shard_batch(local, mesh, plan.batch_axis_names)
    for s in range(1, STEPS + 1):
        params, opt, loss = step.fn(params, opt, batch)
        if jax.process_index() == 0:
            print(f"step {s} loss {float(loss)!r}", flush=True)


if __name__ == "__main__":
    main()
