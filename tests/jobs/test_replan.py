"""replan on simulated TPU multislice and GPU clusters: the right granules dropped, the batch
kept with more micro-batches, and errors that say what would work."""

from __future__ import annotations

import subprocess
import sys

import pytest

import loadax_mesh as lm
from loadax_mesh import MeshConfigError, Replan, replan

# HSDP written out (not the preset, whose rules may change): shard inside a granule,
# replicate across, the batch over both.
HSDP = lm.MeshConfig(
    lm.HybridMeshShape((1, -1), (-1, 1)), ("replicate", "shard"), ("replicate", "shard")
)


def without(hardware: str, **lose: int) -> list:
    """The simulated devices of `hardware` minus one host (`host=`) or one slice (`slice=`)."""
    ((what, index),) = lose.items()
    attr = "process_index" if what == "host" else "slice_index"
    return [d for d in lm.simulate_devices(hardware) if getattr(d, attr) != index]


def test_a_tpu_slice_missing_a_host_is_dropped_whole() -> None:
    # 4 slices of 256 v5e chips, data across slices (hsdp: replicate=4 x shard=256), batch 1024:
    # 1 row a chip. Host 70 is in slice 1 (64 hosts a slice).
    config = HSDP
    before = config.plan(lm.simulate_devices("tpu-v5litepod-256-4"))
    assert before.shape == {"replicate": 4, "shard": 256}
    devices = without("tpu-v5litepod-256-4", host=70)
    got = replan(config, devices, global_batch=1536, rows_per_device=2)
    assert isinstance(got, Replan) and got.microbatches == 1
    assert got.dropped_granules == (1,) and got.granule == "slice"
    assert len(got.dropped) == 252 and {d.slice_index for d in got.dropped} == {1}
    assert got.plan.shape == {"replicate": 3, "shard": 256}
    assert {d.slice_index for d in got.plan.devices.flat} == {0, 2, 3}
    # the budget of 1 row a device: 2 micro-batches of 768 rows
    got = replan(config, devices, global_batch=1536, rows_per_device=1)
    assert got.microbatches == 2 and got.rows_per_device == 1


def test_a_lost_slice_leaves_the_rest_whole_and_micro_batches_rise() -> None:
    config = HSDP
    # 3072 rows on the 768 devices left: 4 rows a device in one step
    devices = without("tpu-v5litepod-256-4", slice=2)
    got = replan(config, devices, global_batch=3072, rows_per_device=4)
    assert got.dropped == () and got.dropped_granules == ()  # the slice is gone, none is short
    assert got.plan.shape == {"replicate": 3, "shard": 256} and got.microbatches == 1
    got = replan(config, devices, global_batch=3072, rows_per_device=3)
    assert got.microbatches == 2 and got.rows_per_device == 2
    got = replan(config, devices, global_batch=3072, rows_per_device=1)
    assert got.microbatches == 4 and got.rows_per_device == 1


def test_only_the_catalogue_sees_a_loss_in_every_slice() -> None:
    config = lm.MeshConfig((-1,), ("data",))
    lost = {1, 66}  # a host of slice 0 and one of slice 1 of a 2-slice v5p job
    devices = [d for d in lm.simulate_devices("tpu-v5p-512-2") if d.process_index not in lost]
    with pytest.raises(MeshConfigError, match=r"no whole slice is left.*256"):
        replan(config, devices, global_batch=512, rows_per_device=1, hardware="tpu-v5p-512-2")
    # without the hardware string the largest slice (252) counts as whole: nothing dropped
    got = replan(config, devices, global_batch=504, rows_per_device=1)
    assert got.dropped == ()


def test_a_gpu_node_missing_a_gpu_is_dropped() -> None:
    # 4 p5 nodes of 8 H100s, one NVLink domain each; node 2 lost GPU 19.
    config = lm.MeshConfig((-1,), ("fsdp",), "fsdp")
    devices = [d for d in lm.simulate_devices("gpu-p5.48xlarge-32") if d.id != 19]
    got = replan(config, devices, global_batch=48, rows_per_device=2, hardware="gpu-p5.48xlarge-32")
    assert got.dropped_granules == (2,) and len(got.dropped) == 7
    assert 19 not in {d.id for d in got.plan.devices.flat}
    assert got.plan.devices.size == 24 and got.microbatches == 1
    # 32 rows on 24 devices do not divide: what would work is named
    with pytest.raises(MeshConfigError, match=r"multiple of 24 \(e\.g\. 24 or 48\)"):
        replan(config, devices, global_batch=32, rows_per_device=1)
    got = replan(config, devices, global_batch=48, rows_per_device=1)
    assert got.microbatches == 2


def test_an_nvl72_rack_missing_a_gpu_is_dropped() -> None:
    hardware = "gpu-a4x-highgpu-4g-144"  # 2 NVL72 racks
    config = lm.MeshConfig((-1,), ("data",))
    devices = [d for d in lm.simulate_devices(hardware) if d.id != 100]
    got = replan(config, devices, global_batch=144, rows_per_device=1, hardware=hardware)
    assert got.dropped_granules == (1,) and len(got.dropped) == 71
    assert got.plan.devices.size == 72 and got.microbatches == 2


def test_cpu_processes_are_the_granules() -> None:
    config = lm.MeshConfig((-1, 2), ("data", "model"))
    devices = without("cpu-4x2", host=3)
    got = replan(config, devices, global_batch=12, rows_per_device=3, hardware="cpu-4x2")
    assert got.dropped == () and got.plan.shape == {"data": 3, "model": 2}
    assert got.microbatches == 2 and got.rows_per_device == 2
    # a process with one of its two devices gone is dropped
    short = [d for d in devices if d.id != 5]
    got = replan(config, short, global_batch=12, rows_per_device=3)
    assert got.dropped_granules == (2,) and [d.id for d in got.dropped] == [4]
    assert got.plan.shape == {"data": 2, "model": 2} and got.microbatches == 2


def test_a_fixed_shape_that_no_longer_fits_says_why_and_what_would() -> None:
    config = lm.MeshConfig((4, 256), ("replicate", "shard"), "replicate")
    devices = without("tpu-v5litepod-256-4", host=3)
    with pytest.raises(MeshConfigError, match=r"slice 0 has 252 of 256.*768 devices left.*-1"):
        replan(config, devices, global_batch=1024, rows_per_device=1)


def test_a_batch_the_new_degree_does_not_divide_names_what_would() -> None:
    config = lm.MeshConfig((-1,), ("data",))
    devices = without("cpu-4x2", host=0)
    with pytest.raises(MeshConfigError) as err:
        replan(config, devices, global_batch=16, rows_per_device=2)
    text = str(err.value)
    assert "global_batch=16 does not divide by the data-parallel degree 6" in text
    assert "multiple of 6 (e.g. 12 or 18)" in text and "1, 2, 4" in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("global_batch", 0),
        ("global_batch", 8.0),
        ("rows_per_device", True),
        ("rows_per_device", -1),
    ],
)
def test_bad_numbers_are_errors(field: str, value: object) -> None:
    kwargs = {"global_batch": 8, "rows_per_device": 1, field: value}
    with pytest.raises(MeshConfigError, match=f"{field}="):
        replan(lm.MeshConfig((-1,), ("data",)), lm.simulate_devices("cpu-4x2"), **kwargs)


def test_a_hardware_string_that_is_not_the_devices_is_an_error() -> None:
    devices = lm.simulate_devices("cpu-4x2")
    with pytest.raises(MeshConfigError, match="is tpu but the devices are cpu"):
        replan(
            lm.MeshConfig((-1,), ("data",)),
            devices,
            global_batch=8,
            rows_per_device=1,
            hardware="tpu-v5p-8",
        )
    with pytest.raises(MeshConfigError, match="process 0 holds 2"):
        replan(
            lm.MeshConfig((-1,), ("data",)),
            devices,
            global_batch=8,
            rows_per_device=1,
            hardware="cpu-8x1",
        )


def test_replan_imports_no_jax() -> None:
    code = (
        "import sys, loadax_mesh as lm\n"
        "d = [x for x in lm.simulate_devices('tpu-v5litepod-256-4') if x.process_index != 5]\n"
        "c = lm.MeshConfig(lm.HybridMeshShape((1, -1), (-1, 1)), ('r', 's'), ('r', 's'))\n"
        "r = lm.replan(c, d, global_batch=768, rows_per_device=1)\n"
        "assert r.dropped_granules == (0,), r\n"
        "assert 'jax' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
