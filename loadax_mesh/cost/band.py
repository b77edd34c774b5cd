"""The memory model's measured error, per platform, and the three-way fit verdict it gives.

configs/memory_referees.toml holds the referee rows: for each case of
benchmarks/bench_cost.py, the estimated device memory beside what the compiler gave the step
(libtpu's buffer assignment on TPU, `memory_analysis()` on GPU, which equals the allocator's
peak on a real H200), plus the steps measured on real GPUs. The band of a platform is the
least and greatest estimate/compiled ratio of its rows of at least MIN_COMPILED_BYTES (below
that a step's fixed buffers, not the model's terms, set the ratio), widened to hold 1. An
estimate `m` then says the compiled step needs between m / high and m / low: it fits when even
m / low does, does not fit when even m / high does not, and is within the model's error
between (compile to confirm).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from .._configs import config_path
from ..errors import MeshConfigError
from ..workload.spec import ModelSpec, TrainSpec

if TYPE_CHECKING:
    from ..hardware.profile import DeviceFacts
    from ..workload.layout import Roles

FITS, UNSURE, DOES_NOT_FIT = "fits", "within the model's error", "does not fit"
MIN_COMPILED_BYTES = 1e9


@dataclass(frozen=True)
class Band:
    """The estimate/compiled ratios of a platform's memory referee rows: `low` and `high`
    (holding 1), from `rows` rows."""

    platform: str
    low: float
    high: float
    rows: int

    def text(self) -> str:
        """As a report says it: how far the compiled step may lie from the estimate."""
        return (
            f"the model's memory error on {self.platform.upper()} is {1 / self.high - 1:+.0%} to "
            f"{1 / self.low - 1:+.0%} of the estimate ({self.rows} referee rows, "
            "configs/memory_referees.toml)"
        )


def fit_verdict(memory: float, capacity: float, band: Band | None) -> str:
    """FITS, UNSURE or DOES_NOT_FIT for an estimate of `memory` bytes against `capacity`; with
    no band (a platform without referee rows) the estimate alone decides."""
    low, high = (band.low, band.high) if band is not None else (1.0, 1.0)
    if memory / low <= capacity:
        return FITS
    return DOES_NOT_FIT if memory / high > capacity else UNSURE


def memory_band(platform: str) -> Band | None:
    """The band of `platform` ("tpu", "gpu"), None where no referee row is on it."""
    return _bands().get(platform)


def referee_rows() -> list[dict[str, Any]]:
    """The rows of configs/memory_referees.toml, each with its platform."""
    return _read()["row"]


@cache
def _read() -> dict[str, Any]:
    path = config_path("memory_referees.toml")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    for k, row in enumerate(data.get("row", [])):
        for key in ("hardware", "estimate_bytes", "compiled_bytes"):
            if key not in row:
                raise MeshConfigError(f"{path}: row {k} has no {key!r}; accepted: every row has it")
        row["platform"] = row["hardware"].split("-", 1)[0]
    return data


@cache
def _bands() -> dict[str, Band]:
    ratios: dict[str, list[float]] = {}
    for row in referee_rows():
        if row["compiled_bytes"] >= MIN_COMPILED_BYTES:
            ratios.setdefault(row["platform"], []).append(
                row["estimate_bytes"] / row["compiled_bytes"]
            )
    return {p: Band(p, low=min(1.0, *r), high=max(1.0, *r), rows=len(r)) for p, r in ratios.items()}


def compile_command(
    facts: DeviceFacts,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    model: ModelSpec,
    train: TrainSpec,
) -> str:
    """The command that compiles this step on the compile-only devices, whose compiler then
    says whether it fits (`loadax-mesh compile`; a model the catalogue does not name as it is:
    `compile_step` in Python)."""
    if not _catalogue_model(model):
        return "compile_step(plan, model, train) (loadax_mesh.compile_step)"
    axes = list(factors)
    words = [
        "loadax-mesh compile",
        facts.hardware,
        f"--shape {','.join(str(i) for i, _ in factors.values())}",
        f"--dcn-shape {','.join(str(d) for _, d in factors.values())}",
        f"--axes {','.join(axes)}",
        f"--batch-axes {','.join(r.batch)}",
        f"--model {model.name} --global-batch {train.global_batch}",
        f"--remat {train.remat_text} --microbatches {train.microbatches}",
        f"--logits-chunks {train.logits_chunks}",
    ]
    if model.num_experts:
        words.append(f"--moe {train.moe}")
    words += [f"--fact {g.name}={g.value:g}{g.unit}" for g in facts.given]
    return " ".join(words)


def _catalogue_model(model: ModelSpec) -> bool:
    return _named(model.name) == model


@cache
def _named(name: str) -> ModelSpec | None:
    try:
        return ModelSpec.from_name(name)
    except MeshConfigError:
        return None
