"""Real device objects without the hardware: compile-only TPU and GPU devices (docs/design.md
section 6).

`jax.experimental.topologies.get_topology_desc` gives the devices Google's TPU runtime would
list for a topology (ids, coords, cores, hosts, slices); `jax.jit(...).lower(...).compile()`
compiles for them with the real TPU compiler. They are the referee for `simulate_devices`.
Needs `pip install 'loadax-mesh[tpu]'` (jax[tpu], which brings libtpu). GPU clusters the same
way through XLA's CUDA client: topology_gpu.py, `pip install 'loadax-mesh[gpu-aot]'`.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import MeshConfigError
from .stderr import quiet_stderr
from .strings import HardwareSpec, parse_hardware

INSTALL = "pip install 'loadax-mesh[tpu]' (jax[tpu], which brings libtpu)"

# Differences between the compile-only devices and what jax.devices() lists on the real
# machine, per TPU generation or per platform; the CLI prints them beside a plan on these devices.
DIFFERENCES = {
    "v4": "libtpu's compile-only v4 devices are TensorCores (2 per chip, core_on_chip 0 and 1) "
    "where jax on a real v4 host lists one megacore device per chip; libtpu takes no megacore "
    "option, so meshes here have twice the devices and each holds half a chip's HBM",
    "gpu": "XLA's compile-only GPU devices carry slice_index 0 in every NVLink domain (its "
    "topology description does not pass the partition on), where jax's devices on the real "
    "cluster carry the domain; both carry it as coords[0], and the device reader takes it from "
    "there where slice_index has one value, so plans and granules are the same",
}


class TopologyDevices(list[Any]):
    """The compile-only devices of one hardware string; `hardware` names it."""

    hardware: str
    difference: str | None  # how they differ from the real machine's jax.devices(), if they do


def topology_devices(hardware: str) -> TopologyDevices:
    """The compile-only devices of a TPU or GPU catalogue string.

    TPU: libtpu's, multislice included; hosts follow the catalogue (libtpu's default host is
    2x2x1 chips; a v5e-8 is one host of 2x4). v4 differs from the real machine: see
    `DIFFERENCES` (libtpu takes no megacore option). GPU: XLA's CUDA client's, one partition
    per NVLink domain and one process per host, for the chip of `configs/gpu_targets/` (see
    topology_gpu.py; their slice_index differs from the real cluster's, see `DIFFERENCES`).

    Args:
        hardware: a TPU or GPU catalogue string such as "tpu-v5p-512".

    Returns:
        The devices, which plan like any others and compile with the real compiler; where they
        differ from the real machine's, the list says how.

    Raises:
        MeshConfigError: a CPU string, a string the catalogue does not know, or a missing
            libtpu, CUDA plugin or ptxas (the message says what to install).
    """
    spec = parse_hardware(hardware)
    difference: str | None
    if spec.platform == "gpu":
        from .topology_gpu import cuda_devices

        found, difference = cuda_devices(spec), DIFFERENCES["gpu"]
    elif spec.platform == "tpu":
        found, difference = _tpu_devices(spec), DIFFERENCES.get(spec.type.key)
    else:
        raise MeshConfigError(
            f"hardware={hardware!r} is no TPU or GPU string; accepted: a TPU or GPU catalogue "
            "string such as tpu-v5p-512, tpu-v5litepod-256-4 or gpu-p5.48xlarge-16 "
            "(`loadax-mesh hardware`)"
        )
    devices = TopologyDevices(found)
    devices.hardware = spec.hardware
    devices.difference = difference
    return devices


def _tpu_devices(spec: HardwareSpec) -> list[Any]:
    name, kwargs = tpu_topology_args(spec)
    topologies = _topologies()
    # libtpu takes a machine-wide lock for the TPU chips unless told not to; compile-only
    # devices use no chips, so other processes may compile at the same time.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        with quiet_stderr():  # libtpu warns that this machine has no TPU metadata
            return list(topologies.get_topology_desc(name, "tpu", **kwargs).devices)
    except RuntimeError as err:  # jax says "JAX TPU support not installed"
        if "not installed" in str(err):
            raise MeshConfigError(
                f"hardware={spec.hardware!r}: libtpu is not installed; install it with {INSTALL}"
            ) from None
        raise


def tpu_topology_args(spec: HardwareSpec) -> tuple[str, dict[str, Any]]:
    """The name and options `get_topology_desc` takes for a parsed TPU string."""
    fact = spec.fact("libtpu_name")
    assert fact is not None, f"hardware.toml: tpu.{spec.type.key} has no libtpu_name"
    kwargs: dict[str, Any] = {"chips_per_host_bounds": (*spec.host_block, 1, 1)[:3]}
    if spec.slices > 1:
        kwargs["num_slices"] = spec.slices
    return f"{fact.value}:{spec.topology_name}", kwargs


def _topologies() -> Any:
    try:
        from jax.experimental import topologies
    except ImportError:
        raise MeshConfigError(f"jax is not installed; install it with {INSTALL}") from None
    return topologies
