"""Stand-in device sets for tests, built the way JAX lists real devices."""

from __future__ import annotations

import itertools

from loadax_mesh.devices import SimulatedDevice


def tpu_slices(
    chip_shape: tuple[int, ...],
    *,
    num_slices: int = 1,
    kind: str = "TPU v4",
    cores_per_chip: int = 1,
    chips_per_host: tuple[int, ...] = (2, 2, 1),
) -> list[SimulatedDevice]:
    """TPU devices of `num_slices` slices of `chip_shape` chips, host blocks of 2x2x1 chips."""
    devices = []
    hosts_per_slice = 1
    for dim, block in zip(chip_shape, chips_per_host, strict=True):
        hosts_per_slice *= max(dim // block, 1)
    for s in range(num_slices):
        for z, y, x in itertools.product(*(range(d) for d in reversed(chip_shape))):
            host_coords = [c // b for c, b in zip((x, y, z), chips_per_host, strict=True)]
            host = host_coords[0] + host_coords[1] * max(chip_shape[0] // chips_per_host[0], 1)
            host += (
                host_coords[2]
                * max(chip_shape[0] // chips_per_host[0], 1)
                * max(chip_shape[1] // chips_per_host[1], 1)
            )
            for core in range(cores_per_chip):
                devices.append(
                    SimulatedDevice(
                        id=len(devices),
                        platform="tpu",
                        device_kind=kind,
                        process_index=s * hosts_per_slice + host,
                        slice_index=s,
                        coords=(x, y, z),
                        core_on_chip=core,
                    )
                )
    return devices


def gpu_nodes(
    num_nodes: int,
    gpus_per_node: int = 8,
    *,
    kind: str = "NVIDIA H100 80GB HBM3",
    nodes_per_domain: int = 1,
    with_slice_index: bool = True,
) -> list[SimulatedDevice]:
    """GPU devices, one process per node; slice_index per NVLink domain when asked."""
    return [
        SimulatedDevice(
            id=node * gpus_per_node + g,
            platform="gpu",
            device_kind=kind,
            process_index=node,
            slice_index=node // nodes_per_domain if with_slice_index else None,
            coords=(g,),
            core_on_chip=0,
        )
        for node in range(num_nodes)
        for g in range(gpus_per_node)
    ]


def cpu_processes(num_processes: int, per_process: int) -> list[SimulatedDevice]:
    return [
        SimulatedDevice(id=p * per_process + i, platform="cpu", device_kind="cpu", process_index=p)
        for p in range(num_processes)
        for i in range(per_process)
    ]
