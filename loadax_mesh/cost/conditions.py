"""Estimates that answer on a condition where a fact they need has no source.

A host offload on TPU hides behind its own pass's compute (cost/timing/step.py): the forward pass's
copies out behind the forward, the backward's copies in behind the rest. Where the catalogue
has no host link bandwidth (TPU7x: no source gives it), the step is priced as if the copies hid,
and the estimate says at which bandwidth they do: each way's bytes over the shorter of the two
windows. Where it has no host memory, the offload is taken to fit and the estimate says how
much a host must hold. Copies that do not overlap compute (GPU) cost what the bandwidth makes
them, so there no condition answers for the missing fact: the estimate asks for it.

A quantized step (`TrainSpec.quantization`) on a platform whose `quantized_share` no run of
that platform and precision fitted (configs/calibration.toml: `carried_from`) is priced at the
carried value, and the estimate says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .calibration import quantized_entry

if TYPE_CHECKING:
    from ..hardware.profile import DeviceFacts, HardwareProfile
    from ..workload.spec import TrainSpec
    from .timing.step import StepTime


def quantized_conditions(facts: DeviceFacts, train: TrainSpec) -> tuple[str, ...]:
    """The condition a quantized estimate rests on where its platform's `quantized_share` was
    carried over from another platform's or precision's fit (none where the catalogue has the
    chip's measured share, or the share was fitted on runs of its own)."""
    q = train.quantization
    if q == "none" or facts.quantized_share(q) is not None:
        return ()
    entry = quantized_entry(facts.platform, q)
    if "carried_from" not in entry:
        return ()
    return (
        f"{q} matmuls on {facts.platform} priced at quantized_share {entry['value']} (of the "
        f"share its bf16 matmuls reach), carried from the {entry['carried_from']} fit: no "
        f"{facts.platform} {q} run fitted it (configs/calibration.toml; --fact "
        f"{q}_matmul_share=VALUE sets the chip's measured share of peak_{q})",
    )


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


def missing_host_facts(facts: DeviceFacts) -> list[str]:
    """The catalogue facts an offloading recipe needs that `facts` lacks and no condition
    answers for (cost/conditions.py: copies that wait on the host link cost what it makes
    them); none: offloads are searched."""
    if facts.host_link_bandwidth is None and not facts.traits.offload_overlaps_compute:
        return ["host link bandwidth"]
    return []


def assumed_host_facts(facts: DeviceFacts) -> list[str]:
    """The host facts an offloading recipe's estimate rests on a condition for."""
    host = {
        "host memory": facts.host_memory_bytes,
        "host link bandwidth": facts.host_link_bandwidth,
    }
    return [name for name, value in host.items() if value is None]
