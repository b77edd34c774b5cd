"""Stand-in device sets for tests, built the way JAX lists real devices."""

from __future__ import annotations

import itertools

from loadax_mesh.hardware.devices import SimulatedDevice


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


H100 = "NVIDIA H100 80GB HBM3"


class JaxGpu:
    """A GPU as jax 0.11.2 with its CUDA plugin reports one (a real NVIDIA H100 80GB HBM3, seen
    in issue 12): `coords` [0, 0, 0], a `local_hardware_id`, and no `core_on_chip` at all."""

    def __init__(
        self, id: int, *, process_index: int, slice_index: int, local: int, kind: str = H100
    ) -> None:
        self.id = id
        self.platform = "gpu"
        self.device_kind = kind
        self.process_index = process_index
        self.slice_index = slice_index
        self.coords = [0, 0, 0]
        self.local_hardware_id = local

    def __repr__(self) -> str:
        return f"JaxGpu(id={self.id})"


def jax_gpus(
    processes: int, per_process: int, *, kind: str = H100, slice_per_process: bool = False
) -> list[JaxGpu]:
    """`processes` processes of `per_process` GPUs: on one machine (every slice_index 0, as jax
    numbers one host by default), or one machine each (`slice_per_process`)."""
    return [
        JaxGpu(
            p * per_process + g,
            process_index=p,
            slice_index=p if slice_per_process else 0,
            local=g,
            kind=kind,
        )
        for p in range(processes)
        for g in range(per_process)
    ]
