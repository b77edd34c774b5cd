"""DeepSpeed-style data x sequence parallel: `sequence_parallel` splits each sequence.

    python examples/dp_sp.py                                             # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/dp_sp.py

Axes are named as DeepSpeed names them. The batch world size is the data-parallel size only:
ranks of one sequence-parallel group share samples and each holds a slice of the sequence.
"""

import jax.numpy as jnp
import numpy as np
from common import jax, lm, regression_rows, setup, train
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

FEATURES, SEQ, GLOBAL_BATCH = 16, 32, 16

config = lm.MeshConfig.from_preset("dp_sp", sp=4)
mesh, rows = setup(config, GLOBAL_BATCH)
seq_sharding = NamedSharding(mesh, P("data_parallel", "sequence_parallel"))

rng = np.random.default_rng(0)
params = {"w": rng.standard_normal((FEATURES, FEATURES)).astype(np.float32) * 0.1}
specs = {"w": P()}


def loss_fn(p, batch):
    x = jax.lax.with_sharding_constraint(batch["x"], seq_sharding)  # tokens split over sp
    context = jnp.mean(x, axis=1, keepdims=True)  # a reduction across the sequence shards
    pred = jnp.tanh((x + context) @ p["w"])
    return jnp.mean((pred - batch["y"]) ** 2)


def make_batch(i):
    local = regression_rows(rows, i, GLOBAL_BATCH, FEATURES, seq=SEQ)
    ctx = local["x"].mean(axis=1, keepdims=True)
    w = np.random.default_rng(7).standard_normal((FEATURES, FEATURES)) / np.sqrt(FEATURES)
    local["y"] = np.tanh((local["x"] + ctx) @ w).astype(np.float32)
    return local


train(mesh, params, specs, loss_fn, make_batch, config.batch_axis_names, lr=0.5, steps=30)
