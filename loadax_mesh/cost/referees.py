"""A memory referee row's estimate as the cost model gives it now (configs/memory_referees.toml:
what benchmarks/bench_cost.py writes and tests/cost/test_band.py checks)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import MeshConfig
from ..hardware.strings import simulate_devices
from ..shapes import HybridMeshShape
from ..workload.spec import ModelSpec, TrainSpec, parse_remat
from .estimate import estimate


def referee_estimate(row: dict[str, Any]) -> int:
    """A referee row's estimate as the cost model gives it now: its mesh (`ici` and `dcn`
    shapes over `axes`, batch over `batch_axes`) planned on the first `devices` simulated
    devices of its hardware (all where not given), its model with `model_fields` replaced, and
    its `train` fields (remat as the command line writes it)."""
    shape = HybridMeshShape(tuple(row["ici"]), tuple(row["dcn"]))
    config = MeshConfig(shape, tuple(row["axes"]), tuple(row["batch_axes"]))
    devices = simulate_devices(row["hardware"])[: row.get("devices")]
    plan = config.plan(devices, selector=row["hardware"])
    model = replace(ModelSpec.from_name(row["model"]), **row.get("model_fields", {}))
    train = dict(row["train"])
    train["remat"] = parse_remat(train["remat"])
    return estimate(plan, model, TrainSpec(**train)).memory_bytes
