"""The quick lane's guard (tests/quick_lane.py) refuses a TPU or GPU client before it starts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax._src import xla_bridge

from loadax_mesh.hardware.topology import topology_devices
from tests.quick_lane import CLIENT_STARTS, QuickLaneError, guarded

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("hardware", ["tpu-v5p-8", "gpu-p5.48xlarge-16"])
def test_a_compile_only_client_is_refused_before_it_starts(hardware):
    originals = {name: getattr(xla_bridge, name) for name in CLIENT_STARTS}
    with pytest.raises(QuickLaneError, match="not marked slow"), guarded("a test"):
        topology_devices(hardware)
    assert {name: getattr(xla_bridge, name) for name in CLIENT_STARTS} == originals


def test_a_swallowed_refusal_still_fails_the_test():
    refusal = pytest.raises(QuickLaneError, match="libtpu's TPU compile-only client")
    with refusal, guarded("a test"), contextlib.suppress(AssertionError):
        topology_devices("tpu-v5p-8")  # the test swallows the refusal


def test_cpu_work_and_simulated_plans_pass():
    import jax.numpy as jnp

    from loadax_mesh import MeshConfig, simulate_devices

    with guarded("a test") as refused:
        MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-512"))
        assert float(jnp.arange(4.0).sum()) == 6.0  # this process's CPU backend
    assert refused == []


@pytest.mark.slow
def test_the_conftest_hooks_fail_an_unmarked_test_and_pass_a_slow_one(tmp_path):
    """Wired as the suite runs it: pytest with tests/conftest.py as a plugin, on two tests
    that start libtpu's client, one marked slow (which really starts it)."""
    (tmp_path / "test_lane.py").write_text(
        "import pytest\n"
        "from loadax_mesh.hardware.topology import topology_devices\n\n"
        "def test_unmarked():\n    topology_devices('tpu-v5p-8')\n\n"
        "@pytest.mark.slow\n"
        "def test_marked():\n    topology_devices('tpu-v5p-8')\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rA"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED test_lane.py::test_unmarked - tests.quick_lane.QuickLaneError" in done.stdout
    assert "PASSED test_lane.py::test_marked" in done.stdout
