"""Feed a data loader on many hosts: each host reads only its rows, `shard_batch` joins them.

    loadax-mesh launch --nprocs 2 --devices-per-process 4 -- python examples/data_loader.py
    loadax-mesh launch --nprocs 4 --devices-per-process 2 -- python examples/data_loader.py
    python examples/data_loader.py             # one process, 8 CPU devices
    python examples/data_loader.py --cluster   # a real cluster: jax.distributed.initialize()

The mesh is `data` x `model` with `model` = 2 inside a host. Every step, all hosts agree on the
global batch (the same shuffled example ids), each reads rows `host_batch_slice` gives it from a
random-access source, and `shard_batch` makes one global `jax.Array` per field. A small linear
model trains on it; the script checks that the global batch on the devices is exactly the
batch the ids name.
"""

from __future__ import annotations

import argparse
import os

from loadax_mesh import distributed

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--global-batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--cluster", action="store_true", help="join a real cluster's job")
args = parser.parse_args()
if distributed.launched() or args.cluster:
    distributed.initialize()  # before jax touches its devices
elif "device_count" not in os.environ.get("XLA_FLAGS", ""):  # one process: 8 CPU devices
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import loadax_mesh as lm  # noqa: E402
from loadax_mesh.jobs.batch import data_parallel_size  # noqa: E402

FEATURES, OUTPUTS, EXAMPLES = 16, 4, 100_000


class Source:
    """A random-access dataset (think ArrayRecord or a memory map): example i on demand."""

    def __init__(self) -> None:
        self.w_true = np.random.default_rng(0).standard_normal((FEATURES, OUTPUTS))

    def read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        x = np.stack([np.random.default_rng(int(i)).standard_normal(FEATURES) for i in ids])
        return {"x": x.astype(np.float32), "y": (x @ self.w_true).astype(np.float32)}


def main() -> None:
    config = lm.MeshConfig((-1, 2), ("data", "model"))
    mesh = config.create_device_mesh()
    axes = config.batch_axis_names
    rows = lm.host_batch_slice(mesh, args.global_batch, axes)
    me = jax.process_index()
    print(
        f"host {me}/{jax.process_count()}: mesh {dict(mesh.shape)}, data-parallel size "
        f"{data_parallel_size(mesh, axes)}, loads rows {rows.start}:{rows.stop} "
        f"(shard {rows.shard_index} of {rows.num_shards})",
        flush=True,
    )

    source = Source()
    w_sharding = NamedSharding(mesh, PartitionSpec(None, "model"))
    w = jax.device_put(jnp.zeros((FEATURES, OUTPUTS), jnp.float32), w_sharding)

    @jax.jit
    def train_step(w: jax.Array, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        def loss_fn(w: jax.Array) -> jax.Array:
            return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)

        loss, grad = jax.value_and_grad(loss_fn)(w)
        return w - 0.3 * grad, loss

    checksum = jax.jit(lambda b: b["x"].sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))
    order = np.random.default_rng(1234).permutation(EXAMPLES)  # the same on every host
    for step in range(args.steps):
        ids = order[step * args.global_batch : (step + 1) * args.global_batch]
        local = source.read(ids[rows.start : rows.stop])  # only this host's rows
        batch = lm.shard_batch(local, mesh, axes)
        w, loss = train_step(w, batch)
        expected = float(np.float32(source.read(ids)["x"].sum()))  # check: re-read them all
        assert np.isclose(float(checksum(batch)), expected, rtol=1e-4), "wrong global batch"
        if me == 0:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
