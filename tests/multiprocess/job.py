"""A child of `loadax-mesh launch` for tests/multiprocess: `python job.py CASE`.

Every case builds its mesh with loadax_mesh, checks that all processes built the same mesh,
loads this host's rows of a known global batch, shards them with `shard_batch`, and checks a
jitted global sum (a cross-process all-reduce over gloo) against the sum of the data.
"""

from __future__ import annotations

import os
import sys
import time

from loadax_mesh import distributed

distributed.initialize()

import jax  # noqa: E402  (after initialize, which sets the CPU device count)
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import loadax_mesh as lm  # noqa: E402

GLOBAL_BATCH = 32
FEATURES = 3
PROCESS_GROUPS = {
    "data": {"data": [(0, 1)] * 2, "model": [(0,), (0,), (1,), (1,)]},
    "spill": {("data", "fsdp"): [(0, 1, 2, 3)] * 2, "model": [(0,), (1,), (2,), (3,)]},
    "model": {"model": [(0, 1)] * 4, "data": [(0,), (1,)]},
}


def _config(case: str) -> tuple[lm.MeshConfig, tuple[int, ...]]:
    """The mesh of each case and the DCN split the planner must give it."""
    if case == "data":  # 2 x 4: data across processes
        return lm.MeshConfig((-1, 2), ("data", "model")), (2, 1)
    if case == "spill":  # 4 x 2: the DCN split spills from data onto fsdp
        return lm.MeshConfig((2, 2, 2), ("data", "fsdp", "model"), ("data", "fsdp")), (2, 2, 1)
    if case == "model":  # 2 x 4: model across processes
        shape = lm.HybridMeshShape((4, 1), (1, 2))
        return lm.MeshConfig(shape, ("data", "model")), (1, 2)
    raise SystemExit(f"unknown case {case!r}")


def _expected_slice(case: str, process: int) -> lm.HostBatchSlice:
    n = jax.process_count()
    if case == "model":
        return lm.HostBatchSlice(0, GLOBAL_BATCH, 0, 1)
    rows = GLOBAL_BATCH // n
    return lm.HostBatchSlice(process * rows, (process + 1) * rows, process, n)


def _check_same_mesh(mesh: jax.sharding.Mesh) -> None:
    ids = np.asarray(mesh.device_ids).ravel()
    every = np.asarray(multihost_utils.process_allgather(ids))
    assert every.shape == (jax.process_count(), ids.size), every.shape
    assert (every == ids).all(), f"processes built different meshes: {every.tolist()}"
    assert sorted(ids.tolist()) == sorted(d.id for d in jax.devices())


def run(case: str) -> None:
    me = jax.process_index()
    config, dcn = _config(case)
    plan = config.plan()
    assert plan.dcn_mesh_shape == dcn, (plan.dcn_mesh_shape, dcn)
    mesh = plan.to_jax_mesh()
    _check_same_mesh(mesh)

    batch_axes = config.batch_axis_names
    got = lm.host_batch_slice(mesh, GLOBAL_BATCH, batch_axes)
    assert got == _expected_slice(case, me), got

    full_x = np.arange(GLOBAL_BATCH * FEATURES, dtype=np.float32).reshape(GLOBAL_BATCH, FEATURES)
    full_y = np.arange(GLOBAL_BATCH, dtype=np.int32) * 7
    local = {"x": full_x[got.start : got.stop], "y": full_y[got.start : got.stop]}
    batch = lm.shard_batch(local, mesh, batch_axes)
    assert batch["x"].shape == full_x.shape and batch["y"].shape == full_y.shape
    for shard in batch["x"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full_x[shard.index])

    replicated = NamedSharding(mesh, PartitionSpec())
    total = jax.jit(lambda b: (b["x"].sum(), b["y"].sum()), out_shardings=replicated)(batch)
    assert float(total[0]) == float(full_x.sum()), (float(total[0]), float(full_x.sum()))
    assert int(total[1]) == int(full_y.sum()), (int(total[1]), int(full_y.sum()))

    # process groups, as every process sees them
    for axes, groups in PROCESS_GROUPS[case].items():
        assert lm.process_groups(mesh, axes) == groups, (axes, lm.process_groups(mesh, axes))
        assert jax.local_devices()[0] in lm.submesh(mesh, axes).devices.flat
    print(
        f"OK {case}: rows {got.start}:{got.stop} shard {got.shard_index}/{got.num_shards}",
        flush=True,
    )


def fail() -> None:
    """Process 1 fails; the others wait in a collective that can only end when it is killed."""
    if jax.process_index() == 1:
        raise RuntimeError("process 1 fails on purpose")
    multihost_utils.sync_global_devices("never reached by process 1")
    print("UNREACHABLE", flush=True)


def end(how: str) -> None:
    """Process 1 ends by `how` at once; process 0 sleeps (a short while when process 1 exits
    with 0, which must not stop it)."""
    if jax.process_index() == 1:
        if how == "sys.exit":
            sys.exit(3)
        if how == "os._exit":
            os._exit(5)
        if how == "exit 0":
            sys.exit(0)
        raise RuntimeError("process 1 fails on purpose")
    time.sleep(2 if how == "exit 0" else 300)
    print("survived", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "fail":
        fail()
    elif sys.argv[1] == "end":
        end(sys.argv[2])
    else:
        run(sys.argv[1])
