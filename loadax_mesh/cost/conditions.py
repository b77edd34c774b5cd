"""Estimates that answer on a condition where a fact they need has no source.

A host offload on TPU hides behind its own pass's compute (cost/timing/step.py): the forward pass's
copies out behind the forward, the backward's copies in behind the rest. Where the catalogue
has no host link bandwidth (TPU7x: no source gives it), the step is priced as if the copies hid,
and the estimate says at which bandwidth they do: each way's bytes over the shorter of the two
windows. Where it has no host memory, the offload is taken to fit and the estimate says how
much a host must hold. Copies that do not overlap compute (GPU) cost what the bandwidth makes
them, so there no condition answers for the missing fact: the estimate asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..hardware.profile import DeviceFacts, HardwareProfile
    from .timing.step import StepTime


def host_conditions(
    facts: DeviceFacts, profile: HardwareProfile, host: int, moved: int, t: StepTime
) -> tuple[tuple[str, ...], float]:
    """The conditions an offloading step rests on, and the host link bandwidth (bytes/s a
    device) its offload seconds are priced at: the catalogue's, else the condition's threshold.
    `host`: the bytes a device holds in host memory; `moved`: each way per step."""
    out: list[str] = []
    per = profile.spec.devices_per_chip  # the catalogue gives host facts per chip
    unit = profile.traits.unit
    link = facts.host_link_bandwidth
    if moved and link is None:
        window = min(t.forward, t.compute - t.forward)
        link = moved / window
        out.append(
            f"offload hides behind compute if the host link moves >= {link * per / 1e9:.1f} "
            f"GB/s a {unit} (the catalogue has no host link bandwidth for {facts.hardware}; "
            f"--fact host_link_bandwidth=VALUE sets it); at that bandwidth, {t.seconds:.3f} s"
        )
    if host and facts.host_memory_bytes is None:
        out.append(
            f"the offloaded activations fit if a host holds >= {host * per / 1e9:.2f} GB a "
            f"{unit} (the catalogue has no host memory for {facts.hardware})"
        )
    return tuple(out), link or 0.0
