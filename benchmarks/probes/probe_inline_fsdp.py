"""The calibration set priced with the other half of the FSDP schedule libtpu compiles for
MaxText's GPT-3 (a what-if; the model is not changed by it).

MaxText's GPT-3 175B step on compile-only v6e-256 devices (fsdp 256, 2 layers; its recipe's
XLA flags, and again with LLaMA-3.1 70B's; docs/notes/2026-11-26-gpt3-llama2-v6e-schedules.md,
read with benchmarks/probes/probe_fsdp_schedule.py) gathers each layer's attention weights in
line each pass (the time model prices that: cost/parts/traffic.py's `layer_collectives`) and
reduces every weight gradient with an in-line all-reduce of the whole gradient, twice a
reduce-scatter's bytes, where the model hides a reduce-scatter. LLaMA-2 70B's recipe runs those
all-reduces on the SparseCore, async. This probe reprices every dense TPU layer's gradient
reduction that way (GPU and MoE layers as before), refits the calibrations leave-one-out as
bench_time.py does and prints its table:

    python benchmarks/probes/probe_inline_fsdp.py [--fit] [--markdown]

The flags are bench_time.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the bench modules

import bench_time

from loadax_mesh.cost.parts import traffic
from loadax_mesh.cost.parts.traffic import Collective
from loadax_mesh.workload.layout import Roles
from loadax_mesh.workload.spec import ModelSpec, TrainSpec

_estimate = sys.modules["loadax_mesh.cost.estimate"]  # the module (the package exports a function)
_assumed = traffic.collectives


def as_compiled() -> Callable[..., list[Collective]]:
    """`traffic.collectives` with a dense layer's gradients all-reduced in line on TPU."""

    def collectives(
        model: ModelSpec, train: TrainSpec, roles: Roles, *, overlapped: bool = False, **kw: Any
    ) -> list[Collective]:
        found = _assumed(model, train, roles, overlapped=overlapped, **kw)
        if model.num_experts or not overlapped:  # MoE layers, and GPU: as the model has them
            return found
        return [
            replace(c, kind="all-reduce", overlaps=False)
            if c.what == "layer weight gradients" and c.kind == "reduce-scatter"
            else c
            for c in found
        ]

    return collectives


def main() -> None:
    _estimate.collectives = as_compiled()
    bench_time.main()


if __name__ == "__main__":
    main()
