"""The step with each recipe (offload placements, micro-batches, logits chunks) trains on 8 CPU
devices to the losses of the plain step on one device; recipe checks that need the mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.spec import TENSORS
from loadax_mesh.workload.step import make_step, remat_policy

from .losses import TINY, train_losses

# data 1 x fsdp 2 x model 4: a per-replica batch of 4 rows (global 8), room for 4 micro-batches.
MESH = ((1, 2, 4), ("data", "fsdp", "model"))


def train(plan, *, batch_axes, **recipe):
    """Losses of four float32 steps on one fixed batch, from the same initial parameters."""
    return train_losses(plan, batch_axes=batch_axes, compute_dtype="float32", **recipe)


@pytest.fixture(scope="module")
def reference():
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    return train(single, batch_axes=("data",))


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        {"remat": "offload"},
        {"remat": {"layer_input": "offload", "query": "offload", "out_proj": "device"}},
        {"remat": dict.fromkeys(TENSORS, "device")},
        {"microbatches": 2},
        {"microbatches": 4},
        {"logits_chunks": 2},
        {
            "remat": {"layer_input": "offload", "key": "device", "mlp_in": "offload"},
            "microbatches": 2,
            "logits_chunks": 4,
        },
    ],
    ids=["offload", "mapping", "all-device", "micro2", "micro4", "chunks2", "combined"],
)
def test_each_recipe_trains_like_the_plain_step_on_one_device(reference, recipe):
    plan = MeshConfig(*MESH).plan()
    assert plan.devices.size == 8
    losses = train(plan, batch_axes=("data", "fsdp"), **recipe)
    # Measured: float32 spread against one device below 3e-6 over four steps.
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    assert (np.diff(losses) < 0).all(), losses


@pytest.mark.slow
def test_logits_chunks_over_a_sequence_axis(reference):
    plan = MeshConfig.from_preset("dp_sp").plan()
    losses = train(plan, batch_axes=plan.batch_axis_names, logits_chunks=4)
    np.testing.assert_allclose(losses, reference, rtol=1e-5)


def test_policies():
    cp = jax.checkpoint_policies
    assert remat_policy(TrainSpec(global_batch=8, remat="none")) is None
    assert remat_policy(TrainSpec(global_batch=8, remat="full")) is cp.nothing_saveable
    dots = TrainSpec(global_batch=8, remat="dots")
    assert remat_policy(dots) is cp.dots_with_no_batch_dims_saveable
    assert callable(remat_policy(TrainSpec(global_batch=8, remat="offload")))
    # Every named tensor saved is a checkpointed layer, not "none"'s no checkpoint.
    assert callable(remat_policy(TrainSpec(global_batch=8, remat=dict.fromkeys(TENSORS, "device"))))


@pytest.mark.parametrize(
    ("mesh", "batch_axes", "recipe", "message"),
    [
        (
            MESH,
            ("data", "fsdp"),
            {"microbatches": 8},
            "microbatches=8 does not divide the per-replica batch 4 \\(global_batch 8 over "
            "the data-parallel degree 2\\); accepted: a divisor of 4",
        ),
        (
            ((1, 8), ("data", "seq")),
            ("data",),
            {"logits_chunks": 32},
            "logits_chunks=32 does not divide a device's slice of the sequence, 16 tokens "
            "\\(seq_len 128 over the sequence degree 8\\); accepted: a divisor of 16",
        ),
    ],
)
def test_recipe_checks_that_need_the_mesh(mesh, batch_axes, recipe, message):
    device_mesh = MeshConfig(*mesh).create_device_mesh()
    train = TrainSpec(global_batch=8, **recipe)
    with pytest.raises(MeshConfigError, match=message):
        make_step(device_mesh, TINY, train, batch_axes=batch_axes)


@pytest.mark.slow
def test_micro_batches_and_chunks_move_no_rows_between_devices():
    """Each device slices its own rows and tokens: the split adds no all-to-all or permute."""
    plan = MeshConfig(*MESH).plan()
    spec = TrainSpec(global_batch=8, microbatches=4, logits_chunks=4)
    step = make_step(plan.to_jax_mesh(), TINY, spec, batch_axes=("data", "fsdp"))
    hlo = step.fn.lower(*step.abstract_args()).compile().as_text()
    assert "all-to-all" not in hlo and "collective-permute" not in hlo
