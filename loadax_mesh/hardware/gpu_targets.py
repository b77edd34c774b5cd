"""GPU target configs (configs/gpu_targets/*.txtpb, one per device_kind: the chip's facts XLA
compiles for) and what one device's memory the step may use. Pure Python: files only."""

from __future__ import annotations

import os
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


# What jax's GPU client reads (jaxlib's xla_client.generate_pjrt_gpu_plugin_options): the
# first name, or the deprecated second one; both set is an error there too.
_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def gpu_pool_fraction() -> tuple[float, str]:
    """The share of a GPU's memory jax's GPU client preallocates, and where it comes from: the
    environment variable jax reads (`XLA_CLIENT_MEM_FRACTION`, or the deprecated
    `XLA_PYTHON_CLIENT_MEM_FRACTION`), else jax's default (`[gpu_client] mem_fraction`)."""
    given = {name: os.environ[name] for name in _FRACTION_VARS if os.environ.get(name)}
    if len(given) > 1:
        raise MeshConfigError(
            f"{' and '.join(f'{k}={v!r}' for k, v in given.items())} are both set; accepted: "
            "one of them (jax refuses both; the second is deprecated)"
        )
    if not given:
        default = float(dict(catalogue().gpu_client)["mem_fraction"].value)
        return default, f"jax's default (neither {' nor '.join(_FRACTION_VARS)} is set)"
    ((name, text),) = given.items()
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise MeshConfigError(f"{name}={text!r}; accepted: a fraction in (0, 1], such as 0.9")
    return value, f"{name}={text}"


def device_hbm(t: HardwareType) -> float | None:
    """Memory one JAX device may use, in bytes; None where the catalogue does not know.

    TPU: what the TPU compiler allows (`hbm_usable`), else the chip's HBM shared by its
    devices. GPU: the pool jax's GPU client preallocates, `gpu_pool_fraction()` (0.75 unless
    the environment says otherwise) of the total memory the GPU reports (its target config's
    `device_memory_size`): the GPU compiler never refuses, and a step that needs more runs out
    of memory in that pool.
    """
    if t.platform == "gpu":
        total = device_memory(t.device_kind)
        return None if total is None else gpu_pool_fraction()[0] * total
    usable = t.fact("hbm_usable")
    if usable is not None and usable.base is not None:
        # measured on libtpu's compile-only device, which on v4 is one TensorCore where the
        # real machine's device (megacore) holds both of its chip's
        measured = t.fact("hbm_usable_cores")
        cores = t.cores_per_chip // t.devices_per_chip
        return usable.base if measured is None else usable.base * cores / measured.value
    hbm = t.fact("hbm")
    return None if hbm is None or hbm.base is None else hbm.base / t.devices_per_chip
