"""Against the experts: AXLearn's hand-written fuji mesh rules beside `choose_mesh`'s choice.

The rows are the mesh rules of AXLearn's fuji trainer configs (apple/axlearn at 01ebc3ff,
axlearn/experiments/text/gpt/fuji.py) for models we ship: fuji-7B-v2 ~ llama2-7b (4M tokens a
batch: 1024 x 4096), fuji-8B-v3 = llama3-8b (512 x 8192), fuji-70B-v3 = llama3-70b (a batch of
one sequence per 4 devices, which AXLearn also shards along the sequence; here one sequence per
device, since the reference step divides the batch over data x fsdp). That revision has no v6e,
7x or 405B rows. AXLearn's axes map to
ours as data -> data, fsdp -> fsdp (seq and model 1). AXLearn's mesh is estimated with full remat
(AXLearn offloads or saves dots on some rows, with gradient accumulation on v5e-256); ours is
the mesh and recipe `choose_mesh` ranks first (remat, micro-batches, logits chunks searched),
printed beside it. A report, not a target: where we differ, the reason is printed.

    python benchmarks/bench_experts.py
"""

from __future__ import annotations

import time

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost import Estimate, estimate
from loadax_mesh.workload import ModelSpec, TrainSpec

# (model, global batch or None for one sequence per device, hardware, AXLearn's fsdp)
RULES = [
    ("llama2-7b", 1024, "tpu-v4-1024", 16),
    ("llama2-7b", 1024, "tpu-v5litepod-256", 256),
    ("llama2-7b", 1024, "tpu-v5litepod-256-2", 256),
    ("llama2-7b", 1024, "tpu-v5litepod-256-4", 256),
    ("llama2-7b", 1024, "tpu-v5p-512", 8),
    ("llama2-7b", 1024, "gpu-p5.48xlarge-256", 8),
    ("llama2-7b", 1024, "gpu-a3-highgpu-8g-512", 8),
    ("llama3-8b", 512, "tpu-v4-1024", 16),
    ("llama3-8b", 512, "tpu-v5litepod-256", 256),
    ("llama3-8b", 512, "tpu-v5litepod-256-2", 256),
    ("llama3-8b", 512, "tpu-v5p-1024", 8),
    ("llama3-8b", 512, "gpu-p5.48xlarge-256", 8),
    ("llama3-70b", None, "tpu-v5litepod-256-4", 256),
    ("llama3-70b", None, "gpu-p5.48xlarge-512", 128),
    ("llama3-70b", None, "gpu-p4de.24xlarge-1024", 128),
]
AXES = ("data", "fsdp", "seq", "model")


def main() -> None:
    start = time.perf_counter()
    same = better = worse = 0
    for name, batch, hardware, fsdp in RULES:
        model = ModelSpec.from_name(name)
        devices = simulate_devices(hardware)
        train = TrainSpec(global_batch=batch or len(devices))
        expert = MeshConfig((-1, fsdp, 1, 1), AXES, ("data", "fsdp")).plan(devices)
        theirs = estimate(expert, model, train)
        label = f"{name} batch {train.global_batch} on {hardware}: AXLearn fsdp={fsdp}"
        try:
            ours = choose_mesh(hardware, model, train, top=1)[0]
        except MeshConfigError as err:
            print(f"{label} -> ours: none fits ({err})")
            continue
        mine = ours.estimate
        shape = "x".join(f"{a}{s}" for a, s in mine.mesh.items() if s > 1)
        split = f"ici {ours.ici} dcn {ours.dcn}"
        recipe = (
            f"remat {mine.remat}, microbatches {mine.microbatches}, "
            f"logits chunks {mine.logits_chunks}"
        )
        print(f"{label} -> ours {shape} ({split}; {recipe})")
        for who, e in (("  AXLearn", theirs), ("  ours   ", mine)):
            print(
                f"{who} {e.memory_bytes / 1e9:6.1f} GB of {e.hbm_bytes / 1e9:.1f}"
                + (f" (+{e.host_bytes / 1e9:.1f} GB host)" if e.host_bytes else "")
                + ""
                f"{'' if e.fits else ' (does NOT fit)'}, step {e.step_seconds:7.3f} s, "
                f"MFU {e.mfu:.2f}, {e.bottleneck}"
            )
        if mine.mesh == theirs.mesh:
            same += 1
        elif mine.step_seconds < theirs.step_seconds * 0.999 or not theirs.fits:
            better += 1
            print(f"  differs: ours is estimated {_why(theirs, mine)}")
        else:
            worse += 1
            print(f"  differs: equal step time; {_why(theirs, mine)}")
    print(
        f"\n{len(RULES)} rules: {same} the same mesh, {better} ours estimated faster or fitting "
        f"where theirs does not, {worse} other differences; {time.perf_counter() - start:.1f} s"
    )


def _why(theirs: Estimate, mine: Estimate) -> str:
    if not theirs.fits:
        return "fitting where AXLearn's needs more than HBM"
    gain = 1 - mine.step_seconds / theirs.step_seconds
    if gain > 0.001:
        return f"{gain:.1%} faster ({theirs.bottleneck} -> {mine.bottleneck})"
    comm = (sum(a.seconds for a in e.axes.values()) for e in (theirs, mine))
    return "collectives {:.3f} s -> {:.3f} s a step (all hidden behind compute); {} -> {}".format(
        *comm, f"{theirs.memory_bytes / 1e9:.1f} GB", f"{mine.memory_bytes / 1e9:.1f} GB"
    )


if __name__ == "__main__":
    main()
