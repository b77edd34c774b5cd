"""The plan for people: hardware summary, each host's batch rows, the text report; and the
catalogue tables the CLI lists.

Pure numpy over the plan's device table, so it works the same for simulated and real devices
and never imports jax. The device grid picture (terminal and SVG) lives in `picture`;
`render_grid` and `render_svg` are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import MeshConfigError
from ..hardware.detect import match_catalogue
from ..hardware.strings import catalogue_spec
from ..hardware.tori import wraparound
from ..hardware.traits import platform_traits
from ..hardware.words import count_text
from ..jobs.batch import shard_blocks
from .picture import PlanView, render_grid, render_svg, shape_text, span_text, stage_lines

__all__ = ["HostRows", "hardware_summary", "host_rows", "render_grid", "render_svg", "render_text"]


# -- facts about the device set ------------------------------------------------------------


def hardware_summary(plan: PlanView) -> dict[str, Any]:
    """Chips, hosts, slices and topology of the plan's devices, read from the device table;
    the catalogue's facts, or why no catalogue entry names the devices and which facts are
    therefore unknown."""
    table = plan.table
    n = len(table)
    spec = catalogue_spec(plan.hardware)
    traits = platform_traits(table.platform)
    facts, miss = traits.catalogue_facts, None
    if spec is None:  # a selector of the user's, a generic one, or none: ask the devices
        name, miss = match_catalogue(table)
        spec = catalogue_spec(name)
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
            wrap = list(wraparound(table.device_kind, chip_shape))
        topology = (
            "x".join(map(str, chip_shape))
            + " chips"
            + (f" per slice, {slices} slices" if slices > 1 else "")
        )
    elif traits.nvlink_domains:
        topology = f"{count_text(n // hosts, 'GPU')} per host"
        if table.slice_index is not None:
            topology = (
                f"{count_text(slices, 'NVLink domain')} of {count_text(n // slices, 'GPU')} "
                f"({count_text(hosts // slices, 'host')}{' each' * (slices > 1)}), {topology}"
            )
    else:
        topology = f"{count_text(hosts, 'process', 'es')} x {count_text(n // hosts, 'device')}"
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
        "facts": {} if spec is None else {k: str(fact) for k in facts if (fact := spec.fact(k))},
        "catalogue_miss": miss or None,
        "unknown_facts": list(facts) if miss else [],
    }


def catalogue_lines(miss: str | None, unknown: Sequence[str]) -> list[str]:
    """The report's lines when no catalogue entry names the devices: why, and what that
    leaves unknown."""
    if not miss:
        return []
    lines = [f"catalogue  no entry matches: {miss}"]
    if unknown:
        lines.append(f"           so these facts are unknown: {_fact_names(unknown)}")
    return lines


def _fact_names(names: Sequence[str]) -> str:
    return ", ".join(n.replace("_", " ").replace("bandwidth", "bw") for n in names)


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


def host_rows(plan: PlanView, global_batch: int) -> list[HostRows]:
    """Which rows of a global batch every host loads, from the plan alone (pure numpy).

    Dimension 0 of the batch is split over the batch axes in mesh-axis order (as
    `MeshConfig.batch_partition_spec` orders them); a host loads the rows of every shard its
    devices hold. The layout is `batch.shard_blocks`, the same account `host_batch_slice`
    gives, except that a host here may load several row ranges.
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
    host = plan.table.process_index[plan.layout.index]
    return [
        HostRows(held.process, held.rows(global_batch // degree), held.shard_index, held.num_shards)
        for held in shard_blocks(host, dims).values()
    ]


def _fmt_ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{a}:{b}" for a, b in ranges)


# -- the report ----------------------------------------------------------------------------


def render_text(
    plan: PlanView,
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
        f"mesh       {shape_text(plan.shape)}",
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
    lines += stage_lines(plan)
    batch = [a for a in plan.axis_names if a in plan.batch_axis_names]
    lines += [
        "",
        f"batch      * axes {', '.join(batch)}: data-parallel degree {plan.data_parallel_size}",
    ]
    if global_batch is not None:
        lines += _rows_text(host_rows(plan, global_batch), global_batch, plan.data_parallel_size)
    lines += ["", render_grid(plan, color=color)]
    return "\n".join(lines)


def _hardware_text(hw: dict[str, Any], plan: PlanView) -> list[str]:
    n, hosts, slices = hw["devices"], hw["hosts"], hw["slices"]
    name = f"hardware   {hw['selector'] or 'unknown'}: {hw['device_kind']}, "
    topology = f"topology   {hw['topology']}"
    traits = platform_traits(hw["platform"])
    if traits.multislice:
        each = hw["devices_per_chip"]
        name += (
            f"{hw['chips']} chips ({count_text(each, 'device')} each), "
            f"{count_text(hosts, 'host')}, {count_text(slices, 'slice')}"
        )
        wrapped = ",".join("xyz"[i] for i, w in enumerate(hw["wraparound"] or ()) if w)
        topology += f", wraparound {wrapped or 'none'}"
    elif traits.nvlink_domains:
        name += f"{count_text(n, 'GPU')}, {count_text(hosts, 'host')}"
    else:
        name += f"{count_text(n, 'device')}, {count_text(hosts, 'process', 'es')}"
    lines = [name, f"{topology}; granule = {plan.granule_kind} ({plan.num_granules})"]
    facts = hw["facts"]
    if facts:
        unit = traits.unit
        shown = [f"{_fact_names([k])} {v}" for k, v in facts.items()]
        lines.append(f"catalogue  per {unit}: {', '.join(shown)}")
    return lines + catalogue_lines(hw["catalogue_miss"], hw["unknown_facts"])


def _rows_text(rows: list[HostRows], global_batch: int, degree: int) -> list[str]:
    by_set: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for row in rows:
        by_set.setdefault(row.ranges, []).append(row.host)
    sizes = sorted({r.num_rows for r in rows})
    out = [
        f"           global batch {global_batch}: {count_text(global_batch // degree, 'row')} "
        "per shard; "
        f"{count_text(len(rows), 'host')} loading {'/'.join(map(str, sizes))} rows each, "
        f"{count_text(len(by_set), 'distinct row set')}"
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
            f"{span_text(hosts)}"
        )
    return out


# -- the catalogue, listed --------------------------------------------------------------------


def size_text(n: float) -> str:
    """Bytes for a reader: GB, or MB below 10 MB (where GB would read 0.00)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def text_table(rows: list[list[Any]]) -> str:
    """Left-aligned columns, two spaces apart."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


_TPU_COLUMNS = "TPU|title|device_kind|dev/chip|chips/host|slice sizes|HBM/chip|ICI/chip|DCN/chip"
_GPU_COLUMNS = "GPU|device_kind|GPUs/host|NVLink domain|HBM/GPU|NVLink/GPU|network/GPU"


def hardware_text(types: Sequence[Any], *, user_file: str | None = None) -> str:
    """The hardware catalogue (`hardware.list_hardware()`) as TPU, GPU and CPU tables; with a
    user catalogue merged in, a last column says where each entry comes from."""

    def facts(t: Any, *names: str) -> list[str]:
        return [str(t.fact(n) or "-") for n in names]

    origin = ["from"] if user_file else []
    tpu: list[list[Any]] = [_TPU_COLUMNS.split("|") + origin]
    gpu: list[list[Any]] = [_GPU_COLUMNS.split("|") + origin]
    cpu = []
    for t in types:
        per_chip, counts = t.devices_per_chip, t.counts
        traits = platform_traits(t.platform)
        if traits.multislice:
            sizes = f"{counts[0]}-{counts[-1]} ({len(counts)})" if len(counts) > 1 else counts[0]
            tpu.append(
                [
                    t.pattern,
                    t.title,
                    t.device_kind,
                    per_chip,
                    t.devices_per_host // per_chip,
                    sizes,
                    *facts(t, "hbm", "ici_bandwidth", "dcn_bandwidth"),
                    *([t.origin] if user_file else []),
                ]
            )
        elif traits.nvlink_domains:
            gpu.append(
                [
                    t.pattern,
                    t.device_kind,
                    t.devices_per_host,
                    t.nvlink_domain,
                    *facts(t, "hbm", "nvlink_bandwidth", "network_per_gpu"),
                    *([t.origin] if user_file else []),
                ]
            )
        else:
            cpu.append(f"CPU  {t.pattern}: {t.title}")
    return (
        f"{text_table(tpu)}\n\n{text_table(gpu)}\n\n" + "\n".join(cpu) + "\n\nslice sizes: the "
        "counts a TPU string accepts (TensorCores on v2-v4, v5p and 7x; chips on v5e and v6e). "
        "Every fact's source: configs/hardware.toml or --format json"
        + (f"\n\ncatalogue: configs/hardware.toml merged with {user_file}" if user_file else "")
    )


def hardware_data(t: Any) -> dict[str, Any]:
    """A catalogue entry as JSON-ready data, each fact with its unit, status and sources."""
    data = asdict(t)
    data.update(
        pattern=t.pattern, examples=t.examples, facts={name: asdict(fact) for name, fact in t.facts}
    )
    return data


def presets_text(presets: Sequence[Any]) -> str:
    """The strategy presets as a table, then each one's description and mesh rules."""
    rows: list[list[Any]] = [["preset", "axes", "batch axes", "default shape", "--set keywords"]]
    for p in presets:
        c, batch = p.config, p.config.batch_axis_names
        batch = batch if isinstance(batch, str) else ", ".join(batch)
        rows.append(
            [
                p.name,
                ", ".join(c.mesh_axis_names),
                batch,
                shape_text(c.mesh_shape),
                ", ".join(p.keywords()),
            ]
        )
    out = [text_table(rows)]
    for p in presets:
        out.append(f"\n{p.name}: {p.description}")
        rules = [
            ["  " + regex, "all devices on the first axis" if v is None else shape_text(v)]
            for regex, v in p.config.mesh_rules or ()
        ]
        if rules:
            out.append(text_table(rules))
    return "\n".join(out)


def presets_data(presets: Sequence[Any]) -> dict[str, Any]:
    """The presets as JSON-ready data: description, `--set` keywords and config per name."""
    return {
        p.name: {"description": p.description, "overrides": p.keywords(), **p.config.to_dict()}
        for p in presets
    }
