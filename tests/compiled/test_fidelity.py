"""The simulation against libtpu's compile-only devices, for every TPU string of the catalogue."""

from __future__ import annotations

import pytest

from loadax_mesh.fidelity import catalogue_strings, compare
from loadax_mesh.topology import topology_devices


@pytest.mark.parametrize("hardware", catalogue_strings("tpu"))
def test_simulation_matches_libtpu(hardware):
    result = compare(hardware)
    assert not result.unexplained, f"{hardware}: {result.to_dict()}"


def test_multislice_is_compared_for_the_main_generations():
    strings = catalogue_strings("tpu")
    for key in ("v5litepod", "v5p", "v6e"):
        assert any(s.startswith(f"tpu-{key}-") and s.count("-") == 3 for s in strings)


def test_a_wrong_simulation_is_caught():
    """The comparison fails on a real difference: v5p-16 stand-ins judged against v5p-32."""
    result = compare("tpu-v5p-16", topology_devices("tpu-v5p-32"))
    assert "count" in result.unexplained
