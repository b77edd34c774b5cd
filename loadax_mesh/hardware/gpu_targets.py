"""GPU target configs (configs/gpu_targets/*.txtpb, one per device_kind: the chip's facts XLA
compiles for) and what one device's memory the step may use. Pure Python: files only."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from .._configs import config_path
from ..errors import MeshConfigError
from .catalogue import HardwareType, catalogue

_KIND = re.compile(r'^device_description_str:\s*"(?P<kind>[^"]+)"\s*$', re.MULTILINE)
_MEMORY = re.compile(r"^\s*device_memory_size:\s*(\d+)\s*$", re.MULTILINE)


@lru_cache(maxsize=1)
def target_configs() -> dict[str, Path]:
    """device_kind -> its target config file in configs/gpu_targets/ (by the file's
    `device_description_str`, the device_kind its compile-only devices report)."""
    found: dict[str, Path] = {}
    for path in sorted(config_path("gpu_targets").glob("*.txtpb")):
        kinds = _KIND.findall(path.read_text())
        if len(kinds) != 1 or kinds[0] in found:
            raise MeshConfigError(
                f"configs/gpu_targets/{path.name}: device_description_str {kinds}; accepted: "
                "exactly one, naming a device_kind no other file names"
            )
        found[kinds[0]] = path
    return found


def device_memory(device_kind: str) -> int | None:
    """The total memory a GPU of this kind reports, in bytes (`device_memory_size` of its
    target config); None for a kind without one."""
    path = target_configs().get(device_kind)
    found = _MEMORY.search(path.read_text()) if path is not None else None
    return None if found is None else int(found[1])


def gpu_pool_fraction() -> float:
    """The share of a GPU's memory jax's GPU client preallocates (`[gpu_client] mem_fraction`)."""
    return float(dict(catalogue().gpu_client)["mem_fraction"].value)


def device_hbm(t: HardwareType) -> float | None:
    """Memory one JAX device may use, in bytes; None where the catalogue does not know.

    TPU: what the TPU compiler allows (`hbm_usable`), else the chip's HBM shared by its
    devices. GPU: the pool jax's GPU client preallocates, `[gpu_client] mem_fraction` (0.75)
    of the total memory the GPU reports (its target config's `device_memory_size`): the GPU
    compiler never refuses, and a step that needs more runs out of memory in that pool.
    """
    if t.platform == "gpu":
        total = device_memory(t.device_kind)
        return None if total is None else gpu_pool_fraction() * total
    usable = t.fact("hbm_usable")
    if usable is not None and usable.base is not None:
        return usable.base
    hbm = t.fact("hbm")
    return None if hbm is None or hbm.base is None else hbm.base / t.devices_per_chip
