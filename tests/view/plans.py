"""Plans on stand-in devices shared by the render and picture tests."""

from loadax_mesh import plan_mesh
from tests.standins import cpu_processes, gpu_nodes, tpu_slices


def v4_two_slices():
    return plan_mesh(
        (2, -1),
        tpu_slices((4, 4, 1), num_slices=2),
        axis_names=("data", "fsdp"),
        batch_axis_names=("data", "fsdp"),
        hardware="tpu-v4-32-2",
    )


def gpu_hsdp():
    return plan_mesh(
        (-1, 8),
        gpu_nodes(4),
        axis_names=("replicate", "shard"),
        batch_axis_names=("replicate", "shard"),
        hardware="gpu-p5.48xlarge-32",
    )


PLANS = {
    "tpu-2-slices": v4_two_slices,
    "tpu-fsdp-tp": lambda: plan_mesh(
        (-1, 4), tpu_slices((4, 4, 4)), axis_names=("fsdp", "tp"), batch_axis_names="fsdp"
    ),
    "gpu-hsdp": gpu_hsdp,
    "gpu-dp-only": lambda: plan_mesh(
        (4, 8), gpu_nodes(4), axis_names=("data", "model"), batch_axis_names="data"
    ),
    "cpu-shared": lambda: plan_mesh(
        (2, 4), cpu_processes(2, 4), axis_names=("model", "data"), batch_axis_names="data"
    ),
    "cpu-three-axes": lambda: plan_mesh(
        (2, 2, 2), cpu_processes(2, 4), axis_names=("a", "b", "c"), batch_axis_names=("a", "c")
    ),
}
