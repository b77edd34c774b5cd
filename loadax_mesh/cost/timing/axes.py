"""What each mesh axis's collectives cost in a step: their bytes split into an ICI phase
inside granules and a DCN phase across them, and their seconds, exposed where they cannot hide
(which collectives a step runs: traffic.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles
from ..parts.traffic import Collective


@dataclass(frozen=True)
class AxisTraffic:
    """Everything one mesh axis carries in a step, and the time it takes."""

    axis: str
    role: str
    ici: int
    dcn: int
    bytes: int  # per step, summed over collectives (as the compiler counts them)
    across_granules: int  # of which cross granules: as `compile` splits them, a ring's steps
    # between granules, dcn of its n = ici * dcn steps
    seconds: float
    exposed_seconds: float  # the part that cannot hide behind compute
    dcn_seconds: float  # of which across granules (DCN or the scale-out network): exposed
    collectives: tuple[Collective, ...]

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["collectives"] = [asdict(c) for c in self.collectives]
        return data


def axis_traffic(
    found: list[Collective],
    roles: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
) -> dict[str, AxisTraffic]:
    """Per mesh axis: bytes split into ICI and DCN phases and their time. `factors` gives each
    axis's (ici, dcn) sizes, `efficiency` its ICI bandwidth factor (the plan's
    `AxisQuality.link_factor`)."""
    role = {
        roles.expert: "expert",
        roles.fsdp: "fsdp",
        roles.model: "tensor",
        roles.seq: "sequence",
    }
    by_axis: dict[str, list[Collective]] = {axis: [] for axis, _ in roles.sizes}
    for c in found:
        if c.axis in by_axis:
            by_axis[c.axis].append(c)
    out = {}
    for axis, _ in roles.sizes:
        ici, dcn = factors[axis]
        kind = role.get(axis, "data" if axis in roles.batch else "none")
        mine = by_axis[axis]
        out[axis] = axis_total(mine, axis, kind, ici, dcn, efficiency.get(axis, 1.0), facts)
    return out


def axis_total(
    found: list[Collective],
    axis: str,
    role: str,
    ici: int,
    dcn: int,
    efficiency: float,
    facts: DeviceFacts,
) -> AxisTraffic:
    """One axis's collectives of `found` summed: bytes, seconds, what is exposed and what
    crosses granules (`efficiency`: its ICI link factor)."""
    mine = tuple(c for c in found if c.axis == axis)
    total = sum(c.bytes * c.count for c in mine)
    seconds = exposed = across = 0.0
    for c in mine:
        inside, outside = _seconds(c, ici, dcn, efficiency, facts)
        seconds += (inside + outside) * c.count
        exposed += (outside + (0.0 if c.overlaps else inside)) * c.count
        across += outside * c.count
    return AxisTraffic(
        axis=axis,
        role=role,
        ici=ici,
        dcn=dcn,
        bytes=total,
        across_granules=total // ici if dcn > 1 else 0,
        seconds=seconds,
        exposed_seconds=exposed,
        dcn_seconds=across,
        collectives=mine,
    )


def across_seconds(
    found: list[Collective],
    factors: dict[str, tuple[int, int]],
    facts: DeviceFacts,
    *,
    skip: str | None = None,
) -> float:
    """The seconds `found` spends across granules on these factors: the sum of the axes'
    `dcn_seconds` (`skip`: an axis priced otherwise, the pipeline's), which no ring's quality
    inside a granule changes, so the chooser adds it to a recipe's compute floor."""
    total = 0.0
    for c in found:
        ici, dcn = factors.get(c.axis, (1, 1))
        if dcn > 1 and c.axis != skip:
            total += _seconds(c, ici, dcn, 1.0, facts)[1] * c.count
    return total


def _seconds(
    c: Collective, ici: int, dcn: int, efficiency: float, facts: DeviceFacts
) -> tuple[float, float]:
    """Seconds of one run: (an ICI phase over the granule's members, a DCN phase across
    granules). An all-gather's ICI phase gathers 1/dcn of the buffer (a reduce-scatter's
    reduces it last); an all-reduce is a reduce-scatter and an all-gather over both. The DCN
    phase runs between the devices at the same place in each granule, each holding 1/ici of
    the buffer: it moves (dcn - 1) / dcn of that share per device (twice for an all-reduce),
    over the device's own share of its host's network. A collective-permute sends its buffer
    once to one peer, across granules where the axis spans them."""
    factor = 2 if c.kind == "all-reduce" else 1  # an all-to-all: each device's 1/n to each peer
    inside = outside = 0.0
    if c.kind == "collective-permute":
        if dcn > 1:
            return 0.0, c.bytes / facts.need("dcn_bandwidth") + facts.need("dcn_latency")
        bandwidth = facts.need("ici_bandwidth") * max(efficiency, 1e-9)
        return c.bytes / bandwidth + facts.need("ici_latency"), 0.0
    if ici > 1:
        size = c.bytes if c.kind == "all-reduce" else c.bytes // dcn
        bandwidth = facts.need("ici_bandwidth") * 2 * max(efficiency, 1e-9)
        inside = factor * (ici - 1) * (size / ici / bandwidth + facts.need("ici_latency"))
    if dcn > 1:
        outside = (
            factor
            * (dcn - 1)
            * (c.bytes / ici / dcn / facts.need("dcn_bandwidth") + facts.need("dcn_latency"))
        )
    return inside, outside
