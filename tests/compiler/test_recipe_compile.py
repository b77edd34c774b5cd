"""The recipe refereed by libtpu's compiler: offloaded tensors leave HBM for host memory."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec

# Small, but with saved tensors large enough (1 MiB each per layer and device) to stand above
# the fixed buffers of a tiny compile.
SMALL = ModelSpec(
    name="small",
    num_layers=2,
    d_model=256,
    d_ff=512,
    num_heads=2,
    num_kv_heads=2,
    head_dim=128,
    vocab_size=512,
    seq_len=512,
)
SAVED = ("layer_input", "query", "key", "value", "out_proj")


@pytest.fixture(scope="module")
def reports():
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices("tpu-v5p-8"))
    return {
        where: compile_step(
            plan, SMALL, TrainSpec(global_batch=16, remat=dict.fromkeys(SAVED, where))
        )
        for where in ("device", "offload")
    }


@pytest.mark.compile
@pytest.mark.slow
def test_offloaded_tensors_are_host_bytes_and_leave_hbm(reports):
    device, offload = reports["device"], reports["offload"]
    assert device.host_bytes == 0
    # Five bf16 tensors of 4 sequences x 512 tokens x 256 per device, in each of 2 layers.
    assert offload.host_bytes == len(SAVED) * SMALL.num_layers * 4 * 512 * 256 * 2
    assert offload.temp_bytes < device.temp_bytes
    # v5p: a ct5p-hightpu-4t VM's 448 GB over its 4 chips (configs/hardware.toml).
    assert offload.host_memory_bytes == 112 * 10**9 and offload.fits is True
    assert (
        offload.remat
        == "layer_input=offload,query=offload,key=offload,value=offload,out_proj=offload"
    )
    data = offload.to_dict()
    assert data["host_bytes"] == offload.host_bytes and data["microbatches"] == 1


def test_host_memory_per_device_from_the_catalogue():
    """A host's (TPU: a multi-host slice's VM's) memory over the devices it serves; None where
    the catalogue does not know it."""
    from loadax_mesh.hardware.catalogue import catalogue, host_memory_per_device

    cat = catalogue()
    per_device = {k: host_memory_per_device(cat.get(p, k)) for p, k in (
        ("tpu", "v6e"), ("tpu", "v5p"), ("tpu", "7x"), ("gpu", "a3-highgpu-8g"),
        ("gpu", "p5.48xlarge"), ("tpu", "v4"), ("cpu", "cpu"),
    )}  # fmt: skip
    assert per_device["v6e"] == 720e9 / 4 and per_device["v5p"] == 448e9 / 4
    assert per_device["7x"] == 960e9 / 8  # 4 chips of 2 devices
    assert per_device["a3-highgpu-8g"] == 1872e9 / 8
    assert per_device["p5.48xlarge"] == 2048 * 2**30 / 8
    assert per_device["v4"] is None and per_device["cpu"] is None


def test_fits_is_judged_on_both_memories():
    from loadax_mesh.compiler.report import _fits

    assert _fits(10, 20, 0, None) is True  # nothing offloaded: host memory not needed
    assert _fits(10, 20, 5, 8) is True
    assert _fits(10, 20, 9, 8) is False
    assert _fits(30, 20, 5, 8) is False
    assert _fits(10, 20, 5, None) is None  # offloaded, host memory unknown
    assert _fits(30, 20, 5, None) is False
    # TPU: a program libtpu compiled fits its HBM by the compiler's own check; the host is ours
    assert _fits(None, 20, 0, None) is True
    assert _fits(None, None, 9, 8) is False
