"""Batches: shard_batch on 8 CPU devices, host_batch_slice and shard_blocks on real and simulated
meshes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, PartitionSpec

import loadax_mesh as lm
from loadax_mesh.hardware.devices import SimulatedDevice
from loadax_mesh.jobs.batch import ShardBlocks, batch_sharding, data_parallel_size, shard_blocks
from tests.helpers import run_python
from tests.standins import cpu_processes


@dataclass(frozen=True, eq=False)
class Grid:
    """A mesh-like object with a hand-made device layout (hashable by identity)."""

    devices: np.ndarray
    axis_names: tuple[str, ...]


def grid(process_of: list[int], shape: tuple[int, ...], names: tuple[str, ...]) -> Grid:
    """Devices in mesh order, device i owned by process_of[i]."""
    devices = np.empty(len(process_of), dtype=object)
    devices[:] = [
        SimulatedDevice(id=i, platform="cpu", device_kind="cpu", process_index=p)
        for i, p in enumerate(process_of)
    ]
    return Grid(devices.reshape(shape), names)


def real_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.asarray(jax.devices()).reshape(shape), names)


# -- shard_batch --------------------------------------------------------------------------


def test_shard_batch_places_rows_by_batch_axes() -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    y = np.arange(16, dtype=np.int32)
    out = lm.shard_batch({"x": x, "y": (y,)}, mesh)
    assert set(out) == {"x", "y"} and isinstance(out["y"], tuple)
    assert out["x"].shape == (16, 3) and out["y"][0].shape == (16,)
    assert out["x"].sharding.spec == PartitionSpec("data")
    for shard in out["x"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), x[shard.index])
        row = shard.index[0].start // 4
        assert lm.coordinate(mesh, shard.device)["data"] == row


def test_shard_batch_orders_batch_axes_like_the_mesh() -> None:
    mesh = real_mesh((2, 2, 2), ("data", "fsdp", "model"))
    x = np.arange(8, dtype=np.float32)
    out = lm.shard_batch(x, mesh, ("fsdp", "data"))
    assert out.sharding.spec == PartitionSpec(("data", "fsdp"))
    assert batch_sharding(mesh, ["fsdp", "data"]).spec == PartitionSpec(("data", "fsdp"))
    for shard in out.addressable_shards:
        c = lm.coordinate(mesh, shard.device)
        k = c["data"] * 2 + c["fsdp"]
        assert shard.index[0] == slice(2 * k, 2 * k + 2)
    assert float(jax.jit(lambda a: a.sum())(out)) == float(x.sum())


def test_shard_batch_rejects_rows_that_do_not_divide() -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    with pytest.raises(lm.MeshConfigError, match=r"\['x'\] has 10 rows.*multiple of 4"):
        lm.shard_batch({"x": np.zeros((10, 2))}, mesh)


@pytest.mark.parametrize("leaf", [np.float32(1.0), np.zeros(()), [1, 2, 3, 4]])
def test_shard_batch_rejects_leaves_without_a_batch_dimension(leaf: Any) -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    with pytest.raises(lm.MeshConfigError, match="no leading batch dimension"):
        lm.shard_batch({"ok": np.zeros((4, 1)), "bad": leaf}, mesh)


@pytest.mark.parametrize(
    ("axes", "match"),
    [
        ("batch", "'batch', which is not a mesh axis"),
        (("data", "data"), "repeats a name"),
        ((), "non-empty tuple"),
        (("data", 3), "names 3"),
        (None, "non-empty tuple"),
    ],
)
def test_batch_axes_are_validated(axes: Any, match: str) -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    for call in (
        lambda: lm.shard_batch(np.zeros((8, 1)), mesh, axes),
        lambda: lm.host_batch_slice(mesh, 8, axes),
        lambda: data_parallel_size(mesh, axes),
    ):
        with pytest.raises(lm.MeshConfigError, match=match) as err:
            call()
        assert "batch_axis_names" in str(err.value)


# -- host_batch_slice and data_parallel_size -----------------------------------------------


def test_single_process_loads_every_row() -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    assert lm.host_batch_slice(mesh, 32) == lm.HostBatchSlice(0, 32, 0, 1)
    assert lm.host_batch_slice(mesh, 32, process_index=0).size == 32


def test_data_parallel_size_is_the_product_of_batch_axes() -> None:
    mesh = real_mesh((2, 2, 2), ("data", "fsdp", "model"))
    assert data_parallel_size(mesh) == 2
    assert data_parallel_size(mesh, ("fsdp", "data")) == 4
    assert data_parallel_size(mesh, ("data", "fsdp", "model")) == 8


@pytest.mark.parametrize("size", [0, -8, 6, 16.0, True, "16", None])
def test_global_batch_size_is_validated(size: Any) -> None:
    mesh = real_mesh((4, 2), ("data", "model"))
    with pytest.raises(lm.MeshConfigError, match="global_batch_size"):
        lm.host_batch_slice(mesh, size)


def test_two_hosts_with_data_across_them_load_halves() -> None:
    plan = lm.plan_mesh((-1, 2), cpu_processes(2, 4), axis_names=("data", "model"))
    assert plan.dcn_mesh_shape == (2, 1)
    assert [lm.host_batch_slice(plan, 64, process_index=p) for p in (0, 1)] == [
        lm.HostBatchSlice(0, 32, 0, 2),
        lm.HostBatchSlice(32, 64, 1, 2),
    ]


def test_spilled_dcn_split_gives_each_of_four_hosts_a_quarter() -> None:
    plan = lm.plan_mesh((2, 2, 2), cpu_processes(4, 2), axis_names=("data", "fsdp", "model"))
    assert plan.dcn_mesh_shape == (2, 2, 1)
    slices = [lm.host_batch_slice(plan, 16, ("data", "fsdp"), process_index=p) for p in range(4)]
    assert slices == [lm.HostBatchSlice(4 * p, 4 * p + 4, p, 4) for p in range(4)]
    # batch over `data` alone: hosts that differ only in `fsdp` hold the same rows
    halves = [lm.host_batch_slice(plan, 16, "data", process_index=p) for p in range(4)]
    assert halves == [
        lm.HostBatchSlice(8 * (p // 2), 8 * (p // 2) + 8, p // 2, 2) for p in range(4)
    ]


def test_model_axis_across_hosts_means_same_rows_same_shard() -> None:
    shape = lm.HybridMeshShape((4, 1), (1, 2))
    plan = lm.plan_mesh(shape, cpu_processes(2, 4), axis_names=("data", "model"))
    assert [lm.host_batch_slice(plan, 8, process_index=p) for p in (0, 1)] == [
        lm.HostBatchSlice(0, 8, 0, 1)
    ] * 2


def test_non_contiguous_rows_are_explained() -> None:
    # fsdp crosses processes but comes after data among the batch axes
    shape = lm.HybridMeshShape((2, 1), (1, 2))
    plan = lm.plan_mesh(shape, cpu_processes(2, 2), axis_names=("data", "fsdp"))
    with pytest.raises(lm.MeshConfigError, match=r"process 0 holds batch shards \[0, 2\]"):
        lm.host_batch_slice(plan, 8, ("data", "fsdp"), process_index=0)
    # each process still holds whole shards, so it can load the layout rows itself
    assert lm.host_batch_slice(plan, 8, "data", process_index=1) == lm.HostBatchSlice(0, 8, 0, 1)


def test_every_process_holding_its_own_shard() -> None:
    # devices (r, data=k) belong to process k: four processes, one shard each
    mesh = grid([0, 1, 2, 3, 0, 1, 2, 3], (2, 4), ("r", "data"))
    assert lm.host_batch_slice(mesh, 8, process_index=2) == lm.HostBatchSlice(4, 6, 2, 4)
    halves = grid([0, 0, 1, 1, 0, 0, 1, 1], (2, 4), ("r", "data"))
    assert lm.host_batch_slice(halves, 8, process_index=1) == lm.HostBatchSlice(4, 8, 1, 2)


def test_overlapping_ranges_are_an_error() -> None:
    # data shards per process: 0 -> {0, 1}, 1 -> {1, 2}, 2 -> {0, 1, 2}
    mesh = grid([0, 0, 1, 2, 1, 1, 2, 2, 2], (3, 3), ("r", "data"))
    with pytest.raises(lm.MeshConfigError, match=r"overlapping .*\[0, 2\) and \[0, 3\)"):
        lm.host_batch_slice(mesh, 9, process_index=0)


def test_ranges_of_different_lengths_are_an_error() -> None:
    # process 0 holds shard 0 (on two devices); process 1 holds shards 1, 2 and 3
    mesh = grid([0, 1, 1, 1, 0, 1, 1, 1], (2, 4), ("r", "data"))
    with pytest.raises(lm.MeshConfigError, match=r"different lengths \[1, 3\]"):
        lm.host_batch_slice(mesh, 8, process_index=0)


@pytest.mark.parametrize("process_index", [2, -1, True, 1.0])
def test_process_index_is_validated(process_index: Any) -> None:
    plan = lm.plan_mesh((-1,), cpu_processes(2, 2), axis_names=("data",))
    with pytest.raises(lm.MeshConfigError, match="process_index"):
        lm.host_batch_slice(plan, 8, process_index=process_index)


# -- shard_blocks: the layout behind host_batch_slice and the CLI's rows per host ------------


def test_shard_blocks_by_hand() -> None:
    # (r, data) mesh, devices row-major; process of each device:
    processes = np.array([[0, 0, 1, 1], [2, 2, 3, 3]])
    assert shard_blocks(processes, [1]) == {
        0: ShardBlocks(0, ((0, 2),), 0, 2),
        1: ShardBlocks(1, ((2, 4),), 1, 2),
        2: ShardBlocks(2, ((0, 2),), 0, 2),
        3: ShardBlocks(3, ((2, 4),), 1, 2),
    }
    # batch over both axes: each process holds its own two shards
    both = shard_blocks(processes, [0, 1])
    assert [(b.blocks, b.shard_index, b.num_shards) for b in both.values()] == [
        (((2 * p, 2 * p + 2),), p, 4) for p in range(4)
    ]


def test_shard_blocks_keeps_several_blocks_in_row_order() -> None:
    # data (size 2) crosses no process, fsdp (size 2) crosses processes: shards 0, 2 and 1, 3
    processes = np.array([[0, 1], [0, 1]])
    held = shard_blocks(processes, [0, 1])
    assert held == {
        0: ShardBlocks(0, ((0, 1), (2, 3)), 0, 2),
        1: ShardBlocks(1, ((1, 2), (3, 4)), 1, 2),
    }
    assert held[1].count == 2 and held[1].shards() == [1, 3]
    assert held[1].rows(4) == ((4, 8), (12, 16))


def test_shard_blocks_number_sets_as_sorted_shard_lists() -> None:
    # batch over rows: process 0 holds shards {0, 1, 3}, process 1 holds {0, 1, 2}, and
    # [0, 1, 2] comes before [0, 1, 3] (as blocks, ((0, 2), (3, 4)) would sort first)
    held = shard_blocks(np.array([[0, 1], [0, 1], [1, 1], [0, 0]]), [0])
    assert held[0].blocks == ((0, 2), (3, 4)) and held[1].blocks == ((0, 3),)
    assert (held[0].shard_index, held[1].shard_index, held[0].num_shards) == (1, 0, 2)


def test_batch_imports_no_jax() -> None:
    code = (
        "import sys\nimport numpy as np\nfrom loadax_mesh.jobs.batch import shard_blocks\n"
        "shard_blocks(np.zeros((2, 2), int), [0])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))"
    )
    assert run_python(code) == "[]\n"


def brute_force_rows(mesh: Any, axes: tuple[str, ...], global_batch: int) -> dict[int, set[int]]:
    """Per process, the rows its devices hold: one device at a time, in plain Python."""
    names = list(mesh.axis_names)
    batch = [a for a in names if a in axes]
    sizes = dict(zip(names, mesh.devices.shape, strict=True))
    shards = int(np.prod([sizes[a] for a in batch]))
    per = global_batch // shards
    rows: dict[int, set[int]] = {}
    for index in np.ndindex(*mesh.devices.shape):
        k = 0
        for a in batch:
            k = k * sizes[a] + index[names.index(a)]
        rows.setdefault(mesh.devices[index].process_index, set()).update(
            range(k * per, (k + 1) * per)
        )
    return rows


@settings(max_examples=60, deadline=None)
@given(
    procs=st.sampled_from([1, 2, 4, 8]),
    perm=st.permutations(range(3)),
    batch_mask=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_slices_agree_with_a_per_device_count(
    procs: int, perm: list[int], batch_mask: int, seed: int
) -> None:
    names = ("a", "b", "c")
    sizes = [(2, 2, 4), (4, 2, 2), (2, 4, 2)][seed % 3]
    process_of = [i * procs // 16 for i in range(16)]
    order = np.random.default_rng(seed).permutation(16) if seed % 2 else np.arange(16)
    shape = tuple(sizes[i] for i in perm)
    mesh = grid([process_of[i] for i in order], shape, names)
    axes = tuple(n for bit, n in enumerate(names) if batch_mask >> bit & 1)
    truth = brute_force_rows(mesh, axes, 64)
    positions = sorted(names.index(a) for a in axes)
    processes = np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices)
    held = shard_blocks(processes, positions)
    assert list(held) == sorted(truth)
    for p, blocks in held.items():
        rows = blocks.rows(64 // data_parallel_size(mesh, axes))
        assert [r for lo, hi in rows for r in range(lo, hi)] == sorted(truth[p])
        assert all(a[1] < b[0] for a, b in itertools.pairwise(rows))  # blocks are maximal
    try:
        slices = {p: lm.host_batch_slice(mesh, 64, axes, process_index=p) for p in truth}
    except lm.MeshConfigError as err:
        spans = {p: (min(r), max(r) + 1) for p, r in truth.items()}
        gaps = any(
            len(r) != hi - lo for r, (lo, hi) in zip(truth.values(), spans.values(), strict=True)
        )
        overlap = any(
            a != b and a[0] < b[1] and b[0] < a[1] for a in spans.values() for b in spans.values()
        )
        unequal = len({hi - lo for lo, hi in spans.values()}) > 1
        assert gaps or overlap or unequal, str(err)
        return
    for p, s in slices.items():
        assert set(range(s.start, s.stop)) == truth[p]
        assert (s.shard_index, s.num_shards) == (held[p].shard_index, held[p].num_shards)
    starts = sorted({s.start for s in slices.values()})
    for s in slices.values():
        assert s.num_shards == len(starts) and s.shard_index == starts.index(s.start)
