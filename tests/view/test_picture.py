"""picture.py on stand-in devices: the folded grid, the terminal picture and SVG."""

import re
import xml.etree.ElementTree as ET

import pytest

from loadax_mesh import MeshConfig, plan_mesh, simulate_devices
from loadax_mesh.view.picture import fold, render_grid, render_svg
from tests.standins import tpu_slices
from tests.view.plans import PLANS, v4_two_slices


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


@pytest.mark.parametrize(
    ("hardware", "strategy"),
    [("gpu-a4x-highgpu-4g-144", "fsdp_tp"), ("cpu-8", "dp"), ("tpu-v5p-8192", "fsdp")],
)
def test_svg_is_as_wide_as_its_text(hardware, strategy):
    # Each line of text must fit: x + characters x 0.6 em (a monospace glyph's width).
    plan = MeshConfig.from_preset(strategy).plan(simulate_devices(hardware))
    root = ET.fromstring(render_svg(plan))
    width = int(root.get("width"))
    texts = root.findall(".//{http://www.w3.org/2000/svg}text")
    assert texts[0].text.startswith(f"{hardware}: mesh ")  # the title, whole
    for text in texts:
        size = int(text.get("font-size", root.get("font-size")))
        span = len(text.text) * 0.6 * size
        start = float(text.get("x")) - (span / 2 if text.get("text-anchor") == "middle" else 0)
        assert start >= 0 and start + span <= width, text.text
    assert root.get("viewBox") == f"0 0 {width} {root.get('height')}"  # it scales as a whole
