"""Checks shared by the planner tests."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np

from loadax_mesh.cost.memory import memory_terms
from loadax_mesh.hardware.profile import DeviceFacts
from loadax_mesh.plan import MeshPlan
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import Roles


def granule_grid(plan: MeshPlan) -> np.ndarray:
    """The granule number of every mesh position."""
    return plan.layout.granule[plan.layout.index]


def assert_dcn_blocks_are_granules(plan: MeshPlan) -> None:
    """Every block of ICI shape at a DCN position is exactly one granule, each a different one."""
    ici, dcn = plan.ici_mesh_shape, plan.dcn_mesh_shape
    n = len(ici)
    grid = granule_grid(plan).reshape([x for pair in zip(dcn, ici, strict=True) for x in pair])
    blocks = grid.transpose([*range(0, 2 * n, 2), *range(1, 2 * n, 2)]).reshape(
        math.prod(dcn), math.prod(ici)
    )
    assert (blocks == blocks[:, :1]).all(), "an ICI block mixes granules"
    assert len(set(blocks[:, 0].tolist())) == math.prod(dcn), "two DCN blocks share a granule"


def run_python(code: str, *, timeout: float = 120) -> str:
    """Run `python -c code` in a fresh interpreter; its stdout (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def ids(plan: MeshPlan) -> np.ndarray:
    return np.asarray(plan.to_dict()["devices"])


def weights_floor(model: ModelSpec, train: TrainSpec, r: Roles, facts: DeviceFacts) -> int:
    """What every phase holds whatever the recipe: parameters, optimizer state, gradients."""
    terms = memory_terms(model, train, r, facts)
    return terms["params"] + terms["optimizer"] + terms["gradients"]


def sharded_and_single_losses(
    model: ModelSpec, train: TrainSpec, *, steps: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """The reference step's losses over `steps` steps on one batch of random tokens, over the
    `fsdp_tp` preset on every local device and on one device, from the same initialisation."""
    import jax

    from loadax_mesh import MeshConfig
    from loadax_mesh.workload.step import make_step

    losses = []
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    for plan in (MeshConfig.from_preset("fsdp_tp").plan(), single):
        step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
        params, opt = step.init(jax.random.key(0))
        shape = (train.global_batch, model.seq_len + 1)
        tokens = np.random.default_rng(0).integers(0, model.vocab_size, shape).astype(np.int32)
        batch = {
            "tokens": jax.device_put(tokens[:, :-1], step.batch_sharding),
            "targets": jax.device_put(tokens[:, 1:], step.batch_sharding),
        }
        run = []
        for _ in range(steps):
            params, opt, loss = step.fn(params, opt, batch)
            run.append(float(loss))
        losses.append(run)
    return np.array(losses[0]), np.array(losses[1])
