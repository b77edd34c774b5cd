"""FSDP + tensor parallel: `model` inside a host, `fsdp` over the rest of the granule.

    python examples/fsdp_tp.py                                           # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/fsdp_tp.py

A two-layer MLP in Megatron style: the hidden dimension is split over `model`, and each weight's
other dimension over `fsdp`; the batch is split over `data` and `fsdp`.
"""

import jax.numpy as jnp
import numpy as np
from common import lm, regression_rows, show, train
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 64, 64

config = lm.MeshConfig.from_preset("fsdp_tp", tp=2)
plan = config.plan()
show(plan)
mesh = plan.to_jax_mesh()
rows = lm.host_batch_slice(mesh, GLOBAL_BATCH, config.batch_axis_names)

rng = np.random.default_rng(0)
params = {
    "w1": rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32) * 0.1,
    "w2": rng.standard_normal((HIDDEN, FEATURES)).astype(np.float32) * 0.1,
}
specs = {"w1": P("fsdp", "model"), "w2": P("model", "fsdp")}


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
