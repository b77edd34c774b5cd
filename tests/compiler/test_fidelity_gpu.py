"""The simulation against XLA's compile-only GPU devices, for every GPU string of the catalogue."""

from __future__ import annotations

import pytest

from loadax_mesh.compiler.fidelity import catalogue_strings, compare
from loadax_mesh.hardware.topology import topology_devices


def test_every_gpu_instance_type_and_a_partial_rack_are_compared():
    strings = catalogue_strings("gpu")
    for hardware in ("gpu-p5.48xlarge-256", "gpu-a4x-highgpu-4g-144", "gpu-a4x-highgpu-4g-8"):
        assert hardware in strings


@pytest.mark.slow
def test_a_wrong_simulation_is_caught():
    """H100 stand-ins judged against H200 devices; stand-ins against devices listed backwards."""
    assert (
        "device_kind"
        in compare("gpu-p5.48xlarge-16", topology_devices("gpu-p5e.48xlarge-16")).unexplained
    )
    backwards = compare("gpu-p5.48xlarge-16", topology_devices("gpu-p5.48xlarge-16")[::-1])
    assert {"process_index", "ids"} <= set(backwards.unexplained)


@pytest.mark.slow
def test_nvlink_domains_are_granules_on_both():
    """Two NVL72 racks: 36 hosts in 2 NVLink domains, and the plans' granules are the domains,
    though XLA's devices carry slice_index 0 in both racks."""
    result = compare("gpu-a4x-highgpu-4g-144")
    assert "raw slice_index" in result.differences and not result.unexplained
