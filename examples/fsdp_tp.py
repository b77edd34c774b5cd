"""FSDP + tensor parallel: `model` inside a host, `fsdp` over the rest of the granule.

    python examples/fsdp_tp.py                                           # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/fsdp_tp.py

A two-layer MLP in Megatron style: the hidden dimension is split over `model`, and each weight's
other dimension over `fsdp`; the batch is split over `data` and `fsdp`.
"""

from common import lm, mlp_loss, mlp_params, regression_rows, setup, train
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 64, 64

config = lm.MeshConfig.from_preset("fsdp_tp", tp=2)
mesh, rows = setup(config, GLOBAL_BATCH)
specs = {"w1": P("fsdp", "model"), "w2": P("model", "fsdp")}
train(
    mesh,
    mlp_params(FEATURES, HIDDEN),
    specs,
    mlp_loss,
    lambda i: regression_rows(rows, i, GLOBAL_BATCH, FEATURES),
    config.batch_axis_names,
    lr=0.5,
)
