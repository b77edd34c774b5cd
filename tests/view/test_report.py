"""render.py on stand-in devices: host rows, the hardware summary and the text report."""

import math
from collections import defaultdict

import numpy as np
import pytest

from loadax_mesh import MeshConfigError
from loadax_mesh.view.report import host_rows, render_text
from tests.view.plans import PLANS, gpu_hsdp, v4_two_slices


def reference_rows(plan, global_batch):
    """Per host, the set of rows its devices hold, one device at a time."""
    shape = plan.devices.shape
    batch = [i for i, a in enumerate(plan.axis_names) if a in plan.batch_axis_names]
    per = global_batch // math.prod(shape[i] for i in batch)
    rows = defaultdict(set)
    for pos in np.ndindex(shape):
        shard = 0
        for i in batch:
            shard = shard * shape[i] + pos[i]
        rows[plan.devices[pos].process_index].update(range(shard * per, (shard + 1) * per))
    return rows


@pytest.mark.parametrize("name", sorted(PLANS))
def test_host_rows_match_a_device_by_device_reference(name):
    plan = PLANS[name]()
    batch = 4 * plan.data_parallel_size
    rows = host_rows(plan, batch)
    expected = reference_rows(plan, batch)
    assert [r.host for r in rows] == sorted(expected)
    for r in rows:
        got = set()
        for start, stop in r.ranges:
            assert start < stop
            got.update(range(start, stop))
        assert got == expected[r.host] and r.num_rows == len(got)
        assert list(r.ranges) == sorted(r.ranges)
    # hosts share a shard_index exactly when they hold the same rows; indices in row order
    by_index = defaultdict(set)
    for r in rows:
        by_index[r.shard_index].add(r.ranges)
    assert all(len(v) == 1 for v in by_index.values())
    assert len(by_index) == rows[0].num_shards == len({r.ranges for r in rows})
    firsts = [min(v)[0][0] for _, v in sorted(by_index.items())]
    assert firsts == sorted(firsts)


def test_host_rows_by_hand():
    rows = host_rows(gpu_hsdp(), 64)  # 4 nodes of 8: node h holds shards 8h..8h+7
    assert [(r.host, r.ranges, r.shard_index, r.num_shards) for r in rows] == [
        (h, ((16 * h, 16 * h + 16),), h, 4) for h in range(4)
    ]
    shared = host_rows(PLANS["cpu-shared"](), 8)  # each process holds every data shard
    assert [(r.host, r.ranges, r.shard_index, r.num_shards) for r in shared] == [
        (0, ((0, 8),), 0, 1),
        (1, ((0, 8),), 0, 1),
    ]
    assert host_rows(PLANS["gpu-dp-only"](), 8)[3].ranges == ((6, 8),)


@pytest.mark.parametrize("bad", [0, -4, True, 16.5, "16", 30])
def test_host_rows_rejects_bad_batches(bad):
    with pytest.raises(MeshConfigError, match="global_batch"):
        host_rows(gpu_hsdp(), bad)  # degree 32: 30 does not divide


def test_host_rows_error_names_degree_and_axes():
    with pytest.raises(MeshConfigError, match=r"degree 32 \(batch axes replicate, shard\)"):
        host_rows(gpu_hsdp(), 48)


def test_text_report():
    plan = v4_two_slices()
    text = render_text(plan, global_batch=64)
    assert text.startswith(
        "hardware   tpu-v4-32-2: TPU v4, 32 chips (1 device each), 8 hosts, 2 slices"
    )
    assert "topology   4x4x1 chips per slice, 2 slices" in text
    quality = plan.quality()
    for name in plan.axis_names:
        q = quality[name]
        line = next(x for x in text.splitlines() if x.strip().startswith(name))
        assert line.split()[2:5] == [str(q.size), str(q.ici), str(q.dcn)]
        assert f"{q.efficiency:.3f}" in line and f"{q.ring_steps}/{q.hops}" in line
    assert "data-parallel degree 32" in text and "global batch 64: 2 rows per shard" in text
    assert plan.describe() == render_text(plan)
    assert "global batch" not in plan.describe()


def test_text_report_ends_with_the_picture_module_grid():
    from loadax_mesh.view import picture
    from loadax_mesh.view import report as render

    plan = PLANS["cpu-three-axes"]()
    assert render_text(plan).endswith("\n\n" + picture.render_grid(plan))
    assert (render.render_grid, render.render_svg) == (picture.render_grid, picture.render_svg)


def test_text_report_gpu_and_cpu():
    gpu = render_text(gpu_hsdp())
    assert "32 GPUs, 4 hosts" in gpu and "4 NVLink domains of 8 GPUs (1 host each)" in gpu
    cpu = render_text(PLANS["cpu-shared"](), notes=("hello",))
    assert "8 devices, 2 processes" in cpu and "note       hello" in cpu


class _DuckMesh:
    """What batch.host_batch_slice reads of a mesh: devices and axis names (no jax needed)."""

    def __init__(self, plan):
        self.devices, self.axis_names = plan.devices, plan.axis_names


@pytest.mark.parametrize(
    ("hardware", "strategy"),
    [
        ("gpu-p5.48xlarge-256", "fsdp_tp"),
        ("gpu-a4x-highgpu-4g-144", "hsdp"),
        ("tpu-v5p-512", "fsdp_tp"),
        ("tpu-v5p-512", "fsdp"),
        ("tpu-v5litepod-256-4", "hsdp"),
        ("cpu-2x4", "fsdp"),
    ],
)
def test_host_rows_agree_with_batch_host_batch_slice(hardware, strategy):
    from loadax_mesh import MeshConfig, simulate_devices
    from loadax_mesh.jobs.batch import host_batch_slice

    plan = MeshConfig.from_preset(strategy).plan(simulate_devices(hardware), selector=hardware)
    batch = 4 * plan.data_parallel_size
    rows = host_rows(plan, batch)
    if all(len(r.ranges) == 1 for r in rows):
        for r in rows:
            s = host_batch_slice(
                _DuckMesh(plan), batch, plan.batch_axis_names, process_index=r.host
            )
            assert (s.start, s.stop, s.shard_index, s.num_shards) == (
                *r.ranges[0],
                r.shard_index,
                r.num_shards,
            )
    else:  # a host holds several row ranges: host_batch_slice refuses such layouts
        with pytest.raises(MeshConfigError, match="not one contiguous range"):
            host_batch_slice(
                _DuckMesh(plan),
                batch,
                plan.batch_axis_names,
                process_index=next(r.host for r in rows if len(r.ranges) > 1),
            )


def test_shape_text_and_text_table():
    from loadax_mesh import HybridMeshShape
    from loadax_mesh.view.picture import shape_text
    from loadax_mesh.view.report import text_table

    assert shape_text([16, 16]) == "(16, 16)"
    assert shape_text(HybridMeshShape((16, 4), (4, 1))) == "ici (16, 4) x dcn (4, 1)"
    table = text_table([["axis", "size"], ["data", 16], ["tensor-parallel", 4]])
    assert table.splitlines() == [
        "axis             size",
        "data             16",
        "tensor-parallel  4",
    ]


def test_a_refused_compile_gives_the_step_as_written_and_squeezed():
    from loadax_mesh.compiler.report import CompileReport
    from loadax_mesh.view.compile import render_report

    refused = CompileReport(
        hardware="tpu-v5litepod-256", mesh={"fsdp": 256}, model="llama3-70b", global_batch=256,
        remat="full", attention="splash", compile_seconds=1.0, argument_bytes=None,
        output_bytes=None, temp_bytes=None, alias_bytes=None, total_bytes=23_751_000_000,
        hbm_bytes=16_911_433_728, fits=False, flops=None, collectives=(),
        message="RESOURCE_EXHAUSTED: Ran out of memory on HBM", squeezed_bytes=21_784_202_752,
    )  # fmt: skip
    text = render_report(refused, [])
    assert "refused    RESOURCE_EXHAUSTED" in text and "does NOT fit" in text
    assert "memory     23.75 GB per device" in text
    assert "the step as written; the compiler's own extra remat got it to 21.78 GB," in text


def test_one_host_is_not_hosts() -> None:
    from loadax_mesh import MeshConfig, simulate_devices

    text = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5litepod-8")).describe()
    assert "8 chips (1 device each), 1 host, 1 slice" in text


@pytest.mark.parametrize("order", [("pipeline", "fsdp"), ("fsdp", "pipeline")])
def test_report_lists_the_devices_of_each_pipeline_stage(order):
    from loadax_mesh import plan_mesh
    from loadax_mesh.view.picture import span_text
    from tests.standins import tpu_slices

    # 4 slices of 16 chips, a pipeline of 4 stages across them (first or last axis)
    shape = (4, -1) if order[0] == "pipeline" else (-1, 4)
    plan = plan_mesh(
        shape,
        tpu_slices((4, 4, 1), num_slices=4),
        axis_names=order,
        batch_axis_names=("fsdp",),
        hardware="tpu-v4-32-4",
    )
    lines = render_text(plan).splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith("stages     pipeline=4"))
    rows = lines[head + 1 : head + 5]
    k = plan.axis_names.index("pipeline")
    for s, row in enumerate(rows):
        devices = np.take(plan.devices, s, axis=k).ravel()
        slices = sorted({d.slice_index for d in devices})
        hosts = sorted({d.process_index for d in devices})
        ids = sorted(d.id for d in devices)
        assert row.split(":", 1)[0].strip() == f"stage {s}"
        assert f"slice{'s' * (len(slices) > 1)} {span_text(slices)}," in row
        assert f"hosts {span_text(hosts)}, device ids {span_text(ids)}" in row
    assert not any(line.startswith("stages") for line in render_text(v4_two_slices()).splitlines())
