"""The simulation against the compile-only devices (libtpu's for TPU, XLA's CUDA client's for
GPU), for every TPU and GPU string of the catalogue."""

from __future__ import annotations

import pytest

from loadax_mesh.compiler.fidelity import catalogue_strings, compare
from loadax_mesh.hardware.topology import topology_devices


@pytest.mark.parametrize("hardware", catalogue_strings("tpu") + catalogue_strings("gpu"))
@pytest.mark.slow
def test_simulation_matches_the_compile_only_devices(hardware):
    result = compare(hardware)
    assert not result.unexplained, f"{hardware}: {result.to_dict()}"


def test_multislice_is_compared_for_the_main_generations():
    strings = catalogue_strings("tpu")
    for key in ("v5litepod", "v5p", "v6e"):
        assert any(s.startswith(f"tpu-{key}-") and s.count("-") == 3 for s in strings)


@pytest.mark.slow
def test_a_wrong_simulation_is_caught():
    """The comparison fails on a real difference: v5p-16 stand-ins judged against v5p-32."""
    result = compare("tpu-v5p-16", topology_devices("tpu-v5p-32"))
    assert "count" in result.unexplained


@pytest.mark.parametrize("hardware", catalogue_strings("tpu")[::7])
@pytest.mark.slow
def test_libtpu_devices_are_named_exactly(hardware):
    from loadax_mesh import MeshConfig, detect_hardware

    devices = list(topology_devices(hardware))  # a plain list: no name to carry along
    assert detect_hardware(devices) == hardware
    plan = MeshConfig((-1,), ("data",)).plan(devices)
    assert plan.describe().startswith(f"hardware   {hardware}: ")


@pytest.mark.slow
def test_a_missing_libtpu_says_what_to_install():
    from tests.helpers import run_python

    out = run_python(  # (this process's libtpu set TPU_LIBRARY_PATH, which jax reads first)
        "import os, sys; os.environ.pop('TPU_LIBRARY_PATH', None); sys.modules['libtpu'] = None\n"
        "from loadax_mesh import MeshConfigError, topology_devices\n"
        "try:\n    topology_devices('tpu-v5p-8')\n"
        "except MeshConfigError as err:\n    print(err)\n"
    )
    assert "libtpu is not installed; install it with pip install 'loadax-mesh[tpu]'" in out


@pytest.mark.parametrize("hardware", ["cpu-8", "tpu-v9-8"])
def test_strings_without_compile_only_devices(hardware):
    from loadax_mesh import MeshConfigError

    with pytest.raises(MeshConfigError, match=f"hardware='{hardware}'"):
        topology_devices(hardware)
