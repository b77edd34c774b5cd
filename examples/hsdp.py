"""HSDP (PyTorch's hybrid sharded data parallel): shard inside a granule, replicate across.

    python examples/hsdp.py                                              # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/hsdp.py

Parameters are sharded over `shard` (inside one process here, a slice or NVLink domain on real
hardware) and replicated over `replicate` (across processes / slices); the batch is split over
both axes.
"""

from common import lm, mlp_loss, mlp_params, regression_rows, setup, train
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 64, 64

config = lm.MeshConfig.from_preset("hsdp")
mesh, rows = setup(config, GLOBAL_BATCH)
specs = {"w1": P(None, "shard"), "w2": P("shard", None)}  # fully sharded within a granule
train(
    mesh,
    mlp_params(FEATURES, HIDDEN),
    specs,
    mlp_loss,
    lambda i: regression_rows(rows, i, GLOBAL_BATCH, FEATURES),
    config.batch_axis_names,
    lr=0.5,
)
