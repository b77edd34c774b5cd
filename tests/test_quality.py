"""axis_quality (docs/design.md section 5) on layouts small enough to count by hand."""

from __future__ import annotations

import numpy as np
import pytest

import loadax_mesh as lm
from loadax_mesh.quality import axis_quality
from loadax_mesh.solver.hybrid import Layout, Torus
from tests.standins import gpu_nodes, tpu_slices


def line_of_chips(
    n: int,
    wrap: bool,
    order: list[int],
    *,
    cores: int = 1,
    granule: list[int] | None = None,
    dcn: int = 1,
) -> lm.AxisQuality:
    """One axis over `order` (table rows); row r sits on chip r // cores of an n-chip line."""
    rows = n * cores
    coords = np.zeros((rows, 3), np.int64)
    coords[:, 0] = np.arange(rows) // cores
    granules = np.zeros(rows, np.int64) if granule is None else np.asarray(granule)
    layout = Layout(
        np.asarray(order),
        granules,
        int(granules.max()) + 1,
        Torus((n, 1, 1), (wrap, False, False), cores),
    )
    return axis_quality(layout, coords, ("x",), (dcn,))["x"]


def test_a_ring_of_four_with_and_without_wraparound():
    q = line_of_chips(4, True, [0, 1, 2, 3])
    assert (q.ring_steps, q.hops, q.efficiency) == (4, 4, 1.0)  # 1+1+1 and 3 -> 0 wraps: 1
    q = line_of_chips(4, False, [0, 1, 2, 3])
    assert (q.ring_steps, q.hops, q.efficiency) == (4, 6, 0.666667)  # closing step is 3 hops


def test_a_strided_ring():
    q = line_of_chips(4, True, [0, 2, 1, 3])  # 2 + 1 + 2 + 1 (3 -> 0 wraps)
    assert (q.ring_steps, q.hops, q.efficiency) == (4, 6, 0.666667)


def test_a_run_of_two_is_one_step():
    q = line_of_chips(4, True, [0, 3])
    assert (q.ring_steps, q.hops) == (1, 1)  # 0 and 3 are neighbours across the wrap
    q = line_of_chips(4, False, [0, 3])
    assert (q.ring_steps, q.hops, q.efficiency) == (1, 3, 0.333333)


def test_cores_of_one_chip_are_zero_hops_apart():
    # Chips 0, 1; two cores each; rows 0, 1 on chip 0 and rows 2, 3 on chip 1.
    q = line_of_chips(2, False, [0, 1, 3, 2], cores=2)
    assert (q.ring_steps, q.hops, q.efficiency) == (4, 2, 2.0)  # 0 + 1 + 0 + 1
    q = line_of_chips(2, False, [0, 1], cores=2)
    assert (q.ring_steps, q.hops, q.efficiency) == (1, 0, 1.0)  # no hop at all: reported 1.0


def test_runs_are_cut_at_granule_changes():
    # Six rows on two granules of three chips each (granule-local chips 0..2 repeat).
    coords = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0]] * 2)
    granule = np.array([0, 0, 0, 1, 1, 1])
    layout = Layout(np.arange(6), granule, 2, Torus((3, 1, 1), (False, False, False), 1))
    q = axis_quality(layout, coords, ("x",), (2,))["x"]
    # Two runs of three: each 1 + 1 + 2 hops over three steps.
    assert (q.ici, q.dcn, q.ring_steps, q.hops) == (3, 2, 6, 8)
    assert q.dcn_crossings == 1 and q.dcn_ok


def test_dcn_ok_needs_each_granule_entered_once():
    coords = np.zeros((3, 3), np.int64)
    torus = Torus((1, 1, 1), (False, False, False), 1)
    back_again = Layout(np.arange(3), np.array([0, 1, 0]), 2, torus)
    q = axis_quality(back_again, coords, ("x",), (2,))["x"]
    assert q.dcn_crossings == 2 and not q.dcn_ok
    # Two changes over three positions, yet only two granules: granule 0 entered twice.
    q = axis_quality(back_again, coords, ("x",), (3,))["x"]
    assert q.dcn_crossings == 2 and not q.dcn_ok
    q = axis_quality(Layout(np.arange(3), np.array([0, 1, 2]), 3, torus), coords, ("x",), (3,))["x"]
    assert q.dcn_crossings == 2 and q.dcn_ok


def test_two_dim_grid_counts_every_line():
    # 2 x 4 chips, no wrap; mesh (2, 4) row-major over (y, x): rows are x-lines, columns pairs.
    coords = np.array([[x, y, 0] for y in range(2) for x in range(4)])
    layout = Layout(
        np.arange(8).reshape(2, 4),
        np.zeros(8, np.int64),
        1,
        Torus((4, 2, 1), (False, False, False), 1),
    )
    q = axis_quality(layout, coords, ("a", "b"), (1, 1))
    assert (q["a"].ring_steps, q["a"].hops) == (4, 4)  # four pairs (x, 0)-(x, 1), one hop each
    assert (q["b"].ring_steps, q["b"].hops) == (8, 12)  # two rings of 1+1+1+3


def test_switched_fabric_counts_one_hop_per_step():
    plan = lm.plan_mesh((4, 8), gpu_nodes(4), axis_names=("data", "model"))
    q = plan.quality()
    assert q["model"].ring_steps == q["model"].hops == 4 * 8  # 4 rings of 8, one per node
    assert q["model"].efficiency == 1.0
    assert (q["data"].ici, q["data"].dcn, q["data"].ring_steps) == (1, 4, 0)
    assert q["data"].dcn_crossings == 3 and q["data"].dcn_ok


@pytest.mark.parametrize(("shape", "expected"), [((64,), [1.0]), ((16, 4), [1.0, 1.0])])
def test_plan_quality_on_a_full_torus(shape, expected):
    """v4 4x4x4 wraps on every dim (hardware catalogue): the solver's rings are all closed."""
    names = ("data", "model")[: len(shape)]
    plan = lm.plan_mesh(shape, tpu_slices((4, 4, 4)), axis_names=names)
    assert plan.layout.torus is not None and all(plan.layout.torus.wrap)
    assert [q.efficiency for q in plan.quality().values()] == expected
    assert plan.to_dict()["quality"]["data"]["efficiency"] == 1.0


def test_dims_spanned_by_each_axis():
    # 2 x 4 chips: axis a pairs chips across y (one dim), axis b runs along x (one dim).
    coords = np.array([[x, y, 0] for y in range(2) for x in range(4)])
    torus = Torus((4, 2, 1), (False, False, False), 1)
    layout = Layout(np.arange(8).reshape(2, 4), np.zeros(8, np.int64), 1, torus)
    q = axis_quality(layout, coords, ("a", "b"), (1, 1))
    assert (q["a"].ici_dims, q["b"].ici_dims) == (1, 1)
    # One axis over all eight chips, a snake through both dims.
    snake = Layout(np.array([0, 1, 2, 3, 7, 6, 5, 4]), np.zeros(8, np.int64), 1, torus)
    q = axis_quality(snake, coords, ("all",), (1,))["all"]
    assert q.ici_dims == 2 and q.link_factor == 2 * q.efficiency
    # Across granules with no ICI run: no ICI dim; cores of one chip: one.
    line = line_of_chips(3, False, [0, 1, 2], granule=[0, 1, 2], dcn=3)
    assert (line.ici_dims, line.link_factor) == (0, line.efficiency)
    assert line_of_chips(2, False, [0, 1], cores=2).ici_dims == 1


def test_tensor_axis_over_two_dims_of_a_v5p_cube():
    """v5p-1024 is 8x8x8 chips: a tensor axis of 16 spans two dims, one of 8 one dim."""
    sixteen = lm.plan_mesh((32, 16), tpu_slices((8, 8, 8), kind="TPU v5"), axis_names=("data", "t"))
    eight = lm.plan_mesh((64, 8), tpu_slices((8, 8, 8), kind="TPU v5"), axis_names=("data", "t"))
    assert sixteen.quality()["t"].ici_dims == 2 and eight.quality()["t"].ici_dims == 1
    assert sixteen.quality()["data"].ici_dims == 2
