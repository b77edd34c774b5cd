"""ZeRO-1's layout (TrainSpec.optimizer_over_data): where Adam's moments go when they are cut
over the data-parallel axes too, and the plans that cannot. Pure Python: the step's shardings
(optimizer.py) and the cost model's optimizer term read the same placement.
"""

from __future__ import annotations

import math

from ..errors import MeshConfigError
from .spec import TrainSpec

Entries = tuple[str | tuple[str, ...] | None, ...]  # a PartitionSpec's entries


def optimizer_axes(
    entries: Entries, shape: tuple[int, ...], sizes: dict[str, int], data: tuple[str, ...]
) -> Entries:
    """The mesh axes of an optimizer state shaped `shape` under ZeRO-1, its parameter's
    `entries` (`Roles.mesh_axes`) with the data-parallel axes `data` (`sizes` every axis's)
    added to its first dim that still divides by their degree; a state no dim of which
    divides (a norm's scale, say) stays as its parameter is. Without data axes, `entries`."""
    degree = math.prod(sizes[a] for a in data)
    for k, (n, entry) in enumerate(zip(shape, entries, strict=True)):
        held = (entry,) if isinstance(entry, str) else entry or ()
        if data and n % (math.prod(sizes[a] for a in held) * degree) == 0:
            joined = (*held, *data)
            return (*entries[:k], joined[0] if len(joined) == 1 else joined, *entries[k + 1 :])
    return entries


def check_optimizer_over_data(
    train: TrainSpec, sizes: tuple[tuple[str, int], ...], data: tuple[str, ...]
) -> None:
    """A MeshConfigError naming the field where ZeRO-1 is asked of a plan (mesh axes and
    sizes `sizes`) without a data-parallel axis (`data`) to cut the optimizer over."""
    if train.optimizer_over_data and not data:
        raise MeshConfigError(
            "optimizer_over_data=True: the plan has no data-parallel axis larger than 1 (a "
            "batch axis that is neither the FSDP nor the expert axis) to shard the optimizer "
            f"over (mesh {' x '.join(f'{a}={n}' for a, n in sizes)}); accepted: False, or "
            "a plan with a data axis"
        )
