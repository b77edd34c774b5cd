"""ZeRO-1 in the reference step (TrainSpec.optimizer_over_data, docs/design.md section 16): on
8 CPU devices, data 2 x fsdp 4, Adam's moments are cut over the data axis too, the step trains
to the same losses as with the moments replicated over data, and its compiled program holds
less; a plan without a data axis refuses the field by name."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.replica_groups import group_axes
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.layout import check_fit, roles
from loadax_mesh.workload.step import make_step
from loadax_mesh.workload.zero import optimizer_axes

from .losses import TINY, step_losses

HSDP = ("data", "fsdp")


def _plan():
    return MeshConfig((2, 4), HSDP, batch_axis_names=HSDP).plan()


def _train(zero1: bool) -> TrainSpec:
    return TrainSpec(
        global_batch=8, learning_rate=1e-2, compute_dtype="float32", optimizer_over_data=zero1
    )


def _axes(r, shape, logical):
    return optimizer_axes(r.mesh_axes(logical), shape, dict(r.sizes), r.data_parallel_axes())


def test_the_moments_are_cut_over_data_where_a_dim_divides():
    r = roles((("data", 2), ("fsdp", 4)), HSDP)
    assert _axes(r, (512, 1024), ("embed", "mlp")) == (("fsdp", "data"), None)
    # 4 does not divide by fsdp 4 x data 2, nor 3 by data 2: the first dim that does takes data
    assert _axes(r, (4, 3, 8), ("embed", None, None)) == ("fsdp", None, "data")
    assert _axes(r, (3,), (None,)) == (None,)  # no dim divides: as the parameter
    flat = roles((("fsdp", 8),), ("fsdp",))
    assert _axes(flat, (512, 1024), ("embed", "mlp")) == ("fsdp", None)


@pytest.mark.slow
def test_zero1_trains_to_the_replicated_optimizers_losses():
    p = _plan()
    got = step_losses(p, TINY, _train(True), batch_axes=HSDP, steps=3)
    want = step_losses(p, TINY, _train(False), batch_axes=HSDP, steps=3)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (np.diff(got) < 0).all(), got


@pytest.mark.slow
def test_zero1_holds_less_and_gathers_the_parameters_over_data():
    """The moments in float32 are a quarter of the tiny model's step memory: cut over data 2
    they take half as much; the updated parameters are all-gathered over the data axis."""
    mesh = _plan().to_jax_mesh()
    held, gathered = {}, {}
    for zero1 in (False, True):
        step = make_step(mesh, TINY, _train(zero1), batch_axes=HSDP)
        args = step.abstract_args()
        held[zero1] = sum(_shard(a) for a in args[1]["m"].values())
        hlo = HloText(step.fn.lower(*args).compile().as_text())
        gathered[zero1] = {
            group_axes(c.groups, dict(mesh.shape))
            for c in collectives(hlo, 8)
            if c.kind == "all-gather"
        }
    assert held[True] < 0.6 * held[False]
    assert ("data",) in gathered[True] and ("data",) not in gathered[False], gathered


def _shard(a: jax.ShapeDtypeStruct) -> int:
    return int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize


def test_a_plan_without_a_data_axis_refuses_optimizer_over_data():
    r = roles((("fsdp", 8),), ("fsdp",))
    with pytest.raises(MeshConfigError, match="optimizer_over_data=True: the plan has no data"):
        check_fit(TINY, TrainSpec(global_batch=8, optimizer_over_data=True), r)
