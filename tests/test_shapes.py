import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadax_mesh import HybridMeshShape, MeshConfigError, infer_mesh_shape
from loadax_mesh.shapes import split_mesh_shape


def test_infer_replaces_the_one_minus_one():
    assert infer_mesh_shape((-1, 4), num_devices=32) == (8, 4)
    assert infer_mesh_shape([2, -1, 2], num_devices=32) == (2, 8, 2)


def test_infer_checks_the_product_without_minus_one():
    assert infer_mesh_shape((2, 4), num_devices=8) == (2, 4)
    with pytest.raises(MeshConfigError, match="uses 4 devices but 8"):
        infer_mesh_shape((2, 2), num_devices=8)


def test_infer_accepts_numpy_ints():
    assert infer_mesh_shape((np.int64(2), -1), num_devices=8) == (2, 4)


def test_hybrid_shape_is_frozen_hashable_and_sized():
    shape = HybridMeshShape([1, 8], [2, 1])
    assert shape.ici_mesh_shape == (1, 8) and shape.dcn_mesh_shape == (2, 1)
    assert len(shape) == 2
    assert hash(shape) == hash(HybridMeshShape((1, 8), (2, 1)))
    with pytest.raises(AttributeError):
        shape.ici_mesh_shape = (2, 4)  # type: ignore[misc]


def test_axlearn_rule_first_axis_takes_all_granules():
    assert split_mesh_shape((4, 8), num_devices=32, num_granules=4) == HybridMeshShape(
        (1, 8), (4, 1)
    )
    assert split_mesh_shape((1, 2, 8), num_devices=16, num_granules=2) == HybridMeshShape(
        (1, 1, 8), (1, 2, 1)
    )


def test_spill_over_later_axes_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="loadax_mesh"):
        shape = split_mesh_shape((2, 32), num_devices=64, num_granules=8)
    assert shape == HybridMeshShape((1, 8), (2, 4))
    assert "HybridMeshShape(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 4))" in caplog.text


def test_no_warning_when_axlearn_rule_applies(caplog):
    with caplog.at_level(logging.WARNING, logger="loadax_mesh"):
        split_mesh_shape((8, 8), num_devices=64, num_granules=8)
    assert caplog.text == ""


def test_granules_that_do_not_divide_the_devices_are_an_error():
    with pytest.raises(MeshConfigError, match="mesh_shape"):
        split_mesh_shape((3, 5), num_devices=16, num_granules=2)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(1, 64))
def test_split_always_succeeds_and_is_exact(sizes, granules):
    total = int(np.prod(sizes))
    if total % granules:
        return
    shape = split_mesh_shape(tuple(sizes), num_devices=total, num_granules=granules)
    assert int(np.prod(shape.dcn_mesh_shape)) == granules
    assert tuple(
        i * d for i, d in zip(shape.ici_mesh_shape, shape.dcn_mesh_shape, strict=True)
    ) == tuple(sizes)
