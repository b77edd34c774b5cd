"""What a catalogue file may hold: its tables, each entry's facts, their units and values.

The shipped configs/hardware.toml and a user's catalogue are checked by the same rules; every
refusal names the file, the entry, the field, the value and what is accepted.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import MeshConfigError

_BYTES, _RATE = ("GB", "GiB"), ("GB/s", "Gbps")
# fact name -> accepted units (a positive number with one of them)
_MEASURES: dict[str, tuple[str, ...]] = {
    "hbm": _BYTES,
    "hbm_usable": _BYTES,
    "host_memory": _BYTES,
    "hbm_bandwidth": _RATE,
    "host_link_bandwidth": _RATE,
    "nvlink_bandwidth": _RATE,
    "network_per_host": _RATE,
    "network_per_gpu": _RATE,
    "ici_bandwidth": _RATE,
    "ici_link_bandwidth": _RATE,
    "dcn_bandwidth": _RATE,
    "peak_bf16": ("TFLOPs",),
    "peak_fp8": ("TFLOPs",),
    "peak_int8": ("TFLOPs",),
    "nvlink_latency": ("us",),
    "network_latency": ("us",),
    "ici_latency": ("us",),
    "dcn_latency": ("us",),
    "nvlink_domain": ("GPUs",),
}
_COUNTS: tuple[str, ...] = ("gpus_per_host", "cores_per_chip", "devices_per_chip")
_COUNTS += ("chips_per_host", "dims", "pod_chips", "hbm_usable_cores")
_SHARES: tuple[str, ...] = ("matmul_share", "attention_share", "memory_share")
_SHARES += ("grouped_matmul_share", "fp8_matmul_share", "int8_matmul_share")
_TEXTS = ("device_kind", "gpu", "count_unit", "libtpu_name", "wraparound")
_LISTS = {"host_block": int, "memory_tile": int, "mxu": int, "device_kind_aliases": str}

_SHARED: tuple[str, ...] = ("device_kind", "hbm", "host_memory", "host_link_bandwidth")
_SHARED += ("hbm_bandwidth",)
_SHARED += ("peak_bf16", "peak_fp8", "peak_int8", *_SHARES)
FACTS = {  # platform -> the facts an entry may hold
    "tpu": (
        *_SHARED,
        "count_unit",
        "cores_per_chip",
        "devices_per_chip",
        "libtpu_name",
        "device_kind_aliases",
        "chips_per_host",
        "host_block",
        "dims",
        "wraparound",
        "multislice",
        "pod_chips",
        "hbm_usable",
        "hbm_usable_cores",
        "memory_tile",
        "mxu",
        "ici_link_bandwidth",
        "ici_bandwidth",
        "dcn_bandwidth",
        "ici_latency",
        "dcn_latency",
    ),
    "gpu": (
        *_SHARED,
        "gpu",
        "gpus_per_host",
        "nvlink_domain",
        "nvlink_bandwidth",
        "network_per_host",
        "network_per_gpu",
        "nvlink_latency",
        "network_latency",
    ),
    "cpu": ("device_kind",),
    "gpu_client": ("mem_fraction",),
}
REQUIRED = {
    "tpu": (
        *("count_unit", "cores_per_chip", "devices_per_chip", "device_kind", "chips_per_host"),
        *("host_block", "dims", "wraparound"),
    ),
    "gpu": ("gpus_per_host", "nvlink_domain", "device_kind"),
    "cpu": ("device_kind",),
    "gpu_client": ("mem_fraction",),
}
ENTRY_KEYS = {"tpu": ("title", "topologies"), "gpu": ("title", "cloud"), "cpu": ("title",)}
ENTRY_KEYS["gpu_client"] = ()
FACT_KEYS = ("value", "source", "unit", "status", "note")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_entry(entry: Any, *, platform: str, where: str) -> None:
    """An entry table's keys: its fields and the facts its platform may hold, the required
    ones present."""
    if not isinstance(entry, dict):
        raise MeshConfigError(f"{where}={entry!r}; accepted: a table of facts")
    accepted = (*ENTRY_KEYS[platform], *FACTS[platform])
    for key in entry:
        if key not in accepted:
            raise MeshConfigError(
                f"{where}: unknown field {key!r}; accepted for a {platform} entry: "
                f"{', '.join(accepted)}"
            )
    for key in (*REQUIRED[platform], *ENTRY_KEYS[platform][:1]):
        if key not in entry:
            raise MeshConfigError(f"{where}: field {key!r} is missing; it is required")
    for key in ("title", "cloud"):
        if key in entry and not isinstance(entry[key], str):
            raise MeshConfigError(f"{where}.{key}={entry[key]!r}; accepted: a string")


def check_value(name: str, value: Any, unit: str, *, where: str) -> None:
    """A fact's value and unit for its name: measures positive with an accepted unit, counts
    positive integers, shares in (0, 1], texts strings, lists of their item type."""
    if name in _MEASURES:
        units = _MEASURES[name]
        if unit not in units:
            raise MeshConfigError(f"{where}: unit={unit!r}; accepted: {', '.join(units)}")
        if value is not None and (not _number(value) or value <= 0):
            raise MeshConfigError(f"{where}: value={value!r}; accepted: a positive number")
        return
    if unit:
        raise MeshConfigError(f"{where}: unit={unit!r}; accepted: none for {name}")
    if value is None:
        return
    if name in _COUNTS and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise MeshConfigError(f"{where}: value={value!r}; accepted: a positive integer")
    if name in (*_SHARES, "mem_fraction") and (not _number(value) or not 0 < value <= 1):
        raise MeshConfigError(f"{where}: value={value!r}; accepted: a number in (0, 1]")
    if name in _TEXTS and (not isinstance(value, str) or not value):
        raise MeshConfigError(f"{where}: value={value!r}; accepted: a non-empty string")
    if name == "multislice" and not isinstance(value, bool):
        raise MeshConfigError(f"{where}: value={value!r}; accepted: true or false")
    if name in _LISTS:
        kind = _LISTS[name]
        if not isinstance(value, list) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in value
        ):
            raise MeshConfigError(
                f"{where}: value={value!r}; accepted: a list of {kind.__name__} values"
            )
