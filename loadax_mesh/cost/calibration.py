"""The step-time model's named calibrations (configs/calibration.toml): each fitted by
benchmarks/bench_time.py (or bench_moe_time.py) on the calibration set alone, per platform."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from typing import Any

from .._configs import config_path
from ..errors import MeshConfigError
from ..hardware.traits import Platform


def calibration(name: str, platform: Platform) -> float:
    """A named calibration of configs/calibration.toml for a platform (measured runs cover TPU
    and GPU)."""
    found = _calibrations().get(name, {})
    entry = found.get(platform)
    if entry is None:
        raise MeshConfigError(
            f"configs/calibration.toml has no {name} for {platform}; accepted: {sorted(found)}"
        )
    return float(entry["value"])


def matmul_intensity(platform: Platform) -> float | None:
    """The calibrated FLOPs per HBM byte of a tiled matmul on `platform`, None where the
    calibration set shows no such limit (configs/calibration.toml)."""
    return _optional("matmul_intensity", platform)


def permute_bandwidth(platform: Platform) -> float | None:
    """The calibrated share of HBM bandwidth at which the dropless MoE path's gathers and
    scatter-adds by row index move their rows, None where the calibration set shows no such
    limit (configs/calibration.toml; cost/timing/moe.py)."""
    return _optional("permute_bandwidth", platform)


def quantized_share(platform: Platform, precision: str) -> float:
    """The calibrated share of `precision`'s peak a quantized projection or MLP matmul reaches,
    as a fraction of the share of the bf16 peak the chip's bf16 matmuls reach
    (configs/calibration.toml `quantized_share`); an error naming what is accepted where the
    file has none for the platform and precision."""
    return float(quantized_entry(platform, precision)["value"])


def quantized_entry(platform: Platform, precision: str) -> dict[str, Any]:
    """configs/calibration.toml's `quantized_share` entry for a platform and precision (its
    value, what it was fitted on, and `carried_from` where no run of its own fitted it)."""
    table: dict[str, dict[str, Any]] = _calibrations().get("quantized_share", {})
    entry = table.get(precision, {}).get(platform)
    if entry is None:
        accepted = sorted(f"{p} {q}" for q, found in table.items() for p in found)
        raise MeshConfigError(
            f"configs/calibration.toml has no quantized_share for quantization={precision!r} "
            f"on {platform}; accepted: {', '.join(accepted)}"
        )
    return entry


def _optional(name: str, platform: Platform) -> float | None:
    entry = _calibrations().get(name, {}).get(platform)
    return None if entry is None else float(entry["value"])


def dcn_slice_bandwidth(platform: Platform) -> float | None:
    """The calibrated bytes/s one granule (a TPU slice) sends across granules in all, shared by
    its devices; None where the calibration set shows no such limit (configs/calibration.toml)."""
    entry = _calibrations().get("dcn_slice_bandwidth", {}).get(platform)
    return None if entry is None else float(entry["value"])


@cache
def _calibrations() -> dict[str, dict[str, dict[str, Any]]]:
    with open(config_path("calibration.toml"), "rb") as f:
        return tomllib.load(f)


@dataclass(frozen=True, kw_only=True)
class Calibrated:
    """The named calibrations one estimate is priced with (each a platform's, unless given):
    the share of peak a matmul reaches, the FLOPs per HBM byte of a tiled matmul, the dropless
    path's permute bandwidth share (None: no limit), a DCN ring step's latency and what a
    granule sends across granules in all (bytes/s; `inf`: no limit)."""

    compute_efficiency: float
    intensity: float | None
    permute_share: float | None
    dcn_latency: float
    slice_bandwidth: float

    @classmethod
    def of(cls, platform: Platform, **given: Any) -> Calibrated:
        """`platform`'s calibrations, those in `given` that are not None in their place."""
        own = {
            "compute_efficiency": lambda: calibration("compute_efficiency", platform),
            "intensity": lambda: matmul_intensity(platform),
            "permute_share": lambda: permute_bandwidth(platform),
            "dcn_latency": lambda: calibration("dcn_latency", platform),
            "slice_bandwidth": lambda: dcn_slice_bandwidth(platform) or float("inf"),
        }
        unknown = sorted(set(given) - set(own))
        if unknown:
            raise TypeError(f"Calibrated.of: no calibration named {unknown[0]!r}")
        values: dict[str, Any] = {
            k: f() if given.get(k) is None else given[k] for k, f in own.items()
        }
        return cls(**values)
