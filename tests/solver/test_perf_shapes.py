"""The fast paths give the general paths' answers.

`read_devices` reads every device in one ufunc pass and converts one slice's coords when every
slice lists the same positions; `_torus_members` skips sorting when devices come granule by
granule. Shuffled, re-ordered and odd device sets take the general paths: the table must equal
one read attribute by attribute, and the plan must not change.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest

import loadax_mesh as lm
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.hardware.devices import dense_rank, read_devices
from tests.standins import gpu_nodes, tpu_slices


def reference_table(devices) -> dict:
    """The table's definition, read device by device."""
    slices = [getattr(d, "slice_index", None) for d in devices]
    tpu = devices[0].platform == "tpu"
    coords = [getattr(d, "coords", None) for d in devices]
    with_coords = tpu and all(c is not None for c in coords)
    return {
        "ids": [d.id for d in devices],
        "process_index": [d.process_index for d in devices],
        "slice_index": None if None in slices else slices,
        "coords": [list(c) for c in coords] if with_coords else None,
        "core_on_chip": [getattr(d, "core_on_chip", 0) for d in devices] if with_coords else None,
        "kind": (devices[0].platform, devices[0].device_kind),
    }


def no_optional(d, *keep):
    """A device with only the required attributes (as jax's CPU devices), plus `keep`."""
    names = ("id", "process_index", "platform", "device_kind", *keep)
    return SimpleNamespace(**{name: getattr(d, name) for name in names})


TPU = tpu_slices((2, 2, 2), num_slices=3)


@pytest.mark.parametrize(
    "devices",
    [
        tpu_slices((4, 4, 4), num_slices=3),
        tpu_slices((2, 2, 4), num_slices=2, kind="TPU7x", cores_per_chip=2),
        gpu_nodes(4),
        gpu_nodes(2, with_slice_index=False),
        # Real TPU devices give coords as a list, a new one on every read.
        [dataclasses.replace(d, coords=list(d.coords)) for d in TPU],
        [no_optional(d) for d in TPU],  # no optional attribute at all
        [*TPU[:-1], no_optional(TPU[-1], "coords")],  # the last lacks slice_index
        [no_optional(d, "slice_index", "coords") for d in TPU],  # no core_on_chip: 0
        [*TPU[:-1], dataclasses.replace(TPU[-1], coords=None)],
        np.array(TPU, dtype=object).reshape(3, -1),
    ],
)
def test_the_table_holds_every_device_attribute(devices):
    table = read_devices(devices)
    devices = list(np.asarray(devices, dtype=object).flat)
    want = reference_table(devices)
    assert list(table.devices) == devices
    for field in ("ids", "process_index", "slice_index", "coords", "core_on_chip"):
        got = getattr(table, field)
        assert (got is None) == (want[field] is None), field
        if got is not None:
            assert got.tolist() == want[field], field
    assert (table.platform, table.device_kind) == want["kind"]


def test_slices_listed_differently_still_read_right():
    devices = tpu_slices((4, 4, 2), num_slices=3)
    per = len(devices) // 3
    second = devices[per : 2 * per]
    random.Random(0).shuffle(second)  # slice 1 lists its chips in another order
    devices = devices[:per] + second + devices[2 * per :]
    table = read_devices(devices)
    assert np.array_equal(table.coords, np.array([d.coords for d in devices]))


def test_device_order_does_not_change_the_plan():
    devices = tpu_slices((4, 4, 4), num_slices=2)
    shuffled = devices[:]
    random.Random(1).shuffle(shuffled)  # granules interleaved: the sorting path
    shape = lm.HybridMeshShape((4, 4, 4), (2, 1, 1))
    names = ("data", "fsdp", "model")
    a = lm.plan_mesh(shape, devices, axis_names=names).devices
    b = lm.plan_mesh(shape, shuffled, axis_names=names).devices
    key = np.vectorize(lambda d: (d.slice_index, d.coords, d.core_on_chip), otypes=[object])
    assert (key(a) == key(b)).all()


def test_sparse_slice_and_device_ids():
    devices = [
        dataclasses.replace(d, id=d.id * 1_000_003 + 7, slice_index=10 * d.slice_index + 5)
        for d in tpu_slices((2, 2, 2), num_slices=3)
    ]
    plan = lm.plan_mesh(lm.HybridMeshShape((8,), (3,)), devices, axis_names=("data",))
    assert plan.num_granules == 3
    assert sorted(d.id for d in plan.devices.flat) == sorted(d.id for d in devices)
    assert dense_rank(np.array([50, 7, 7, 1_000_000_000, 50])).tolist() == [1, 0, 0, 2, 1]


def test_bad_device_sets_are_errors():
    devices = tpu_slices((2, 2, 1))
    twice = [*devices, devices[0]]
    with pytest.raises(MeshConfigError, match="more than once"):
        read_devices(twice)
    far = [dataclasses.replace(d, id=d.id * 10**9) for d in devices] + [
        dataclasses.replace(devices[1], id=10**9)
    ]
    with pytest.raises(MeshConfigError, match="more than once"):
        read_devices(far)  # ids far apart: the sorting check
    mixed = [*devices[:3], dataclasses.replace(devices[3], device_kind="TPU v5 lite")]
    with pytest.raises(MeshConfigError, match="mix platforms"):
        read_devices(mixed)
    ragged = [*devices[:3], dataclasses.replace(devices[3], coords=(1, 1))]
    with pytest.raises(MeshConfigError, match="coords of different lengths"):
        read_devices(ragged)
    no_slice = [dataclasses.replace(d, slice_index=None) for d in devices]
    with pytest.raises(MeshConfigError, match="more than once"):
        read_devices([*no_slice, no_slice[0]])
    with pytest.raises(MeshConfigError, match="id=None"):
        read_devices([*devices[:3], dataclasses.replace(devices[3], id=None)])
    with pytest.raises(MeshConfigError, match="process_index='0'"):
        read_devices([dataclasses.replace(devices[0], process_index="0"), *devices[1:]])
    with pytest.raises(MeshConfigError, match=r"id=2\.5"):
        read_devices([dataclasses.replace(devices[0], id=2.5), *devices[1:]])
    with pytest.raises(MeshConfigError, match=f"id={2**70}"):
        read_devices([*devices[:3], dataclasses.replace(devices[3], id=2**70)])
    with pytest.raises(MeshConfigError, match="slice_index='a'"):
        read_devices([*devices[:3], dataclasses.replace(devices[3], slice_index="a")])
    with pytest.raises(MeshConfigError, match="coords is no sequence"):
        read_devices([*devices[:3], dataclasses.replace(devices[3], coords=7)])
    with pytest.raises(MeshConfigError, match="no attribute 'device_kind'"):
        read_devices([*devices[:3], SimpleNamespace(id=3, process_index=0, platform="tpu")])


def test_tpu_devices_without_positions_fall_back_to_listing_order():
    devices = [dataclasses.replace(d, coords=None) for d in tpu_slices((2, 2, 1))]
    table = read_devices(devices)
    assert table.coords is None and table.slice_index is not None
    plan = lm.plan_mesh((4,), devices, axis_names=("data",))
    assert plan.layout.torus is None
    assert [d.id for d in plan.devices] == [0, 1, 2, 3]
