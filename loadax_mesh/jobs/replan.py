"""Losing hardware: plan the same config on what is left (docs/design.md section 10).

`replan` is stateless: a restarted process calls it with the devices it sees. It drops every
granule that lost a device (a TPU slice missing a host has no torus; an NVLink domain missing a
GPU has a hole in its switch), plans the config on the rest, and finds the fewest
gradient-accumulation micro-batches that keep the global batch without any device holding more
rows than the job's budget. Pure Python and numpy: no jax.

How a lost device is seen from the survivors alone: the unit that can lose devices is the
physical granule, the `slice_index` where the devices carry one (a TPU slice, a GPU NVLink
domain) and the process otherwise (a CPU process, a GPU host without slice_index). Its full
size is the catalogue's, when `hardware` names what the job started on (`tpu-v5p-512-4`: 256
devices a slice), else the size of the largest unit left. Without `hardware`, a unit is thus
seen short only next to a whole one: when every unit lost devices, pass `hardware`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import MeshConfigError
from ..hardware.devices import GranuleSpec, read_devices
from ..hardware.strings import parse_hardware

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..plan import MeshPlan


@dataclass(frozen=True)
class Replan:
    """The plan on the devices left, the micro-batches that keep the batch, the idle devices.

    `dropped` holds the devices of the granules that lost devices, in the order given;
    `dropped_granules` those granules' keys (`slice_index`, else `process_index` values);
    `granule` names the key (`"slice"` or `"process"`).
    """

    plan: MeshPlan
    microbatches: int
    dropped: tuple[Any, ...]
    global_batch: int
    dropped_granules: tuple[int, ...] = ()
    granule: str = "slice"

    @property
    def rows_per_device(self) -> int:
        """Rows each device holds in one micro-batch."""
        return self.global_batch // self.microbatches // self.plan.data_parallel_size


def _positive(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MeshConfigError(f"{field}={value!r}; accepted: a positive int")
    return value


def replan(
    config: MeshConfig,
    devices: Sequence[Any],
    *,
    global_batch: int,
    rows_per_device: int,
    hardware: str | None = None,
    granule: GranuleSpec = "auto",
) -> Replan:
    """Plan `config` on `devices` minus every granule that lost devices (see the module doc).

    Args:
        config: the job's MeshConfig.
        devices: the devices left (a restarted process passes what it sees).
        global_batch: the global batch to keep.
        rows_per_device: the most batch rows a device may hold in one micro-batch (the budget
            the job had, e.g. `global_batch // data_parallel_size` of its first plan).
        hardware: the catalogue string the job started on, which gives a granule's full size.
        granule: passed to the plan.

    Returns:
        A `Replan`: the plan, the micro-batches that keep the batch, the devices left idle.

    Raises:
        MeshConfigError: a config that does not fit the devices left, or a global batch the
            new data-parallel degree does not divide (the message says what would work).
    """
    from ..config import MeshConfig

    if not isinstance(config, MeshConfig):
        raise MeshConfigError(f"config={config!r}; accepted: a MeshConfig")
    _positive(global_batch, "global_batch")
    _positive(rows_per_device, "rows_per_device")
    table = read_devices(devices)
    by_slice = table.slice_index is not None
    kind = "slice" if by_slice else "process"
    keys = table.slice_index if table.slice_index is not None else table.process_index
    values, counts = np.unique(keys, return_counts=True)
    full = _full_size(hardware, kind, table.platform, int(counts.max()))
    if counts.max() > full:
        big = int(values[counts.argmax()])
        raise MeshConfigError(
            f"hardware={hardware!r} has {full} devices a {kind}, but {kind} {big} holds "
            f"{int(counts.max())}; accepted: the hardware string the job started on"
        )
    lost = values[counts < full]
    keep = ~np.isin(keys, lost)
    kept = table.devices[keep].tolist()
    what = _what_was_lost(kind, lost, counts[counts < full], full)
    if not kept:
        raise MeshConfigError(
            f"replan: {what}, and no whole {kind} is left to plan on; accepted: devices "
            f"holding at least one whole {kind} of {full}"
        )
    try:
        plan = config.plan(kept, granule=granule)
    except MeshConfigError as err:
        left = len(values) - len(lost)
        raise MeshConfigError(
            f"replan: {what}; the config does not plan on the {len(kept)} devices left "
            f"({left} {kind}s of {full}): {err}; a shape with -1 on an axis (e.g. the data "
            "axis) adapts to the devices left"
        ) from None
    micro = _microbatches(global_batch, rows_per_device, plan.data_parallel_size, len(kept))
    return Replan(
        plan=plan,
        microbatches=micro,
        dropped=tuple(table.devices[~keep].tolist()),
        global_batch=global_batch,
        dropped_granules=tuple(int(v) for v in lost),
        granule=kind,
    )


def _full_size(hardware: str | None, kind: str, platform: str, largest: int) -> int:
    """Devices in a whole granule: the catalogue's for `hardware`, else the largest seen."""
    if hardware is None:
        return largest
    spec = parse_hardware(hardware)
    if spec.platform != platform:
        raise MeshConfigError(
            f"hardware={hardware!r} is {spec.platform} but the devices are {platform}; "
            "accepted: the hardware string the job started on"
        )
    return spec.devices_per_slice if kind == "slice" else spec.devices_per_host


def _what_was_lost(kind: str, lost: np.ndarray, counts: np.ndarray, full: int) -> str:
    if not len(lost):
        return f"no {kind} lost devices"
    parts = ", ".join(
        f"{kind} {int(v)} has {int(c)} of {full}" for v, c in zip(lost, counts, strict=True)
    )
    return f"dropped {len(lost)} {kind}{'s' * (len(lost) > 1)} that lost devices ({parts})"


def _microbatches(global_batch: int, rows_per_device: int, dp: int, devices: int) -> int:
    """The fewest micro-batches that split `global_batch` evenly over `dp` shards with no
    device above `rows_per_device` rows."""
    if global_batch % dp:
        lower = global_batch // dp * dp
        near = [n for n in (lower, lower + dp) if n > 0]
        degrees = [d for d in range(1, devices + 1) if global_batch % d == 0]
        raise MeshConfigError(
            f"replan: global_batch={global_batch} does not divide by the data-parallel degree "
            f"{dp} of the devices left; accepted: a global batch that is a multiple of {dp} "
            f"(e.g. {' or '.join(map(str, near))}), or a mesh whose data-parallel degree "
            f"divides {global_batch} (on {devices} devices: {', '.join(map(str, degrees))})"
        )
    for micro in range(1, global_batch // dp + 1):
        per_micro, rest = divmod(global_batch, micro)
        if not rest and per_micro % dp == 0 and per_micro // dp <= rows_per_device:
            return micro
    raise AssertionError("unreachable: one row a device always fits")  # pragma: no cover


__all__ = ["Replan", "replan"]
