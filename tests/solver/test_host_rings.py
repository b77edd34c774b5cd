"""Host-contiguous rings: each host's chips consecutive along an axis, at no ring-efficiency cost.

The reference for "no cost" is the same plan with the host block switched off (the rings the
solver gives without it), computed in each test on the same devices.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loadax_mesh as lm
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.solver import hybrid
from loadax_mesh.solver.hostrings import host_cells
from loadax_mesh.solver.torus import solve_torus
from tests.solver.test_torus import _random_shape, is_bijection, measure
from tests.standins import tpu_slices

HARDWARE = [
    "tpu-v5p-512",
    "tpu-v5p-128",
    "tpu-v4-256",
    "tpu-v5litepod-256",
    "tpu-v5litepod-256-4",
    "tpu-7x-128",
]
HOST = (2, 2, 1)


def plans(hardware: str, preset: str, monkeypatch) -> tuple[lm.MeshPlan, lm.MeshPlan]:
    """(the plan, the same plan with no host block given to the solver)."""
    devices = lm.simulate_devices(hardware)
    config = lm.MeshConfig.from_preset(preset)
    plan = config.plan(devices, selector=hardware)
    with monkeypatch.context() as m:
        m.setattr(hybrid, "_host_block", lambda owner: None)
        plain = config.plan(devices, selector=hardware)
    return plan, plain


@pytest.mark.parametrize("preset", ["fsdp", "hsdp"])
@pytest.mark.parametrize("hardware", HARDWARE)
def test_presets_give_every_host_one_contiguous_range(hardware, preset, monkeypatch):
    plan, plain = plans(hardware, preset, monkeypatch)
    torus = plan.layout.torus
    assert torus is not None and torus.host_block == HOST
    assert all(torus.host_contiguous)
    assert plain.layout.torus is not None and plain.layout.torus.host_block is None
    ours, theirs = plan.quality(), plain.quality()
    for name in plan.axis_names:
        assert ours[name].efficiency == theirs[name].efficiency, name
        assert ours[name].hops == theirs[name].hops, name
    shards = plan.data_parallel_size
    batch = 2 * shards
    processes = sorted({d.process_index for d in plan.devices.flat})
    ranges = []
    for p in processes:
        got = lm.host_batch_slice(plan, batch, plan.batch_axis_names, process_index=p)
        ranges.append((got.start, got.stop))
    per_host = batch * (plan.devices.size // len(processes)) // shards
    assert all(stop - start == per_host for start, stop in ranges)
    assert sorted(ranges) == [(i, i + per_host) for i in range(0, batch, per_host)]


@pytest.mark.parametrize(
    ("hardware", "preset"), [("tpu-v5p-512", "fsdp"), ("tpu-v5litepod-256-4", "hsdp")]
)
def test_without_the_host_block_these_hosts_were_split(hardware, preset, monkeypatch):
    """Why the host block matters: the plain rings split hosts on these cases."""
    _, plain = plans(hardware, preset, monkeypatch)
    batch = 2 * plain.data_parallel_size
    with pytest.raises(MeshConfigError, match="contiguous"):
        for p in range(plain.devices.size):
            lm.host_batch_slice(plain, batch, plain.batch_axis_names, process_index=p)


# -- the host block read from the devices ------------------------------------------------------


def test_host_block_is_read_from_the_processes():
    devices = lm.simulate_devices("tpu-v5p-128")
    plan = lm.plan_mesh((64,), devices, axis_names=("data",))
    assert plan.layout.torus is not None and plan.layout.torus.host_block == HOST
    one_host = lm.plan_mesh((4,), tpu_slices((2, 2, 1)), axis_names=("data",))
    assert one_host.layout.torus is not None and one_host.layout.torus.host_block == HOST


def test_processes_that_do_not_tile_in_boxes_give_no_host_block():
    devices = lm.simulate_devices("tpu-v5p-128")  # 4x4x4 chips, 16 hosts of 2x2x1
    owner = np.empty((1, 4, 4, 4, 1), np.int64)
    for d in devices:
        owner[(0, *d.coords, 0)] = d.process_index
    assert hybrid._host_block(owner) == HOST
    x, y, z = np.indices((4, 4, 4))
    diagonal = ((x + y) % 4 + 4 * z).reshape(1, 4, 4, 4, 1)  # 4 chips each, but no box
    assert hybrid._host_block(diagonal) is None
    rows = (y + 4 * z).reshape(1, 4, 4, 4, 1)  # 4x1x1 boxes do tile
    assert hybrid._host_block(rows) == (4, 1, 1)
    twice = owner.copy()
    twice[twice == 1] = 0  # process 0 holds two boxes
    assert hybrid._host_block(twice) is None
    far = owner * 1_000_003 + 7  # sparse process indices: the sorting check
    assert hybrid._host_block(far) == HOST
    far[far == 7] = 1_000_010
    assert hybrid._host_block(far) is None
    ragged = owner.copy()
    ragged[0, 0, 0, 0, 0] = 5  # one chip of process 0 given to process 5
    assert hybrid._host_block(ragged) is None


def test_a_host_block_that_does_not_tile_is_an_error():
    with pytest.raises(MeshConfigError, match=r"host_block=\(3, 2, 1\)"):
        solve_torus((4, 4, 4), (64,), wrap=(True,) * 3, host_block=(3, 2, 1))


def test_impossible_cases_keep_the_plain_ring_and_say_so():
    """2x2x4 without wraparound: the four 2x2 layers form a line, so no ring through them all
    visits each layer once; the plain ring (efficiency 1.0) stays and is reported."""
    wrap = (False,) * 3
    plain = solve_torus((2, 2, 4), (16,), wrap=wrap)
    ours = solve_torus((2, 2, 4), (16,), wrap=wrap, host_block=HOST)
    assert ours.host_contiguous == (False,)
    assert np.array_equal(ours.order, plain.order)
    assert plain.host_contiguous == (None,)


def test_host_cells_need_aligned_factors():
    chip = solve_torus((6, 1, 1), (3, 2), wrap=(False,) * 3).rings
    inner = chip[1].chip  # the later axis takes x's inner 2: aligned with 2-chip hosts
    assert host_cells(inner, (2, 1, 1)) == (2,)
    assert host_cells(chip[0].chip, (2, 1, 1)) == (1,)
    assert host_cells(inner, (3, 1, 1)) is None  # hosts of 3 straddle the 2-chip lines


# -- random tori (hypothesis) ------------------------------------------------------------------


def host_of(positions: np.ndarray, chip: tuple[int, ...], cores: int) -> np.ndarray:
    x, y, z, _ = np.unravel_index(positions, (*chip, cores))
    return (x // 2) * chip[1] * chip[2] + (y // 2) * chip[2] + z


even_tori = st.tuples(
    st.sampled_from([2, 4, 6, 8]),
    st.sampled_from([2, 4, 6, 8]),
    st.sampled_from([1, 2, 3, 4]),
    st.tuples(st.booleans(), st.booleans(), st.booleans()),
    st.sampled_from([1, 1, 2]),
)


@settings(max_examples=150, deadline=None)
@given(even_tori)
def test_single_axis_lifted_rings(torus):
    x, y, z, wrap, cores = torus
    chip = (x, y, z)
    count = math.prod(chip) * cores
    plain = solve_torus(chip, (count,), wrap=wrap, cores_per_chip=cores)
    ours = solve_torus(chip, (count,), wrap=wrap, cores_per_chip=cores, host_block=HOST)
    assert is_bijection(ours.order, count)
    (q_plain,) = measure(plain.order, chip, wrap, cores)
    (q,) = measure(ours.order, chip, wrap, cores)
    assert q.hops == ours.rings[0].hops <= q_plain.hops
    if all(wrap[:2]) and min(x, y) >= 4 and z != 3:
        assert ours.host_contiguous == (True,)  # an even coarse torus: always liftable
    if not ours.host_contiguous[0]:
        assert np.array_equal(ours.order, plain.order)
        return
    ring = ours.order.ravel()
    if q_plain.hops == math.prod(chip):  # every step one hop before: so it is now
        coords = np.stack(np.unravel_index(ring // cores, chip), axis=1)
        step = np.abs(coords - np.roll(coords, -1, axis=0))
        step = np.where(wrap, np.minimum(step, np.array(chip) - step), step).sum(axis=1)
        assert sorted(set(step.tolist())) in ([0, 1], [1])
    hosts = host_of(ring, chip, cores)
    changes = int((hosts[1:] != hosts[:-1]).sum())
    assert changes == len(np.unique(hosts)) - 1  # each host one run, start to end


@settings(max_examples=80, deadline=None)
@given(even_tori, st.data())
def test_multi_axis_hosts_are_boxes_of_ranges(torus, data):
    """Where every axis reports its hosts kept together, each host's devices are a product of
    one contiguous range per axis; and no axis ever costs more hops than without hosts."""
    x, y, z, wrap, cores = torus
    chip = (x, y, z)
    shape = _random_shape(data.draw, math.prod(chip) * cores)
    plain = solve_torus(chip, shape, wrap=wrap, cores_per_chip=cores)
    ours = solve_torus(chip, shape, wrap=wrap, cores_per_chip=cores, host_block=HOST)
    assert is_bijection(ours.order, math.prod(chip) * cores)
    assert all(a.hops <= b.hops for a, b in zip(ours.rings, plain.rings, strict=True))
    for a, b in zip(
        measure(ours.order, chip, wrap, cores), measure(plain.order, chip, wrap, cores), strict=True
    ):
        assert a.hops <= b.hops
    if not all(ours.host_contiguous):
        return
    hosts = host_of(ours.order, chip, cores)
    for h in np.unique(hosts):
        where = np.nonzero(hosts == h)
        spans = [np.unique(w) for w in where]
        assert all(s[-1] - s[0] + 1 == len(s) for s in spans)
        assert len(where[0]) == math.prod(len(s) for s in spans)
