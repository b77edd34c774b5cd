"""HSDP (PyTorch's hybrid sharded data parallel): shard inside a granule, replicate across.

    python examples/hsdp.py                                              # 8 local CPU devices
    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/hsdp.py

Parameters are sharded over `shard` (inside one process here, a slice or NVLink domain on real
hardware) and replicated over `replicate` (across processes / slices); the batch is split over
both axes.
"""

from common import lm, train_mlp
from jax.sharding import PartitionSpec as P

specs = {"w1": P(None, "shard"), "w2": P("shard", None)}  # fully sharded within a granule
train_mlp(lm.MeshConfig.from_preset("hsdp"), specs)
