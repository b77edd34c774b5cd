"""HSDP (PyTorch's hybrid sharded data parallel): shard inside a granule, replicate across.

    python examples/hsdp.py                                              # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/hsdp.py

Parameters are sharded over `shard` (inside one process here, a slice or NVLink domain on real
hardware) and replicated over `replicate` (across processes / slices); the batch is split over
both axes.
"""

import jax.numpy as jnp
import numpy as np
from common import lm, regression_rows, show, train
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 64, 64

config = lm.MeshConfig.from_preset("hsdp")
plan = config.plan()
show(plan)
mesh = plan.to_jax_mesh()
rows = lm.host_batch_slice(mesh, GLOBAL_BATCH, config.batch_axis_names)

rng = np.random.default_rng(0)
params = {
    "w1": rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32) * 0.1,
    "w2": rng.standard_normal((HIDDEN, FEATURES)).astype(np.float32) * 0.1,
}
specs = {"w1": P(None, "shard"), "w2": P("shard", None)}  # fully sharded within a granule


def loss_fn(p, batch):
    pred = jnp.tanh(batch["x"] @ p["w1"]) @ p["w2"]
    return jnp.mean((pred - batch["y"]) ** 2)


train(
    mesh,
    params,
    specs,
    loss_fn,
    lambda i: regression_rows(rows, i, GLOBAL_BATCH, FEATURES),
    config.batch_axis_names,
    lr=0.5,
)
