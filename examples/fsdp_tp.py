"""FSDP + tensor parallel: `model` inside a host, `fsdp` over the rest of the granule.

    python examples/fsdp_tp.py                                           # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/fsdp_tp.py

A two-layer MLP in Megatron style: the hidden dimension is split over `model`, and each weight's
other dimension over `fsdp`; the batch is split over `data` and `fsdp`.
"""

from common import lm, train_mlp
from jax.sharding import PartitionSpec as P

specs = {"w1": P("fsdp", "model"), "w2": P("model", "fsdp")}
train_mlp(lm.MeshConfig.from_preset("fsdp_tp", tp=2), specs)
