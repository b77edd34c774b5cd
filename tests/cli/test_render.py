"""render.py on stand-in devices: host rows, the folded grid, SVG and the text report."""

import math
import re
import xml.etree.ElementTree as ET
from collections import defaultdict

import numpy as np
import pytest

from loadax_mesh import MeshConfigError, plan_mesh
from loadax_mesh.render import fold, host_rows, render_grid, render_svg, render_text
from tests.standins import cpu_processes, gpu_nodes, tpu_slices


def v4_two_slices():
    return plan_mesh(
        (2, -1),
        tpu_slices((4, 4, 1), num_slices=2),
        axis_names=("data", "fsdp"),
        batch_axis_names=("data", "fsdp"),
        hardware="tpu-v4-32-2",
    )


def gpu_hsdp():
    return plan_mesh(
        (-1, 8),
        gpu_nodes(4),
        axis_names=("replicate", "shard"),
        batch_axis_names=("replicate", "shard"),
        hardware="gpu-p5.48xlarge-32",
    )


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


PLANS = {
    "tpu-2-slices": v4_two_slices,
    "tpu-fsdp-tp": lambda: plan_mesh(
        (-1, 4), tpu_slices((4, 4, 4)), axis_names=("fsdp", "tp"), batch_axis_names="fsdp"
    ),
    "gpu-hsdp": gpu_hsdp,
    "gpu-dp-only": lambda: plan_mesh(
        (4, 8), gpu_nodes(4), axis_names=("data", "model"), batch_axis_names="data"
    ),
    "cpu-shared": lambda: plan_mesh(
        (2, 4), cpu_processes(2, 4), axis_names=("model", "data"), batch_axis_names="data"
    ),
    "cpu-three-axes": lambda: plan_mesh(
        (2, 2, 2), cpu_processes(2, 4), axis_names=("a", "b", "c"), batch_axis_names=("a", "c")
    ),
}


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


@pytest.mark.parametrize(
    ("shape", "lines", "per_line"),
    [
        ((8,), 1, 8),
        ((2, 4), 2, 4),
        ((256,), 16, 16),
        ((32, 8), 16, 16),
        ((4, 4, 4), 4, 16),
        ((1, 1), 1, 1),
        ((64, 4), 16, 16),
        ((4, 256), 32, 32),
    ],
)
def test_fold(shape, lines, per_line):
    names = tuple(f"a{i}" for i in range(len(shape)))
    view = fold(shape, names, max_per_line=32)
    assert (view.lines, view.per_line) == (lines, per_line)


def test_fold_caption_and_cap():
    assert fold((64, 4), ("fsdp", "tp"), max_per_line=32).caption == "4 of fsdp=64 x tp=4"
    assert fold((2, 4), ("data", "model"), max_per_line=32).caption == "model=4"
    view = fold((1024,), ("x",), max_per_line=20)
    assert view.per_line <= 20 and view.lines * view.per_line == 1024


def grid_hosts(text):
    """The host labels of a plain grid, line by line (the first number is the line offset)."""
    rows = []
    for line in text.splitlines()[1:]:
        if re.fullmatch(r"\s*-+", line) or line.startswith("..."):
            continue
        numbers = [int(x) for x in re.split(r"[\s|]+", line.strip())]
        rows.append(numbers[1:])
    return rows


@pytest.mark.parametrize("name", sorted(PLANS))
def test_grid_cells_are_the_hosts_in_mesh_order(name):
    plan = PLANS[name]()
    text = render_grid(plan)
    assert "\x1b[" not in text
    cells = [h for row in grid_hosts(text) for h in row]
    assert cells == [d.process_index for d in plan.devices.flat]


def test_grid_marks_slices_and_colours():
    plan = v4_two_slices()
    plain = render_grid(plan)
    assert "mark the slice" in plain and re.search(r"^\s+-{10,}$", plain, re.M)
    coloured = render_grid(plan, color=True)
    assert coloured.count("\x1b[0m") == plan.devices.size
    # one colour family per slice: the two slices share no ANSI code
    codes = [set(re.findall(r"\x1b\[\d+;(\d+)m", half)) for half in coloured.split("-" * 10, 1)]
    assert codes[0] and codes[1] and not codes[0] & codes[1]


def test_neighbouring_hosts_get_different_colours():
    plan = plan_mesh((-1,), tpu_slices((4, 4, 4)), axis_names=("fsdp",), batch_axis_names="fsdp")
    coloured = render_grid(plan, color=True)
    grid = [re.findall(r"\x1b\[\d+;(\d+)m *(\d+)", line) for line in coloured.splitlines()[1:]]
    assert sum(map(len, grid)) == 64
    hosts_seen = {h for row in grid for _, h in row}
    assert len(hosts_seen) == 16
    for r, row in enumerate(grid):
        for c, (code, host) in enumerate(row):
            for other in [row[c + 1]] if c + 1 < len(row) else []:
                assert other[1] == host or other[0] != code
            if r + 1 < len(grid):
                below = grid[r + 1][c]
                assert below[1] == host or below[0] != code


def test_grid_is_capped_with_a_note():
    plan = plan_mesh((-1,), tpu_slices((8, 8, 4)), axis_names=("fsdp",), batch_axis_names="fsdp")
    text = render_grid(plan, max_lines=5)
    assert len(grid_hosts(text)) == 5
    assert re.search(r"\.\.\. \d+ more lines \(256 devices\)", text)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_svg_parses_and_draws_every_device(name):
    plan = PLANS[name]()
    root = ET.fromstring(render_svg(plan))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    ns = {"s": "http://www.w3.org/2000/svg"}
    rects = root.findall(".//s:g/s:rect", ns)
    labels = [int(t.text) for t in root.findall(".//s:g/s:text", ns)]
    assert len(rects) == plan.devices.size
    assert labels == [d.process_index for d in plan.devices.flat]
    tips = [t.text for t in root.findall(".//s:g/s:title", ns)]
    assert tips[0].startswith(f"device {plan.devices.flat[0].id}, ")


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
    from loadax_mesh.batch import host_batch_slice

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
