"""Groups: axis and process groups, sub-meshes, flattened axes, coordinates (8 CPU devices)."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, Mesh

import loadax_mesh as lm
from tests.standins import cpu_processes


def ids(devices: Any) -> list[Any]:
    if isinstance(devices, list | tuple):
        return [ids(d) for d in devices]
    return devices.id


def mesh_of(shape: tuple[int, ...], names: tuple[str, ...], **kwargs: Any) -> Mesh:
    return Mesh(np.asarray(jax.devices()).reshape(shape), names, **kwargs)


def test_tp_groups_are_rows_and_dp_groups_columns() -> None:
    # PyTorch init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    mesh = mesh_of((2, 4), ("dp", "tp"))
    assert ids(lm.axis_groups(mesh, "tp")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ids(lm.axis_groups(mesh, ("dp",))) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ids(lm.axis_groups(mesh, ("dp", "tp"))) == [list(range(8))]
    assert ids(lm.axis_groups(mesh, ("tp", "dp"))) == [[0, 4, 1, 5, 2, 6, 3, 7]]


def test_groups_of_non_adjacent_axes_follow_the_given_order() -> None:
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    grid = np.vectorize(lambda d: d.id)(mesh.devices)
    expected = [[int(grid[a, b, c]) for c in range(2) for a in range(2)] for b in range(2)]
    assert ids(lm.axis_groups(mesh, ("c", "a"))) == expected


def test_process_groups_on_simulated_hosts() -> None:
    plan = lm.plan_mesh((-1, 2), cpu_processes(2, 4), axis_names=("data", "model"))
    assert lm.process_groups(plan, "data") == [(0, 1), (0, 1)]
    assert lm.process_groups(plan, "model") == [(0,), (0,), (1,), (1,)]
    assert lm.process_groups(plan, ("data", "model")) == [(0, 1)]
    spill = lm.plan_mesh((2, 2, 2), cpu_processes(4, 2), axis_names=("data", "fsdp", "model"))
    assert lm.process_groups(spill, ("data", "fsdp")) == [(0, 1, 2, 3)] * 2
    assert lm.process_groups(spill, "fsdp") == [(0, 1), (0, 1), (2, 3), (2, 3)]


def test_process_groups_in_one_process() -> None:
    mesh = mesh_of((2, 4), ("dp", "tp"))
    assert lm.process_groups(mesh, "tp") == [(0,), (0,)]


def test_submesh_contains_the_device() -> None:
    mesh = mesh_of((2, 4), ("dp", "tp"))
    devices = jax.devices()
    tp = lm.submesh(mesh, "tp", device=devices[5])
    assert tp.axis_names == ("tp",) and ids(list(tp.devices)) == [4, 5, 6, 7]
    assert ids(list(lm.submesh(mesh, "tp").devices)) == [0, 1, 2, 3]  # first local device
    dp = lm.submesh(mesh, "dp", device=devices[6])
    assert ids(list(dp.devices)) == [2, 6]
    swapped = lm.submesh(mesh, ("tp", "dp"))
    assert swapped.axis_names == ("tp", "dp")
    assert (swapped.devices == mesh.devices.T).all()


def test_submesh_keeps_axis_types() -> None:
    types = (AxisType.Explicit, AxisType.Auto, AxisType.Manual)
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"), axis_types=types)
    sub = lm.submesh(mesh, ("c", "a"), device=jax.devices()[3])
    assert sub.axis_types == (AxisType.Manual, AxisType.Explicit)
    assert dict(sub.shape) == {"c": 2, "a": 2}
    assert jax.devices()[3] in sub.devices.flat


def test_submesh_default_needs_a_local_device_in_the_mesh() -> None:
    mesh = Mesh(np.asarray(jax.devices()[4:]).reshape(2, 2), ("a", "b"))
    assert lm.submesh(mesh, "b").devices.tolist() == jax.devices()[4:6]


def test_flatten_adjacent_axes_is_a_reshape() -> None:
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    flat = lm.flatten_axes(mesh, ("a", "b"), "ab")
    assert flat.axis_names == ("ab", "c")
    assert (flat.devices == mesh.devices.reshape(4, 2)).all()


@pytest.mark.parametrize(
    ("axes", "names"),
    [(("a", "c"), ("x", "b")), (("c", "a"), ("b", "x")), (("b", "c", "a"), ("x",))],
)
def test_flatten_non_adjacent_axes(axes: tuple[str, ...], names: tuple[str, ...]) -> None:
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    flat = lm.flatten_axes(mesh, axes, "x")
    assert flat.axis_names == names
    for a, b, c in itertools.product(range(2), repeat=3):
        old = {"a": a, "b": b, "c": c}
        merged = 0
        for axis in axes:
            merged = merged * 2 + old[axis]
        new = tuple(merged if n == "x" else old[n] for n in names)
        assert flat.devices[new] == mesh.devices[a, b, c]


def test_flatten_keeps_a_shared_axis_type_and_rejects_mixed() -> None:
    types = (AxisType.Explicit, AxisType.Auto, AxisType.Explicit)
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"), axis_types=types)
    flat = lm.flatten_axes(mesh, ("a", "c"), "a")  # may reuse a merged axis's name
    assert flat.axis_names == ("a", "b") and flat.axis_types == (AxisType.Explicit, AxisType.Auto)
    with pytest.raises(lm.MeshConfigError, match="different axis types"):
        lm.flatten_axes(mesh, ("a", "b"), "ab")


@pytest.mark.parametrize(
    ("axes", "name", "match"),
    [
        ("a", "x", "single name"),
        (("a", "z"), "x", "'z', which is not a mesh axis"),
        (("a", "a"), "x", "repeats a name"),
        ((), "x", "non-empty tuple"),
        (("a", "b"), "c", "already the name of an axis that stays"),
        (("a", "b"), "", "non-empty string"),
        (("a", "b"), 3, "non-empty string"),
    ],
)
def test_flatten_errors(axes: Any, name: Any, match: str) -> None:
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    with pytest.raises(lm.MeshConfigError, match=match):
        lm.flatten_axes(mesh, axes, name)


def test_coordinate_round_trips() -> None:
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    for device in jax.devices():
        coord = lm.coordinate(mesh, device)
        assert list(coord) == ["a", "b", "c"]
        assert mesh.devices[coord["a"], coord["b"], coord["c"]] == device


def test_devices_outside_the_mesh_are_errors() -> None:
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    with pytest.raises(lm.MeshConfigError, match="not in the mesh"):
        lm.coordinate(mesh, jax.devices()[7])
    with pytest.raises(lm.MeshConfigError, match="not in the mesh"):
        lm.coordinate(mesh, "cpu:0")
    with pytest.raises(lm.MeshConfigError, match="not in the mesh"):
        lm.submesh(mesh, "a", device=jax.devices()[5])
    sim = cpu_processes(1, 4)[1]  # same id as a mesh device, but another device
    with pytest.raises(lm.MeshConfigError, match="not in the mesh"):
        lm.coordinate(mesh, sim)


@pytest.mark.parametrize("axes", ["z", ("a", "a"), (), [1], None])
def test_group_axes_are_validated(axes: Any) -> None:
    mesh = mesh_of((2, 4), ("a", "b"))
    for call in (lm.axis_groups, lm.process_groups, lm.submesh):
        with pytest.raises(lm.MeshConfigError, match="axes="):
            call(mesh, axes)


SHAPES = [(8,), (2, 4), (4, 2), (2, 2, 2), (1, 2, 4), (2, 1, 2, 2)]


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(SHAPES), data=st.data())
def test_flatten_and_groups_agree_with_coordinates(shape: tuple[int, ...], data: Any) -> None:
    names = tuple("abcd"[: len(shape)])
    order = data.draw(st.permutations(range(8)))
    mesh = Mesh(np.asarray([jax.devices()[i] for i in order]).reshape(shape), names)
    k = data.draw(st.integers(1, len(names)))
    axes = tuple(data.draw(st.permutations(names))[:k])
    sizes = dict(zip(names, shape, strict=True))
    flat = lm.flatten_axes(mesh, axes, "m")
    groups = lm.axis_groups(mesh, axes)
    for device in jax.devices():
        old = lm.coordinate(mesh, device)
        new = lm.coordinate(flat, device)
        merged = 0
        for axis in axes:
            merged = merged * sizes[axis] + old[axis]
        assert new["m"] == merged
        assert {n: v for n, v in new.items() if n != "m"} == {
            n: v for n, v in old.items() if n not in axes
        }
        group = [g for g in groups if device in g]
        assert len(group) == 1 and group[0].index(device) == merged
        sub = lm.submesh(mesh, axes, device=device)
        assert sub.axis_names == axes and sub.devices.ravel().tolist() == group[0]
