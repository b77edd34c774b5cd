"""XLA's compile-only GPU devices: every GPU kind, granules like the real cluster, the errors,
and a sharded program compiled for two hosts of 8 H100s."""

from __future__ import annotations

import math
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from loadax_mesh import HybridMeshShape, MeshConfig, MeshConfigError, topology_devices
from loadax_mesh.hardware import topology_gpu
from loadax_mesh.hardware.devices import read_devices
from loadax_mesh.hardware.strings import detect_hardware, list_hardware, parse_hardware
from tests.helpers import run_python

INSTALL = "pip install 'loadax-mesh[gpu-aot]'"


def test_every_gpu_kind_of_the_catalogue_has_a_target_config():
    kinds = {t.device_kind for t in list_hardware() if t.platform == "gpu"}
    assert kinds <= set(topology_gpu.target_configs())


@pytest.mark.parametrize(
    ("hardware", "topology"),
    [
        ("gpu-p5.48xlarge-16", "2x1x8"),
        ("gpu-a4x-highgpu-4g-72", "1x18x4"),
        ("gpu-a4x-highgpu-4g-144", "2x18x4"),
        ("gpu-a4x-highgpu-4g-8", "1x2x4"),
    ],
)
@pytest.mark.slow
def test_nvlink_domains_are_partitions(hardware, topology):
    assert topology_gpu.gpu_topology_name(parse_hardware(hardware)) == topology
    devices = topology_devices(hardware)
    spec = parse_hardware(hardware)
    assert len(devices) == spec.num_devices and devices.hardware == hardware
    assert {d.device_kind for d in devices} == {spec.device_kind}
    assert len({d.process_index for d in devices}) == spec.hosts
    assert detect_hardware(devices) == hardware  # the first catalogue entry of its kind


@pytest.mark.slow
def test_the_reader_takes_the_nvlink_domain_from_coords():
    """XLA's devices carry the domain in coords[0]; the planner reads it as slice_index, so two
    racks are two granules (as on the real cluster), not one and not 36 hosts."""
    devices = topology_devices("gpu-a4x-highgpu-4g-144")
    table = read_devices(devices)
    assert table.slice_index.tolist() == [d.coords[0] for d in devices]
    assert sorted(set(table.slice_index.tolist())) == [0, 1]
    config = MeshConfig(mesh_shape=(-1, 72), mesh_axis_names=("data", "fsdp"))
    plan = config.plan(devices, granule="slice")
    assert (plan.ici_mesh_shape, plan.dcn_mesh_shape) == ((1, 72), (2, 1))
    rows = np.vectorize(lambda d: d.coords[0])(plan.devices)
    assert (rows == np.arange(2)[:, None]).all()


def test_a_gpu_kind_without_target_config(monkeypatch):
    known = dict(topology_gpu.target_configs())
    del known["NVIDIA H100 80GB HBM3"]
    monkeypatch.setattr(topology_gpu, "target_configs", lambda: known)
    with pytest.raises(MeshConfigError) as err:
        topology_devices("gpu-p5.48xlarge-16")
    message = str(err.value)
    assert "'NVIDIA H100 80GB HBM3' has no target config" in message
    assert "'NVIDIA B200'" in message and "gpu-p5.48xlarge-16" in message


def test_a_missing_cuda_plugin(monkeypatch):
    monkeypatch.setitem(sys.modules, topology_gpu.PLUGIN, None)
    expected = rf"CUDA plugin .* not installed.*{re.escape(INSTALL)}"
    with pytest.raises(MeshConfigError, match=expected):
        topology_devices("gpu-p5.48xlarge-16")


def test_a_missing_ptxas(monkeypatch):
    found = topology_gpu.ptxas()  # the nvcc wheel's comes first
    assert found.endswith("nvidia/cuda_nvcc/bin/ptxas") and os.access(found, os.X_OK)
    monkeypatch.setattr(topology_gpu, "ptxas", lambda: None)
    with pytest.raises(MeshConfigError, match=rf"no ptxas found.*{re.escape(INSTALL)}"):
        topology_devices("gpu-p5.48xlarge-16")


def test_a_missing_cudnn(monkeypatch):
    versions = topology_gpu._plugin_module("jax_cuda12_plugin._versions", "")

    def missing() -> int:
        raise RuntimeError("cuDNN not found")

    monkeypatch.setattr(versions, "cudnn_get_version", missing)
    with pytest.raises(MeshConfigError, match=rf"cuDNN .* not installed.*{re.escape(INSTALL)}"):
        topology_devices("gpu-a4-highgpu-8g-8")


def test_cpu_strings_are_refused():
    with pytest.raises(MeshConfigError, match=r"'cpu-8' is no TPU or GPU string; accepted"):
        topology_devices("cpu-8")


@pytest.mark.slow
def test_after_jax_started_without_the_cuda_plugin():
    """jax's backends started first, with JAX_PLATFORMS unset: the CUDA plugin refused to
    register then (no CUDA here), and topology_devices registers it afterwards."""
    out = run_python(
        "import os, sys\n"
        "os.environ.pop('JAX_PLATFORMS', None)\n"
        "sys.modules['libtpu'] = None  # this test is about the CUDA plugin\n"
        "import jax\n"
        "from jax._src import xla_bridge\n"
        "print(jax.default_backend(), 'cuda' in xla_bridge._topology_factories)\n"
        "from loadax_mesh import topology_devices\n"
        "devices = topology_devices('gpu-p5.48xlarge-16')\n"
        "skipped = 'JAX_SKIP_CUDA_CONSTRAINTS_CHECK' in os.environ  # set only during the call\n"
        "print(len(devices), jax.default_backend(), skipped)\n"
    )
    assert out.split() == ["cpu", "False", "16", "cpu", "False"]


@pytest.mark.compile
@pytest.mark.slow
def test_a_sharded_matmul_compiles_for_two_hosts_of_eight_h100s():
    devices = topology_devices("gpu-p5.48xlarge-16")
    config = MeshConfig(
        mesh_shape=HybridMeshShape((1, 8), (2, 1)),
        mesh_axis_names=("data", "fsdp"),
        batch_axis_names=("data", "fsdp"),
    )
    plan = config.plan(devices)
    mesh = plan.to_jax_mesh()
    assert {d.process_index for d in mesh.devices[0]} == {0}  # fsdp inside one host
    batch, width = (256, 1024), (1024, 2048)
    x = jax.ShapeDtypeStruct(
        batch, jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    )
    w = jax.ShapeDtypeStruct(
        width, jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("fsdp"))
    )
    compiled = jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(x, w).compile()
    memory = compiled.memory_analysis()
    x_shard = math.prod(batch) * 2 // 16
    w_shard = math.prod(width) * 2 // 8
    assert memory.argument_size_in_bytes == x_shard + w_shard
    assert memory.output_size_in_bytes == batch[0] // 16 * width[1] * 2
    assert memory.temp_size_in_bytes >= width[0] * width[1] * 2  # the all-gathered weight
    assert "all-gather" in compiled.as_text()
