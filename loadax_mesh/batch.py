"""Batches on a mesh: which rows each host loads, and host-local arrays made global.

The batch dimension (dimension 0) is split over the batch axes, taken in mesh-axis order (as
`MeshConfig.batch_partition_spec` does), into `data_parallel_size` equal shards; the first
batch axis is the major part of a shard's index. A process holds the shards of its devices.

`host_batch_slice` and `data_parallel_size` are numpy work on `mesh.devices` and also take a
`MeshPlan` of simulated devices; only `shard_batch` and `batch_sharding` need jax.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .errors import MeshConfigError
from .groups import AxisNames, axis_positions

if TYPE_CHECKING:
    import jax


@dataclass(frozen=True)
class HostBatchSlice:
    """The rows `[start, stop)` of the global batch that one process loads.

    `num_shards` is the number of distinct row ranges across processes and `shard_index` this
    range's place among them in row order: the arguments of a dataset's `shard()` call.
    """

    start: int
    stop: int
    shard_index: int
    num_shards: int

    @property
    def size(self) -> int:
        """Rows this process loads (`stop - start`)."""
        return self.stop - self.start

    def as_slice(self) -> slice:
        return slice(self.start, self.stop)


@dataclass(frozen=True, eq=False)
class _Layout:
    """Where the batch shards of one (mesh, batch axes) pair live, in shard units."""

    axes: tuple[str, ...]  # batch axes in mesh order
    sizes: tuple[int, ...]
    shards: int  # the data-parallel size
    by_process: dict[int, np.ndarray]  # process -> its sorted distinct shard indices
    problem: str | None  # why processes cannot each load one contiguous range, if they cannot
    ranges: dict[int, tuple[int, int, int]]  # process -> (first shard, end shard, range index)
    num_ranges: int


def _ordered_axes(mesh: Any, batch_axis_names: AxisNames) -> tuple[int, ...]:
    positions = axis_positions(mesh, batch_axis_names, field="batch_axis_names")
    return tuple(sorted(positions))


@functools.lru_cache(maxsize=64)
def _layout(mesh: Any, positions: tuple[int, ...]) -> _Layout:
    devices = np.asarray(mesh.devices)
    names = tuple(mesh.axis_names)
    sizes = tuple(devices.shape[p] for p in positions)
    shard = np.zeros(devices.shape, dtype=np.int64)
    for p, size in zip(positions, sizes, strict=True):
        along = np.arange(size).reshape([size if i == p else 1 for i in range(devices.ndim)])
        shard = shard * size + along
    procs = np.fromiter((d.process_index for d in devices.flat), dtype=np.int64, count=devices.size)
    pairs = np.unique(np.stack([procs, shard.ravel()], axis=1), axis=0)
    split = np.flatnonzero(np.diff(pairs[:, 0])) + 1
    by_process = {int(group[0, 0]): group[:, 1] for group in np.split(pairs, split)}
    axes = tuple(names[p] for p in positions)
    found = _ranges(by_process, axes, sizes)
    problem, (ranges, num_ranges) = (found, ({}, 0)) if isinstance(found, str) else (None, found)
    return _Layout(axes, sizes, math.prod(sizes), by_process, problem, ranges, num_ranges)


def _ranges(
    by_process: dict[int, np.ndarray], axes: tuple[str, ...], sizes: tuple[int, ...]
) -> tuple[dict[int, tuple[int, int, int]], int] | str:
    """Each process's contiguous shard range with its index among the distinct ranges, and
    their number; or the reason why processes cannot each load one range."""
    where = f"batch axes {axes} of sizes {sizes} (shard index row-major in that order)"
    spans = {}
    for proc, held in by_process.items():
        lo, hi = int(held[0]), int(held[-1]) + 1
        if hi - lo != len(held):
            return (
                f"process {proc} holds batch shards {held.tolist()} of {math.prod(sizes)} "
                f"under {where}: not one contiguous range, so it cannot load one slice of "
                "rows. Order the mesh axes so that batch axes crossing processes come before "
                "batch axes inside a process; shard_batch still takes this layout when each "
                "process passes its shards' rows in row order"
            )
        spans[proc] = (lo, hi)
    distinct = sorted(set(spans.values()))
    for (lo_a, hi_a), (lo_b, hi_b) in itertools.pairwise(distinct):
        if lo_b < hi_a:
            return (
                f"processes hold overlapping batch shard ranges [{lo_a}, {hi_a}) and "
                f"[{lo_b}, {hi_b}) under {where}; accepted: ranges that are equal or disjoint"
            )
    lengths = sorted({hi - lo for lo, hi in distinct})
    if len(lengths) > 1:
        return (
            f"processes hold batch shard ranges of different lengths {lengths} under {where}; "
            "accepted: every process holding the same number of shards"
        )
    index = {span: i for i, span in enumerate(distinct)}
    return {p: (*s, index[s]) for p, s in spans.items()}, len(distinct)


def data_parallel_size(mesh: Any, batch_axis_names: AxisNames = "data") -> int:
    """The product of the batch axes' sizes: how many distinct batch shards there are.

    Per-host and gradient-accumulation arithmetic starts here:
    `global_batch = micro_batch * accumulation_steps * data_parallel_size`.
    """
    devices_shape = np.asarray(mesh.devices).shape
    return math.prod(devices_shape[p] for p in _ordered_axes(mesh, batch_axis_names))


def _process(process_index: int | None, layout: _Layout) -> int:
    if process_index is None:
        import jax

        process_index = jax.process_index()
    elif isinstance(process_index, bool) or not isinstance(process_index, int | np.integer):
        raise MeshConfigError(
            f"process_index={process_index!r}; accepted: None or an int process index"
        )
    if int(process_index) not in layout.by_process:
        raise MeshConfigError(
            f"process_index={process_index} holds no device of the mesh; accepted: one of "
            f"{sorted(layout.by_process)}"
        )
    return int(process_index)


def host_batch_slice(
    mesh: Any,
    global_batch_size: int,
    batch_axis_names: AxisNames = "data",
    *,
    process_index: int | None = None,
) -> HostBatchSlice:
    """The rows of the global batch that process `process_index` (default: this one) loads.

    Processes whose devices hold the same rows (a model axis across hosts) share a
    `shard_index`. Sizes that do not divide by the data-parallel size, and layouts where a
    process's rows are not one contiguous range, are a MeshConfigError.
    """
    layout = _layout(mesh, _ordered_axes(mesh, batch_axis_names))
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int | np.integer):
        raise MeshConfigError(
            f"global_batch_size={global_batch_size!r}; accepted: a positive int divisible by "
            f"the data-parallel size {layout.shards}"
        )
    if global_batch_size < 1 or global_batch_size % layout.shards:
        raise MeshConfigError(
            f"global_batch_size={global_batch_size} does not divide into {layout.shards} equal "
            f"batch shards (batch axes {layout.axes} of sizes {layout.sizes}); accepted: a "
            f"positive multiple of {layout.shards}"
        )
    proc = _process(process_index, layout)
    if layout.problem is not None:
        raise MeshConfigError(f"batch_axis_names={batch_axis_names!r}: {layout.problem}")
    rows = int(global_batch_size) // layout.shards
    lo, hi, index = layout.ranges[proc]
    return HostBatchSlice(lo * rows, hi * rows, index, layout.num_ranges)


@functools.lru_cache(maxsize=64)
def _sharding(mesh: Any, axes: tuple[str, ...]) -> jax.sharding.NamedSharding:
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(axes[0] if len(axes) == 1 else axes))


def batch_sharding(
    mesh: jax.sharding.Mesh, batch_axis_names: AxisNames = "data"
) -> jax.sharding.NamedSharding:
    """The `NamedSharding` of a batch: dimension 0 over the batch axes in mesh order."""
    return _sharding(mesh, _layout(mesh, _ordered_axes(mesh, batch_axis_names)).axes)


@dataclass(frozen=True, eq=False)
class _LocalPlan:
    """What shard_batch needs for one (mesh, batch axes) pair in this process."""

    sharding: jax.sharding.NamedSharding
    local: int  # batch shards this process holds
    layout: _Layout


_PLANS: dict[tuple[Any, Any], _LocalPlan] = {}  # keyed by (mesh, batch_axis_names as given)
_MAX_PLANS = 64


def _local_plan(mesh: Any, batch_axis_names: Any) -> _LocalPlan:
    import jax

    layout = _layout(mesh, _ordered_axes(mesh, batch_axis_names))
    process = jax.process_index()
    held = layout.by_process.get(process)
    if held is None:
        raise MeshConfigError(
            f"mesh holds no device of this process ({process}); accepted: a mesh with at "
            "least one device of every process that calls shard_batch"
        )
    plan = _LocalPlan(_sharding(mesh, layout.axes), len(held), layout)
    if isinstance(batch_axis_names, str | tuple):
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[mesh, batch_axis_names] = plan
    return plan


def shard_batch(batch: Any, mesh: jax.sharding.Mesh, batch_axis_names: AxisNames = "data") -> Any:
    """A pytree of host-local arrays (dimension 0: this process's rows) as global jax.Arrays.

    Dimension 0 is sharded over the batch axes; the process's rows are its batch shards in row
    order (one contiguous slice when `host_batch_slice` accepts the layout). Rows that do not
    divide evenly over this process's shards are a MeshConfigError, never padded or dropped.
    """
    import jax

    try:
        plan = _PLANS[mesh, batch_axis_names]
    except (KeyError, TypeError):  # first call for this pair, or names given as a list
        plan = _local_plan(mesh, batch_axis_names)
    local, shards = plan.local, plan.layout.shards
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    out = []
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        if not shape or not hasattr(leaf, "dtype") or shape[0] % local:
            _leaf_error(batch, plan)
        global_shape = (shape[0] // local * shards, *shape[1:])
        out.append(jax.make_array_from_process_local_data(plan.sharding, leaf, global_shape))
    return jax.tree_util.tree_unflatten(treedef, out)


def _leaf_error(batch: Any, plan: _LocalPlan) -> NoReturn:
    """Raise the MeshConfigError for the first leaf of `batch` that shard_batch cannot take."""
    import jax

    layout = plan.layout
    for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
        where = f"batch{jax.tree_util.keystr(path)}"
        shape = getattr(leaf, "shape", None)
        if not shape or not hasattr(leaf, "dtype"):
            raise MeshConfigError(
                f"{where}={_short(leaf)} has no leading batch dimension; accepted: arrays "
                "(numpy or jax) with ndim >= 1"
            )
        rows = operator.index(shape[0])
        if rows % plan.local:
            raise MeshConfigError(
                f"{where} has {rows} rows, but this process holds {plan.local} of the "
                f"{layout.shards} batch shards (batch axes {layout.axes} of sizes "
                f"{layout.sizes}); accepted: a multiple of {plan.local} rows, split evenly "
                "over those shards"
            )
    raise AssertionError("unreachable: every leaf was accepted")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
