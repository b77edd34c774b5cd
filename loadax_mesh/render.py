"""The plan for people: a text report, a terminal picture of the device grid, and SVG.

Everything here is pure numpy over the plan's device table, so it works the same for simulated
and real devices and never imports jax. The picture folds the mesh (row-major over its axes) into
lines of at most a few dozen cells; each cell is one device, labelled with its host and coloured
by host, or by slice when there are several slices.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import MeshConfigError

if TYPE_CHECKING:
    from .plan import MeshPlan

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


# -- facts about the device set ------------------------------------------------------------


def hardware_summary(plan: MeshPlan) -> dict[str, Any]:
    """Chips, hosts, slices and topology of the plan's devices, read from the device table."""
    table = plan.table
    n = len(table)
    spec = _spec(plan.hardware)
    hosts = len(np.unique(table.process_index))
    slices = 1 if table.slice_index is None else len(np.unique(table.slice_index))
    chips = n
    topology: str
    wrap: list[bool] | None = None
    if table.coords is not None:
        slice_of = np.zeros(n, np.int64) if table.slice_index is None else table.slice_index
        chips = len(np.unique(np.column_stack([slice_of, table.coords]), axis=0))
        first = table.coords[slice_of == slice_of.min()]
        chip_shape = tuple(int(x) + 1 for x in np.ptp(first, axis=0))
        if spec is not None and (*spec.topology, 1, 1, 1)[: len(chip_shape)] == chip_shape:
            chip_shape = spec.topology  # as the catalogue names it (2D on v5e and v6e)
        torus = plan.layout.torus
        if torus is not None and torus.chip_shape == chip_shape:
            wrap = list(torus.wrap)
        else:  # the granules are not slices: ask the catalogue about the whole slice
            from .hardware import wraparound

            wrap = list(wraparound(table.device_kind, chip_shape))
        topology = (
            "x".join(map(str, chip_shape))
            + " chips"
            + (f" per slice, {slices} slices" if slices > 1 else "")
        )
    elif table.platform == "gpu":
        topology = f"{n // hosts} GPUs per host"
        if table.slice_index is not None:
            per = hosts // slices
            topology = (
                f"{slices} NVLink domain{'s' * (slices > 1)} of {n // slices} GPUs "
                f"({per} host{'s' * (per > 1)} each), {topology}"
            )
    else:
        topology = f"{hosts} process{'es' * (hosts > 1)} x {n // hosts} devices"
    return {
        "selector": plan.hardware,
        "platform": table.platform,
        "device_kind": table.device_kind,
        "devices": n,
        "chips": chips,
        "devices_per_chip": n // chips,
        "hosts": hosts,
        "devices_per_host": n // hosts,
        "slices": slices,
        "topology": topology,
        "wraparound": wrap,
        "granules": plan.num_granules,
        "granule_kind": plan.granule_kind,
        "facts": {}
        if spec is None
        else {name: str(fact) for name in _FACTS if (fact := spec.fact(name)) is not None},
    }


_FACTS: tuple[str, ...] = ("hbm", "peak_bf16", "ici_bandwidth", "dcn_bandwidth")
_FACTS += ("nvlink_bandwidth", "network_per_gpu")


def _spec(hardware: str | None) -> Any:
    """The catalogue's HardwareSpec for a hardware string, or None when it names none."""
    from .hardware import parse_hardware

    try:
        return None if hardware is None else parse_hardware(hardware)
    except MeshConfigError:
        return None


# -- rows of the global batch per host -----------------------------------------------------


@dataclass(frozen=True)
class HostRows:
    """The rows of the global batch one host loads: `ranges` of [start, stop), in row order.

    Hosts whose devices hold the same rows share a `shard_index`; `num_shards` counts the
    distinct row sets.
    """

    host: int
    ranges: tuple[tuple[int, int], ...]
    shard_index: int
    num_shards: int

    @property
    def num_rows(self) -> int:
        return sum(stop - start for start, stop in self.ranges)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ranges": [list(r) for r in self.ranges], "num_rows": self.num_rows}


def host_rows(plan: MeshPlan, global_batch: int) -> list[HostRows]:
    """Which rows of a global batch every host loads, from the plan alone (pure numpy).

    Dimension 0 of the batch is split over the batch axes in mesh-axis order (as
    `MeshConfig.batch_partition_spec` orders them); a host loads the rows of every shard its
    devices hold. `loadax_mesh.batch` answers the same question for a real `jax` mesh.
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise MeshConfigError(f"global_batch={global_batch!r}; accepted: a positive integer")
    dims = [i for i, name in enumerate(plan.axis_names) if name in plan.batch_axis_names]
    shape = plan.devices.shape
    degree = math.prod(shape[i] for i in dims)
    if global_batch % degree:
        axes = ", ".join(plan.axis_names[i] for i in dims)
        raise MeshConfigError(
            f"global_batch={global_batch} does not divide by the data-parallel degree {degree} "
            f"(batch axes {axes}); accepted: a positive multiple of {degree}"
        )
    per_shard = global_batch // degree
    position = np.indices(shape)
    shard = np.ravel_multi_index(tuple(position[i] for i in dims), tuple(shape[i] for i in dims))
    host = plan.table.process_index[plan.layout.index]
    pairs = np.unique(np.column_stack([host.ravel(), np.ravel(shard)]), axis=0)  # sorted
    hosts, starts = np.unique(pairs[:, 0], return_index=True)
    shard_sets = [tuple(s.tolist()) for s in np.split(pairs[:, 1], starts[1:])]
    distinct = sorted(set(shard_sets))
    index = {s: i for i, s in enumerate(distinct)}
    return [
        HostRows(int(h), _merge(shards, per_shard), index[shards], len(distinct))
        for h, shards in zip(hosts.tolist(), shard_sets, strict=True)
    ]


def _merge(shards: tuple[int, ...], per_shard: int) -> tuple[tuple[int, int], ...]:
    ranges: list[list[int]] = []
    for s in shards:
        if ranges and ranges[-1][1] == s * per_shard:
            ranges[-1][1] += per_shard
        else:
            ranges.append([s * per_shard, (s + 1) * per_shard])
    return tuple((a, b) for a, b in ranges)


def _fmt_ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{a}:{b}" for a, b in ranges)


def _span(ids: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `0-2,5`."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            a, b = ids[start], ids[i - 1]
            parts.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ",".join(parts)


# -- the picture ---------------------------------------------------------------------------


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


def _sizes(plan: MeshPlan) -> list[tuple[str, str]]:
    return [(a, str(n)) for a, n in plan.shape.items()]


def _cell_data(plan: MeshPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
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


def render_grid(plan: MeshPlan, *, color: bool = False, max_lines: int = MAX_LINES) -> str:
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


def render_svg(plan: MeshPlan) -> str:
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
    cw, ch, top, left = 28, 20, 56, 64
    w, h = left + view.per_line * cw + 8, top + lines * ch + 24
    title = f"{plan.hardware or 'devices'}: mesh " + " x ".join(map("=".join, _sizes(plan)))
    caption = f"{view.lines} lines x {view.per_line} devices in mesh order (a line spans "
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'font-family="monospace" font-size="10">',
        f'<text x="8" y="18" font-size="13">{escape(title)}</text>',
        f'<text x="8" y="36">{escape(f"{caption}{view.caption}); cell = host")}</text>',
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
    if lines < view.lines:
        out.append(f'<text x="8" y="{h - 6}">... {view.lines - lines} more lines not drawn</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- the report ----------------------------------------------------------------------------


def render_text(
    plan: MeshPlan,
    *,
    global_batch: int | None = None,
    color: bool = False,
    notes: tuple[str, ...] = (),
) -> str:
    """The whole report: hardware, mesh with ICI/DCN factors and ring quality, batch rows per
    host (for `global_batch`), and the device grid."""
    hw = hardware_summary(plan)
    lines = [*_hardware_text(hw, plan), *(f"note       {note}" for note in notes), ""]
    lines += [
        f"mesh       {' x '.join(map('='.join, _sizes(plan)))}",
        f"  {'axis':<16} {'size':>6} {'ici':>6} {'dcn':>5} {'ring eff':>9} {'steps/hops':>13} "
        f"{'dcn crossings':>14}",
    ]
    for name, q in plan.quality().items():
        ok = "ok" if q.dcn_ok else f"expected {q.dcn - 1}"
        mark = " *" if name in plan.batch_axis_names else ""
        lines.append(
            f"  {name + mark:<16} {q.size:>6} {q.ici:>6} {q.dcn:>5} "
            f"{q.efficiency:>9.3f} {f'{q.ring_steps}/{q.hops}':>13} "
            f"{f'{q.dcn_crossings} ({ok})':>14}"
        )
    batch = [a for a in plan.axis_names if a in plan.batch_axis_names]
    lines += [
        "",
        f"batch      * axes {', '.join(batch)}: data-parallel degree {plan.data_parallel_size}",
    ]
    if global_batch is not None:
        lines += _rows_text(host_rows(plan, global_batch), global_batch, plan.data_parallel_size)
    lines += ["", render_grid(plan, color=color)]
    return "\n".join(lines)


def _hardware_text(hw: dict[str, Any], plan: MeshPlan) -> list[str]:
    n, hosts, slices = hw["devices"], hw["hosts"], hw["slices"]
    name = f"hardware   {hw['selector'] or 'unknown'}: {hw['device_kind']}, "
    topology = f"topology   {hw['topology']}"
    if hw["platform"] == "tpu":
        each = hw["devices_per_chip"]
        name += (
            f"{hw['chips']} chips ({each} device{'s' * (each > 1)} each), {hosts} hosts, "
            f"{slices} slice{'s' * (slices > 1)}"
        )
        wrapped = ",".join("xyz"[i] for i, w in enumerate(hw["wraparound"] or ()) if w)
        topology += f", wraparound {wrapped or 'none'}"
    elif hw["platform"] == "gpu":
        name += f"{n} GPUs, {hosts} hosts"
    else:
        name += f"{n} devices, {hosts} process{'es' * (hosts > 1)}"
    lines = [name, f"{topology}; granule = {plan.granule_kind} ({plan.num_granules})"]
    facts = hw["facts"]
    if facts:
        unit = {"tpu": "chip", "gpu": "GPU"}.get(hw["platform"], "device")
        shown = [f"{k.replace('_', ' ').replace('bandwidth', 'bw')} {v}" for k, v in facts.items()]
        lines.append(f"catalogue  per {unit}: {', '.join(shown)}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _rows_text(rows: list[HostRows], global_batch: int, degree: int) -> list[str]:
    by_set: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for row in rows:
        by_set.setdefault(row.ranges, []).append(row.host)
    sizes = sorted({r.num_rows for r in rows})
    out = [
        f"           global batch {global_batch}: {_count(global_batch // degree, 'row')} "
        "per shard; "
        f"{_count(len(rows), 'host')} loading {'/'.join(map(str, sizes))} rows each, "
        f"{_count(len(by_set), 'distinct row set')}"
    ]
    if any(len(r.ranges) > 1 for r in rows):
        out += [
            "           some hosts load several ranges: host_batch_slice refuses this layout,",
            "           shard_batch takes each host's ranges concatenated in row order",
        ]
    items = sorted(by_set.items())
    shown = items if len(items) <= 12 else [*items[:8], *items[-2:]]
    for i, (ranges, hosts) in enumerate(shown):
        if len(shown) < len(items) and i == 8:
            out.append(f"             ... {len(items) - 10} more (all of them: --format json)")
        out.append(
            f"             rows {_fmt_ranges(ranges):<16} host{'s' * (len(hosts) > 1)} "
            f"{_span(hosts)}"
        )
    return out
