"""The fast paths give the general paths' answers.

`read_devices` reads TPU devices in one ufunc pass and converts one slice's coords when
every slice lists the same positions; `_torus_members` skips sorting when devices come granule
by granule. Shuffled, re-ordered and odd device sets take the general paths: the table and the
plan must not change.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import loadax_mesh as lm
from loadax_mesh.devices import _read_each, dense_rank, read_devices
from loadax_mesh.errors import MeshConfigError
from tests.standins import gpu_nodes, tpu_slices


def same_table(a, b) -> None:
    assert list(a.devices) == list(b.devices)
    for field in ("ids", "process_index", "slice_index", "coords", "core_on_chip"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        if x is not None:
            assert np.array_equal(x, y), field
    assert (a.platform, a.device_kind) == (b.platform, b.device_kind)


@pytest.mark.parametrize(
    "devices",
    [
        tpu_slices((4, 4, 4), num_slices=3),
        tpu_slices((2, 2, 4), num_slices=2, kind="TPU7x", cores_per_chip=2),
        gpu_nodes(4),
        gpu_nodes(2, with_slice_index=False),
        # Real TPU devices give coords as a list, a new one on every read.
        [
            dataclasses.replace(d, coords=list(d.coords))
            for d in tpu_slices((2, 2, 2), num_slices=3)
        ],
    ],
)
def test_one_pass_reader_matches_the_general_reader(devices):
    same_table(read_devices(devices), _read_each(devices))


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


def test_bad_device_sets_are_errors_on_both_paths():
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
        read_devices([*no_slice, no_slice[0]])  # the general reader checks too


def test_tpu_devices_without_positions_fall_back_to_listing_order():
    devices = [dataclasses.replace(d, coords=None) for d in tpu_slices((2, 2, 1))]
    table = read_devices(devices)
    assert table.coords is None and table.slice_index is not None
    plan = lm.plan_mesh((4,), devices, axis_names=("data",))
    assert plan.layout.torus is None
    assert [d.id for d in plan.devices] == [0, 1, 2, 3]
