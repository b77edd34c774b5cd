"""The device grid as a picture: a terminal grid and an SVG document.

Pure numpy over the plan's device table, so it works the same for simulated and real devices
and never imports jax. The picture folds the mesh (row-major over its axes) into lines of at
most a few dozen cells; each cell is one device, labelled with its host and coloured by host,
or by slice when there are several slices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

import numpy as np

from ..hardware.devices import DeviceTable
from ..quality import AxisQuality
from ..shapes import HybridMeshShape
from ..solver.hybrid import Layout
from ..workload.layout import PIPELINE_NAMES


class PlanView(Protocol):
    """What the pictures, the text report and the exports read of a `MeshPlan`. plan.py calls
    them to describe and export itself, so they name the plan's attributes here instead of
    importing MeshPlan (which would close a circle)."""

    @property
    def axis_names(self) -> tuple[str, ...]: ...
    @property
    def batch_axis_names(self) -> tuple[str, ...]: ...
    @property
    def ici_mesh_shape(self) -> tuple[int, ...]: ...
    @property
    def dcn_mesh_shape(self) -> tuple[int, ...]: ...
    @property
    def devices(self) -> np.ndarray: ...
    @property
    def granule_kind(self) -> str: ...
    @property
    def hardware(self) -> str: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def table(self) -> DeviceTable: ...
    @property
    def shape(self) -> dict[str, int]: ...
    @property
    def num_granules(self) -> int: ...
    @property
    def data_parallel_size(self) -> int: ...
    def quality(self) -> dict[str, AxisQuality]: ...


MAX_LINE_CHARS = 100  # the text picture stays this narrow
MAX_LINES = 64  # and this short; larger grids are cut with a note (the SVG has them all)
MAX_SVG_CELLS = 1 << 16

# ANSI backgrounds, 6 hues x 2 shades: normal with white text, bright with black text.
_ANSI = [f"\x1b[97;{code}m" for code in range(41, 47)]
_ANSI += [f"\x1b[30;{code}m" for code in range(101, 107)]
_RESET = "\x1b[0m"
# The same 6 hues for SVG: dark shades, then light ones.
_SVG: tuple[str, ...] = ("#e57373", "#81c784", "#ffd54f", "#64b5f6", "#ba68c8", "#4dd0e1")
_SVG += ("#ffcdd2", "#c8e6c9", "#fff59d", "#bbdefb", "#e1bee7", "#b2ebf2")


@dataclass(frozen=True)
class GridView:
    """The mesh folded to 2D: mesh position `p` (row-major) is drawn on line `p // per_line`."""

    lines: int
    per_line: int
    caption: str


def fold(shape: tuple[int, ...], names: tuple[str, ...], *, max_per_line: int) -> GridView:
    """Fold a mesh into lines: whole trailing axes per line when that gives a readable
    rectangle, else split one axis so that a line holds about sqrt(devices) cells."""
    n = math.prod(shape)
    suffix = [math.prod(shape[k:]) for k in range(len(shape) + 1)]  # suffix[len] == 1

    def badness(per_line: int) -> float:
        return abs(math.log((n // per_line) / per_line))

    def readable(per_line: int) -> bool:
        lines = n // per_line
        return lines <= min(2 * per_line, MAX_LINES) and per_line <= max(16, 8 * lines)

    aligned = [c for c in set(suffix) if c <= max_per_line]
    best = min(aligned, key=lambda c: (not readable(c), badness(c), -c))
    if not readable(best):
        target = min(max(round(math.sqrt(n)), 1), max_per_line)
        k = max(i for i, p in enumerate(suffix) if p >= target)
        if k < len(shape):
            options = [
                suffix[k + 1] * d
                for d in range(1, shape[k] + 1)
                if shape[k] % d == 0 and suffix[k + 1] * d <= max_per_line
            ]
            split = min(options, key=lambda c: (abs(c - target), -c))
            if badness(split) < badness(best):
                best = split
    return GridView(n // best, best, _caption(shape, names, best))


def _caption(shape: tuple[int, ...], names: tuple[str, ...], per_line: int) -> str:
    """Which axes one line spans, e.g. `fsdp 16 of 256` or `fsdp=32 x model=4`."""
    parts: list[str] = []
    left = per_line
    for size, name in zip(reversed(shape), reversed(names), strict=True):
        if left == 1:
            break
        if left >= size:
            parts.append(f"{name}={size}")
            left //= size
        else:
            parts.append(f"{left} of {name}={size}")
            left = 1
    return " x ".join(reversed(parts)) or "one device"


def shape_text(shape: Any, *, drop_ones: bool = False, compact: bool = False) -> str:
    """A mesh shape as text, the one way every report writes one: axis sizes by name (a
    mapping) as `data=2 x model=4` (`drop_ones`: without the axes of size 1); a HybridMeshShape
    as `ici (16, 4) x dcn (4, 1)`; bare sizes as `(16, 16)`, or `(16,16)` with `compact` (the
    ranking's columns)."""
    if isinstance(shape, Mapping):
        return " x ".join(f"{a}={n}" for a, n in shape.items() if n > 1 or not drop_ones)
    if isinstance(shape, HybridMeshShape):
        return f"ici {shape_text(shape.ici_mesh_shape)} x dcn {shape_text(shape.dcn_mesh_shape)}"
    if compact:
        return "(" + ",".join(map(str, shape)) + ")"
    return str(tuple(shape))


def span_text(ids: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `0-2,5`."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            a, b = ids[start], ids[i - 1]
            parts.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ",".join(parts)


def stage_lines(plan: PlanView, *, most: int = 12) -> list[str]:
    """Which granules, hosts and devices form each stage of the plan's pipeline axis (none
    without one larger than 1); `most` stages listed, the rest counted."""
    axis = next((a for a in plan.axis_names if a in PIPELINE_NAMES and plan.shape[a] > 1), None)
    if axis is None:
        return []
    k, stages = plan.axis_names.index(axis), plan.shape[axis]
    rows = np.moveaxis(plan.layout.index, k, 0).reshape(stages, -1)  # device table rows
    lead = k == 0 or math.prod(plan.devices.shape[:k]) == 1  # a stage is a run of the grid
    out = [
        f"stages     {axis}={stages}: each stage runs 1/{stages} of the pipelined layers, "
        "its activations passed to the next by collective-permute on this axis"
        + ("; the grid draws the stages one after the other" if lead else "")
    ]
    shown = list(range(stages)) if stages <= most else [*range(most - 2), stages - 2, stages - 1]
    for s in shown:
        if stages > most and s == stages - 2:
            out.append(f"             ... {stages - most} more stages")
        granules = sorted(set(plan.layout.granule[rows[s]].tolist()))
        hosts = sorted(set(plan.table.process_index[rows[s]].tolist()))
        ids = sorted(plan.table.ids[rows[s]].tolist())
        kind = plan.granule_kind
        # a granule that is the host says nothing more; "none" is one granule of everything
        where = "" if kind in ("none", "process") else (
            f"{kind}{'s' * (len(granules) > 1)} {span_text(granules)}, "
        )  # fmt: skip
        out.append(
            f"             stage {s}: {where}"
            f"host{'s' * (len(hosts) > 1)} {_capped(hosts)}, device ids {_capped(ids)}"
        )
    return out


def _capped(values: list[int], most: int = 72) -> str:
    """span_text, or where that is longer than `most` characters its count and ends."""
    text = span_text(values)
    return text if len(text) <= most else f"{len(values)} from {values[0]} to {values[-1]}"


def _cell_data(plan: PlanView) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per mesh position (row-major, flat): host, granule, device id; and whether granules
    matter to the picture (several of them, and not one per host)."""
    index = plan.layout.index.ravel()
    host = plan.table.process_index[index]
    granule = plan.layout.granule[index]
    hosts = len(np.unique(host))
    pairs = len(np.unique(host * plan.num_granules + granule))
    by_granule = plan.num_granules > 1 and not (pairs == hosts == plan.num_granules)
    return host, granule, plan.table.ids[index], by_granule


def _colour_index(hosts: np.ndarray, granules: np.ndarray, by_granule: bool) -> np.ndarray:
    """0..11 per cell of a 2D picture: hue by granule and one of 2 shades per host, or one of
    12 colours per host; neighbouring hosts get different shades where the palette allows."""
    k = 2 if by_granule else 12
    pairs = [
        np.stack([a[a != b], b[a != b]], 1)
        for a, b in ((hosts[:, 1:], hosts[:, :-1]), (hosts[1:], hosts[:-1]))
    ]
    edges = np.unique(np.concatenate([*pairs, *(p[:, ::-1] for p in pairs)]), axis=0)
    neighbours: dict[int, list[int]] = {}
    for a, b in edges.tolist():
        neighbours.setdefault(a, []).append(b)
    order, first = np.unique(hosts, return_index=True)
    shade: dict[int, int] = {}
    used = [0] * k
    for h in order[np.argsort(first)].tolist():  # in order of first appearance
        taken = {shade[n] for n in neighbours.get(h, ()) if n in shade}
        free = [c for c in range(k) if c not in taken] or list(range(k))
        shade[h] = min(free, key=lambda c: (used[c], c))
        used[shade[h]] += 1
    shades = np.vectorize(shade.__getitem__, otypes=[np.int64])(hosts)
    return (granules % 6) + 6 * shades if by_granule else shades


def render_grid(plan: PlanView, *, color: bool = False, max_lines: int = MAX_LINES) -> str:
    """The device grid as terminal text: each cell shows its host; `|` and `-` mark granule
    boundaries; ANSI colours when `color`."""
    host, granule, _, by_granule = _cell_data(plan)
    width = len(str(int(host.max())))
    view = fold(
        plan.devices.shape,
        plan.axis_names,
        max_per_line=max(1, (MAX_LINE_CHARS - 8) // (width + 1)),
    )
    hosts = host.reshape(view.lines, view.per_line)
    grans = granule.reshape(view.lines, view.per_line)
    colours = _colour_index(hosts, grans, by_granule)
    shown = min(view.lines, max_lines)
    out = [
        f"grid: {view.lines} lines x {view.per_line} devices in mesh order "
        f"(a line spans {view.caption}); cell = host"
        + (f"; colour and | - mark the {plan.granule_kind}" if by_granule else "")
    ]
    for r in range(shown):
        if r and by_granule and (grans[r] != grans[r - 1]).any():
            out.append(" " * 8 + "-" * (view.per_line * (width + 1) - 1))
        cells = []
        for c in range(view.per_line):
            if c:
                cells.append("|" if by_granule and grans[r, c] != grans[r, c - 1] else " ")
            text = str(int(hosts[r, c])).rjust(width)
            cells.append(f"{_ANSI[colours[r, c]]}{text}{_RESET}" if color else text)
        out.append(f"{r * view.per_line:>7} " + "".join(cells))
    if shown < view.lines:
        out.append(
            f"... {view.lines - shown} more lines ({plan.devices.size} devices); "
            "the whole grid: --svg FILE or --format json"
        )
    return "\n".join(out)


def render_svg(plan: PlanView) -> str:
    """The same picture as a standalone SVG document; each cell's tooltip names the device."""
    host, granule, ids, by_granule = _cell_data(plan)
    view = fold(plan.devices.shape, plan.axis_names, max_per_line=64)
    lines = min(view.lines, MAX_SVG_CELLS // view.per_line)
    colours = _colour_index(
        host[: lines * view.per_line].reshape(lines, -1),
        granule[: lines * view.per_line].reshape(lines, -1),
        by_granule,
    ).ravel()
    coords = np.unravel_index(np.arange(host.size), plan.devices.shape)
    cw, ch, top = 28, 20, 56
    left = max(64, 16 + _text_width(str((lines - 1) * view.per_line), 10))
    title = f"{plan.hardware}: mesh {shape_text(plan.shape)}"
    caption = (
        f"{view.lines} lines x {view.per_line} devices in mesh order (a line spans "
        f"{view.caption}); cell = host"
    )
    more = f"... {view.lines - lines} more lines not drawn" if lines < view.lines else ""
    text_width = max(_text_width(title, 13), _text_width(caption, 10), _text_width(more, 10))
    w, h = max(left + view.per_line * cw, 8 + text_width) + 8, top + lines * ch + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="monospace" font-size="10">',
        f'<text x="8" y="18" font-size="13">{escape(title)}</text>',
        f'<text x="8" y="36">{escape(caption)}</text>',
    ]
    for pos in range(lines * view.per_line):
        r, c = divmod(pos, view.per_line)
        x, y = left + c * cw, top + r * ch
        if c == 0:
            out.append(f'<text x="8" y="{y + 14}">{pos}</text>')
        at = ", ".join(f"{a}={int(coords[i][pos])}" for i, a in enumerate(plan.axis_names))
        tip = f"device {ids[pos]}, host {host[pos]}, {plan.granule_kind} {granule[pos]}: {at}"
        out.append(
            f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{cw - 2}" '
            f'height="{ch - 2}" fill="{_SVG[colours[pos]]}" stroke="#555" '
            f'stroke-width="0.5"/><text x="{x + cw // 2 - 1}" y="{y + 13}" '
            f'text-anchor="middle">{host[pos]}</text></g>'
        )
    if more:
        out.append(f'<text x="8" y="{h - 6}">{escape(more)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _text_width(text: str, font_size: int) -> int:
    """Pixels `text` takes in a monospace font: a glyph is about 0.6 em wide in the common
    ones (DejaVu Sans Mono, Menlo, Courier); 0.65 leaves room for wider ones."""
    return math.ceil(len(text) * 0.65 * font_size)
