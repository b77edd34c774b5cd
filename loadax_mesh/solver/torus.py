"""ICI rings on a TPU torus (interim: positions in row-major order; the ring solver replaces it)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import MeshConfigError


def order_torus(chip_shape: tuple[int, ...], ici_mesh_shape: tuple[int, ...], *,
                wrap: tuple[bool, ...], cores_per_chip: int = 1) -> np.ndarray:
    """An int array of shape `ici_mesh_shape` holding granule positions, where a position is
    `np.ravel_multi_index((*chip_coords, core), (*chip_shape, cores_per_chip))`."""
    size = math.prod(chip_shape) * cores_per_chip
    if math.prod(ici_mesh_shape) != size:
        raise MeshConfigError(
            f"ici_mesh_shape={ici_mesh_shape} needs {math.prod(ici_mesh_shape)} devices but the "
            f"torus {chip_shape} x {cores_per_chip} cores holds {size}"
        )
    return np.arange(size).reshape(ici_mesh_shape)
