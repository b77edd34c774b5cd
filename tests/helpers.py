"""Checks shared by the planner tests."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np

from loadax_mesh.cost.memory.terms import memory_terms
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
