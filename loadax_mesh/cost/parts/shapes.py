"""Arrays as the device stores them: the per-device sizes the memory and traffic models share,
an array's bytes in whole TPU memory tiles, and one device's shard of every parameter."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ...workload.layout import Logical, Roles, param_shapes
from ...workload.spec import ModelSpec, TrainSpec
from ...workload.zero import optimizer_axes


@dataclass(frozen=True)
class Shapes:
    """The per-device sizes the memory and traffic models share."""

    tokens: int  # tokens one device computes a step (its batch rows times its sequence slice)
    rows: int  # sequences one device holds
    micro_rows: int  # of which one micro-batch computes at a time
    seq: int  # sequence slice length
    heads: int  # query heads on one device
    kv_heads: int
    mlp: int  # d_ff on one device
    vocab: int  # vocabulary on one device

    @classmethod
    def of(cls, model: ModelSpec, train: TrainSpec, roles: Roles) -> Shapes:
        rows = train.global_batch // roles.size("batch")
        seq = model.seq_len // roles.size("seq")
        m = roles.size("model")
        return cls(
            tokens=rows * seq,
            rows=rows,
            micro_rows=max(1, rows // train.microbatches),
            seq=seq,
            heads=model.num_heads // m,
            kv_heads=model.num_kv_heads // m,
            mlp=model.d_ff // m,
            vocab=model.vocab_size // m,
        )


@lru_cache(maxsize=65536)
def stored(
    shape: tuple[int, ...], nbytes: int, tile: tuple[int, int] | None, *, minor: int | None = None
) -> int:
    """Bytes an array takes in memory. On TPU the compiler puts a dim in the 128 lanes (the one
    that wastes least, or `minor` where the op fixes it, as a matmul fixes its contracted dim)
    and the largest other dim in the rows (8 for 4-byte types, 16 for 2-byte); a dim shorter
    than a row tile takes a smaller tile, as T(4,128) does."""
    elements = math.prod(shape)
    if tile is None or not shape:
        return elements * nbytes
    rows, lanes = tile[0] * max(1, 4 // nbytes), tile[1]
    sizes = []
    for k in range(len(shape)) if minor is None else (minor % len(shape),):
        rest = [d for j, d in enumerate(shape) if j != k]
        second = max(rest, default=1)
        padded_second = second if second < rows else -(-second // rows) * rows
        sizes.append(-(-shape[k] // lanes) * lanes * padded_second * (math.prod(rest) // second))
    return min(sizes) * nbytes


@lru_cache(maxsize=4096)
def shard_bytes(model: ModelSpec, roles: Roles, nbytes: int, tile: tuple[int, int] | None) -> int:
    """Bytes of one device's shard of every parameter, stored in `nbytes`-byte words."""
    params = _params(model)
    sizes = dict(roles.sizes)
    degree: dict[str | None, int] = {None: 1}  # each logical name's shards (names map alone)
    for name in {n for _, logical in params for n in logical if n is not None}:
        entry = roles.mesh_axes((name,))[0]
        axes = (entry,) if isinstance(entry, str) else entry or ()
        degree[name] = math.prod(sizes[a] for a in axes)
    return sum(
        stored(tuple(d // degree[n] for d, n in zip(shape, logical, strict=True)), nbytes, tile)
        for shape, logical in params
    )


@lru_cache(maxsize=4096)
def optimizer_bytes(
    model: ModelSpec, roles: Roles, nbytes: int, tile: tuple[int, int] | None
) -> int:
    """Bytes of one device's shard of one of Adam's moments under ZeRO-1
    (TrainSpec.optimizer_over_data): each parameter's shard cut over the data-parallel axes
    too, where a dim divides (`zero.optimizer_axes`)."""
    sizes, data = dict(roles.sizes), roles.data_parallel_axes()
    return sum(
        stored(
            cut(shape, optimizer_axes(roles.mesh_axes(logical), shape, sizes, data), sizes),
            nbytes,
            tile,
        )
        for shape, logical in _params(model)
    )


def cut(
    shape: tuple[int, ...],
    entries: tuple[str | tuple[str, ...] | None, ...],
    sizes: dict[str, int],
) -> tuple[int, ...]:
    """One device's part of an array shaped `shape` whose dims go over the mesh axes of
    `entries` (a PartitionSpec's)."""
    out = []
    for d, entry in zip(shape, entries, strict=True):
        axes = (entry,) if isinstance(entry, str) else entry or ()
        out.append(d // math.prod(sizes[a] for a in axes))
    return tuple(out)


@lru_cache(maxsize=64)
def _params(model: ModelSpec) -> tuple[tuple[tuple[int, ...], Logical], ...]:
    """`param_shapes`'s (shape, logical axes) pairs, found once a model."""
    return tuple(param_shapes(model).values())
