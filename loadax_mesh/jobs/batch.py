"""Batches on a mesh: which rows each host loads, and host-local arrays made global.

The batch dimension (dimension 0) is split over the batch axes, taken in mesh-axis order (as
`MeshConfig.batch_partition_spec` does), into `data_parallel_size` equal shards; the first
batch axis is the major part of a shard's index. A process holds the shards of its devices.

`shard_blocks` works out which shards each process holds from process indices alone (the CLI's
rows per host use it too). `host_batch_slice` and `data_parallel_size` are numpy work on
`mesh.devices` and also take a `MeshPlan` of simulated devices; only `shard_batch` and
`batch_sharding` need jax.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..errors import MeshConfigError
from ..groups import AxisNames, axis_positions, process_grid

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


@dataclass(frozen=True)
class ShardBlocks:
    """The batch shards one process's devices hold: `blocks` of consecutive shard indices
    `[lo, hi)`, in row order.

    Processes holding the same shards share a `shard_index`, the place of their shard set
    among the `num_shards` distinct sets in row order (compared as sorted shard lists).
    """

    process: int
    blocks: tuple[tuple[int, int], ...]
    shard_index: int
    num_shards: int

    @property
    def count(self) -> int:
        """How many batch shards the process holds."""
        return sum(hi - lo for lo, hi in self.blocks)

    def shards(self) -> list[int]:
        return [s for lo, hi in self.blocks for s in range(lo, hi)]

    def rows(self, rows_per_shard: int) -> tuple[tuple[int, int], ...]:
        """The blocks as row ranges `[start, stop)` of a batch of `rows_per_shard` rows a shard."""
        return tuple((lo * rows_per_shard, hi * rows_per_shard) for lo, hi in self.blocks)


def shard_blocks(processes: np.ndarray, positions: Sequence[int]) -> dict[int, ShardBlocks]:
    """Per process (ascending), the batch shards its devices hold.

    `processes` is the process index of every device, in mesh shape; `positions` are the batch
    axes' places among the mesh axes, in mesh order. A device's shard is its index row-major
    over those axes. Pure numpy, no jax: the one account of the batch layout behind
    `host_batch_slice`, `shard_batch` and the rows per host that `render` shows.
    """
    procs = np.asarray(processes, dtype=np.int64)
    shard = np.zeros(procs.shape, dtype=np.int64)
    for p in positions:
        along = np.arange(procs.shape[p]).reshape([-1 if i == p else 1 for i in range(procs.ndim)])
        shard = shard * procs.shape[p] + along
    pairs = np.unique(np.stack([procs.ravel(), shard.ravel()], axis=1), axis=0)  # sorted
    new_process = np.r_[True, pairs[1:, 0] != pairs[:-1, 0]]
    new_block = new_process | np.r_[True, pairs[1:, 1] != pairs[:-1, 1] + 1]
    starts = np.flatnonzero(new_block)
    ends = np.r_[starts[1:], len(pairs)]
    spans = np.stack([pairs[starts, 1], pairs[ends - 1, 1] + 1], axis=1)
    blocks = np.split(spans, np.flatnonzero(new_process[starts])[1:])
    firsts = np.flatnonzero(new_process)
    held = [tuple(h.tolist()) for h in np.split(pairs[:, 1], firsts[1:])]
    index = {s: i for i, s in enumerate(sorted(set(held)))}
    return {
        p: ShardBlocks(p, tuple((lo, hi) for lo, hi in b.tolist()), index[h], len(index))
        for p, h, b in zip(pairs[firsts, 0].tolist(), held, blocks, strict=True)
    }


@dataclass(frozen=True, eq=False)
class _Layout:
    """Where the batch shards of one (mesh, batch axes) pair live, in shard units."""

    axes: tuple[str, ...]  # batch axes in mesh order
    sizes: tuple[int, ...]
    shards: int  # the data-parallel size
    held: dict[int, ShardBlocks]  # process -> the shards it holds
    problem: str | None  # why processes cannot each load one contiguous range, if they cannot


def _ordered_axes(mesh: Any, batch_axis_names: AxisNames) -> tuple[int, ...]:
    positions = axis_positions(mesh, batch_axis_names, field="batch_axis_names")
    return tuple(sorted(positions))


@functools.lru_cache(maxsize=64)
def _layout(mesh: Any, positions: tuple[int, ...]) -> _Layout:
    devices = np.asarray(mesh.devices)
    held = shard_blocks(process_grid(devices), positions)
    axes = tuple(mesh.axis_names[p] for p in positions)
    sizes = tuple(devices.shape[p] for p in positions)
    return _Layout(axes, sizes, math.prod(sizes), held, _problem(held, axes, sizes))


def _problem(
    held: dict[int, ShardBlocks], axes: tuple[str, ...], sizes: tuple[int, ...]
) -> str | None:
    """Why processes cannot each load one contiguous range of rows; None when they can."""
    where = f"batch axes {axes} of sizes {sizes} (shard index row-major in that order)"
    for proc, shards in held.items():
        if len(shards.blocks) > 1:
            return (
                f"process {proc} holds batch shards {shards.shards()} of {math.prod(sizes)} "
                f"under {where}: not one contiguous range, so it cannot load one slice of "
                "rows. Order the mesh axes so that batch axes crossing processes come before "
                "batch axes inside a process; shard_batch still takes this layout when each "
                "process passes its shards' rows in row order"
            )
    distinct = sorted({shards.blocks[0] for shards in held.values()})
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
    return None


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
    if int(process_index) not in layout.held:
        raise MeshConfigError(
            f"process_index={process_index} holds no device of the mesh; accepted: one of "
            f"{sorted(layout.held)}"
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
    `shard_index`.

    Args:
        mesh: the Mesh (or a MeshPlan's device grid as a Mesh) the batch is sharded over.
        global_batch_size: rows in the global batch.
        batch_axis_names: the batch axis or axes.
        process_index: the process asked about (default `jax.process_index()`).

    Returns:
        A `HostBatchSlice`: `start`, `stop`, `shard_index`, `num_shards`.

    Raises:
        MeshConfigError: a size that does not divide by the data-parallel size, or a layout
            where the process's rows are not one contiguous range.
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
    held = layout.held[proc]
    ((start, stop),) = held.rows(int(global_batch_size) // layout.shards)
    return HostBatchSlice(start, stop, held.shard_index, held.num_shards)


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
    held = layout.held.get(process)
    if held is None:
        raise MeshConfigError(
            f"mesh holds no device of this process ({process}); accepted: a mesh with at "
            "least one device of every process that calls shard_batch"
        )
    plan = _LocalPlan(_sharding(mesh, layout.axes), held.count, layout)
    if isinstance(batch_axis_names, str | tuple):
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[mesh, batch_axis_names] = plan
    return plan


def shard_batch(batch: Any, mesh: jax.sharding.Mesh, batch_axis_names: AxisNames = "data") -> Any:
    """A pytree of host-local arrays (dimension 0: this process's rows) as global jax.Arrays.

    Dimension 0 is sharded over the batch axes; the process's rows are its batch shards in row
    order (one contiguous slice when `host_batch_slice` accepts the layout).

    Args:
        batch: a pytree of arrays whose leading dimension is this process's rows.
        mesh: the Mesh the batch is sharded over.
        batch_axis_names: the batch axis or axes.

    Returns:
        The same pytree of global jax.Arrays, sharded on dimension 0 over the batch axes.

    Raises:
        MeshConfigError: unknown batch axes, or rows that do not divide evenly over this
            process's shards (never padded or dropped).
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
