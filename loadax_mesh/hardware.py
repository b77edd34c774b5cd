"""Hardware strings (interim: wraparound only; the catalogue issue fills this module)."""

from __future__ import annotations


def wraparound(device_kind: str, chip_shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Which chip dims of a slice close into rings (interim: none)."""
    return tuple(False for _ in chip_shape)
