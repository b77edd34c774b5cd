"""Which chip dims of a TPU slice close into rings: the catalogue's wraparound rule per
generation, applied to a slice's chip shape."""

from __future__ import annotations

from .catalogue import tpu_type_of_kind


def wrap_rule(rule: str, chip_shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Per chip dim, whether it closes into a ring: `full_cube` (v4, v5p, 7x) wraps every dim
    once all dims are 4 or more; `dims_of_16` (v5e, v6e) wraps dims of length 16; `none`."""
    if rule == "full_cube":
        cube = all(d >= 4 for d in chip_shape)
        return tuple(cube for _ in chip_shape)
    if rule == "dims_of_16":
        return tuple(d == 16 for d in chip_shape)
    return tuple(False for _ in chip_shape)


def wraparound(device_kind: str, chip_shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Which chip dims of a slice of `chip_shape` close into rings, by the catalogue's rule.

    v4, v5p and 7x: every dim wraps on slices of 4x4x4 and larger, none on smaller ones.
    v5e and v6e: only dims of length 16 wrap. Unknown kinds (and v2/v3, unconfirmed): none.
    """
    t = tpu_type_of_kind(device_kind)
    return wrap_rule(t.wraparound_rule if t else "none", tuple(chip_shape))
