"""The GPU memory pool follows the variable jax's GPU client reads (no jax needed)."""

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, ModelSpec, TrainSpec, estimate
from loadax_mesh.hardware.gpu_targets import device_hbm, device_memory, gpu_pool_fraction
from loadax_mesh.hardware.strings import parse_hardware, simulate_devices

H100 = "NVIDIA H100 80GB HBM3"
VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)


def test_without_a_variable_the_pool_is_jax_default() -> None:
    fraction, where = gpu_pool_fraction()
    assert fraction == 0.75 and "jax's default" in where
    assert device_hbm(parse_hardware("gpu-p5.48xlarge-8").type) == 0.75 * device_memory(H100)


@pytest.mark.parametrize("name", VARS)
def test_the_variable_a_user_sets_sizes_the_pool(monkeypatch: pytest.MonkeyPatch, name: str):
    monkeypatch.setenv(name, "0.9")
    assert gpu_pool_fraction() == (0.9, f"{name}=0.9")
    hardware = "gpu-p5.48xlarge-8"
    assert device_hbm(parse_hardware(hardware).type) == 0.9 * device_memory(H100)
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    e = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=8))
    assert e.hbm_bytes == pytest.approx(0.9 * device_memory(H100))


def test_the_report_says_which_value_was_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadax_mesh.view.compile import gpu_pool_text

    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.9")
    assert "0.9 of the" in gpu_pool_text(int(0.9 * device_memory(H100)))
    assert "(XLA_CLIENT_MEM_FRACTION=0.9)" in gpu_pool_text(int(0.9 * device_memory(H100)))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"XLA_CLIENT_MEM_FRACTION": "0.9", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.8"}, "both set"),
        ({"XLA_CLIENT_MEM_FRACTION": "90%"}, r"XLA_CLIENT_MEM_FRACTION='90%'; accepted: a frac"),
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}, "accepted: a fraction in"),
        ({"XLA_CLIENT_MEM_FRACTION": "0"}, "accepted: a fraction in"),
    ],
)
def test_bad_values_are_errors(monkeypatch: pytest.MonkeyPatch, env: dict, message: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(MeshConfigError, match=message):
        gpu_pool_fraction()
