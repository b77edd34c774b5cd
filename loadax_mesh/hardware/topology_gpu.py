"""Compile-only GPU devices without a GPU: XLA's CUDA client (docs/design.md section 6, GPU part).

`get_topology_desc(platform="cuda", target_config=..., topology="PxHxG")` gives the devices of
a GPU cluster (P NVLink domains, which XLA calls partitions, of H hosts of G GPUs) on a machine
with no GPU, and `jax.jit(...).lower(...).compile()` runs XLA's whole GPU pipeline for them.
The chip's facts come from configs/gpu_targets/ (one file per device_kind). Needs
`pip install 'loadax-mesh[gpu-aot]'`; measured facts: docs/facts/gpu_compile_only.md.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import MeshConfigError
from .gpu_targets import target_configs
from .strings import HardwareSpec

INSTALL = "pip install 'loadax-mesh[gpu-aot]' (the CUDA plugin for jax, ptxas and cuDNN)"
PLUGIN = "jax_plugins.xla_cuda12"
# Where XLA looks for ptxas besides PATH: its CUDA roots (the nvcc wheel's is nvidia/cuda_nvcc).
CUDA_ROOTS = ("/usr/local/cuda", "/opt/cuda")


def gpu_topology_name(spec: HardwareSpec) -> str:
    """XLA's topology string `<partitions>x<hosts per partition>x<GPUs per host>`: an HGX host
    of 8 is its own partition (gpu-p5.48xlarge-16 is 2x1x8), an NVL72 rack one partition of 18
    hosts of 4 (gpu-a4x-highgpu-4g-144 is 2x18x4, a partial rack of 8 GPUs 1x2x4)."""
    hosts = spec.devices_per_slice // spec.devices_per_host
    return f"{spec.slices}x{hosts}x{spec.devices_per_host}"


def target_config(spec: HardwareSpec) -> str:
    """The chip's target config for `spec`, with the installed software's versions added."""
    configs = target_configs()
    path = configs.get(spec.device_kind)
    if path is None:
        raise MeshConfigError(
            f"hardware={spec.hardware!r}: GPU kind {spec.device_kind!r} has no target config in "
            f"configs/gpu_targets/; accepted: GPUs of the kinds {sorted(configs)}"
        )
    return path.read_text() + software_versions(spec.hardware)


def software_versions(hardware: str) -> str:
    """`runtime_version` (the CUDA version the installed plugin was built for) and
    `dnn_version_info` (the installed cuDNN's), as XLA reads them on a GPU machine with this
    install; without runtime_version XLA compiles fp8 matmuls as bf16."""
    versions = _plugin_module("jax_cuda12_plugin._versions", hardware)
    cuda = versions.cuda_runtime_build_version()  # e.g. 12090 for 12.9
    try:
        dnn = versions.cudnn_get_version()  # e.g. 92800 for 9.28.0
    except RuntimeError:
        raise MeshConfigError(
            f"hardware={hardware!r}: cuDNN (nvidia-cudnn-cu12) is not installed; install it "
            f"with {INSTALL}"
        ) from None
    return (
        f"runtime_version {{ major: {cuda // 1000} minor: {cuda % 1000 // 10} }}\n"
        f"dnn_version_info {{ major: {dnn // 10000} minor: {dnn % 10000 // 100} "
        f"patch: {dnn % 100} }}\n"
    )


def ptxas() -> str | None:
    """The ptxas XLA will find (in the nvcc wheel, a CUDA root or on PATH), or None."""
    try:
        wheel = importlib.util.find_spec("nvidia.cuda_nvcc")
    except ModuleNotFoundError:  # no nvidia wheels at all
        wheel = None
    roots = [*(wheel.submodule_search_locations or [] if wheel else []), *CUDA_ROOTS]
    found = (Path(root) / "bin" / "ptxas" for root in roots)
    return next((str(p) for p in found if os.access(p, os.X_OK)), None) or shutil.which("ptxas")


def cuda_devices(spec: HardwareSpec) -> list[Any]:
    """XLA's compile-only devices for a parsed GPU string."""
    _plugin_module(PLUGIN, spec.hardware)
    config = target_config(spec)
    if ptxas() is None:
        raise MeshConfigError(
            f"hardware={spec.hardware!r}: no ptxas found (XLA needs it to compile for GPUs); "
            f"install it with {INSTALL}"
        )
    from jax.experimental import topologies

    from .stderr import quiet_stderr

    def describe() -> list[Any]:
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology=gpu_topology_name(spec)
        )
        return list(desc.devices)

    with _cuda_check_skipped(), quiet_stderr():
        try:
            return describe()
        except NotImplementedError:  # "topology not implemented for cuda": see below
            _register_plugin(spec.hardware)
            return describe()


def _register_plugin(hardware: str) -> None:
    """jax found its plugins before this call, when the CUDA plugin refused to register (no
    CUDA here, and JAX_PLATFORMS did not exclude it): register it now, the check skipped (jax
    never starts a CUDA backend without a GPU). With a GPU here, the refusal stands."""
    if _gpu_visible():
        raise MeshConfigError(
            f"hardware={hardware!r}: the CUDA plugin refused to start on this GPU machine (its "
            "check of the CUDA install failed; jax logged why when it started); accepted: a "
            f"working CUDA install, or run with JAX_PLATFORMS=cpu to compile only ({INSTALL})"
        )
    _plugin_module(PLUGIN, hardware).initialize()


@contextlib.contextmanager
def _cuda_check_skipped() -> Iterator[None]:
    """Where no NVIDIA GPU is visible, the CUDA plugin's check of the CUDA install (which fails
    here) is skipped while jax registers it, so its compile-only client exists."""
    name = "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"
    if _gpu_visible() or name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        del os.environ[name]


def _gpu_visible() -> bool:
    from jax._src import hardware_utils  # the test jax itself uses before starting CUDA

    return bool(hardware_utils.has_visible_nvidia_gpu())


def _plugin_module(name: str, hardware: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise MeshConfigError(
            f"hardware={hardware!r}: the CUDA plugin for jax ({name}) is not installed; "
            f"install it with {INSTALL}"
        ) from None
