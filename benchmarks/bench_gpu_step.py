"""A real training step on this machine's GPU, beside the cost model and the compiler.

For each recipe the reference step (LLaMA-3 8B cut to `--layers` layers, full width, seq 8192;
`--model`, `--seq` and `--experts` choose another; `--moe` a MoE model's path: dropless, whose
grouped matmuls run tokamax's kernel on GPU, or capacity) is compiled for the local GPU and
run: measured step time (the median of `--steps` after two warm-ups), the allocator's peak
(`memory_stats()['peak_bytes_in_use']`), the compiled program's memory (`memory_analysis()`,
device and host) and the loss of the first and last step. Beside them the estimate for one
device of the catalogue's entry for this GPU kind (the same facts it uses for a whole host of
them; one device has no collectives). Each recipe runs in its own process, so each peak is its
own. The time model's calibration was fitted on A3 (H100) runs alone: on any other GPU this
is a run it never saw.

    python benchmarks/bench_gpu_step.py [--model llama3-8b] [--layers 8] [--batch 4]
        [--seq S] [--moe dropless|capacity] [--steps 10] [--only R] [--no-host-link]
        [--hardware gpu-p5e.48xlarge-8] [--json FILE]

Needs a GPU (jax with CUDA); prints "no GPU" and exits 2 without one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

# name -> (remat as the command line writes it, micro-batches, logits chunks)
MINIMAL_FLASH = ",".join(
    f"{t}=device"
    for t in ("query", "key", "value", "attention_out", "out_proj", "mlp_in", "mlp_out")
)
MAXTEXT_8B = "layer_input=offload,query=offload,key=offload,value=offload,out_proj=offload"
RECIPES: dict[str, tuple[str, int, int]] = {
    "full": ("full", 1, 1),
    "offload": ("offload", 1, 1),
    "maxtext-offload": (MAXTEXT_8B, 1, 1),
    "full x2": ("full", 2, 1),
    "full /4": ("full", 1, 4),
    "dots": ("dots", 1, 1),
    "none": ("none", 1, 1),
    # MaxText's A3 LLaMA-2 7B runs' remat (minimal_flash: every projection's output kept)
    "minimal-flash": (MINIMAL_FLASH, 1, 1),
}


def catalogue_hardware(kind: str) -> str | None:
    """A catalogue string whose GPUs are of `kind` (one host of them), or None."""
    from loadax_mesh.hardware.catalogue import catalogue

    for t in catalogue().types:
        if t.platform == "gpu" and kind in t.device_kinds:
            return f"gpu-{t.key}-{t.devices_per_host}"
    return None


def one(
    name: str,
    model_name: str,
    layers: int,
    batch: int,
    steps: int,
    hardware: str | None,
    *,
    seq: int | None = None,
    moe: str = "dropless",
    experts: int | None = None,
) -> dict[str, Any]:
    """Compile, run and estimate one recipe in this process."""
    import jax
    import numpy as np

    from loadax_mesh import MeshConfig
    from loadax_mesh.compiler.report import held_bytes, host_held_bytes
    from loadax_mesh.cost import estimate
    from loadax_mesh.workload import ModelSpec, TrainSpec
    from loadax_mesh.workload.spec import parse_remat
    from loadax_mesh.workload.step import make_step

    device = jax.devices()[0]
    hardware = hardware or catalogue_hardware(device.device_kind)
    remat, micro, chunks = RECIPES[name]
    model = ModelSpec.from_name(model_name)
    model = replace(model, name=f"{model_name}-{layers}l", num_layers=layers)
    if model.first_dense_layers >= layers:  # DeepSeek cut short keeps one MoE layer
        model = replace(model, first_dense_layers=layers - 1)
    model = replace(model, seq_len=seq or model.seq_len)
    if experts:  # fewer experts of the same shape: a layer of a big MoE on one GPU
        model = replace(model, name=f"{model.name}-{experts}e", num_experts=experts)
    train = TrainSpec(
        global_batch=batch,
        remat=parse_remat(remat),
        microbatches=micro,
        logits_chunks=chunks,
        moe=moe,
    )
    plan = MeshConfig.from_preset("fsdp").plan(jax.devices()[:1])
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    start = time.perf_counter()
    compiled = step.fn.lower(*step.abstract_args()).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    params, opt = step.init(jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (batch, model.seq_len), 0, model.vocab_size)
    tokens = jax.device_put(tokens, step.batch_sharding)
    data = {"tokens": tokens, "targets": jax.numpy.roll(tokens, -1, axis=1)}
    losses, seconds = [], []
    for i in range(steps + 2):
        start = time.perf_counter()
        params, opt, loss = compiled(params, opt, data)
        losses.append(float(loss.block_until_ready()))
        if i >= 2:
            seconds.append(time.perf_counter() - start)
    stats = device.memory_stats() or {}

    # the same one-device mesh, named as the catalogue's hardware so the estimate has its facts
    est = None
    if hardware is not None:
        named = MeshConfig.from_preset("fsdp").plan(jax.devices()[:1], selector=hardware)
        est = estimate(named, model, train)
    return {
        "recipe": name,
        "model": model.name,
        "seq": model.seq_len,
        "batch": batch,
        "moe": moe if model.num_experts else None,
        "device_kind": device.device_kind,
        "hardware": hardware,
        "measured_s": statistics.median(seconds),
        "all_s": seconds,
        "peak_in_use": stats.get("peak_bytes_in_use"),
        "bytes_limit": stats.get("bytes_limit"),
        "compile_s": compile_s,
        "compiled_bytes": held_bytes(memory),
        "compiled_host_bytes": host_held_bytes(memory),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "finite": bool(np.isfinite(losses).all()),
        "estimate_s": None if est is None else est.step_seconds,
        "estimate_compute_s": None if est is None else est.compute_seconds,
        "estimate_offload_s": None if est is None else est.offload_exposed_seconds,
        "estimate_bytes": None if est is None else est.memory_bytes,
        "estimate_host_bytes": None if est is None else est.host_bytes,
    }


def host_link(gib: int = 4, reps: int = 5) -> tuple[float, float]:
    """Measured bytes/s from the device to pinned host memory and back (the median of `reps`
    copies of a `gib` GiB array), the link the offload recipes move activations over."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    device = jax.devices()[0]
    on_device = SingleDeviceSharding(device)
    on_host = SingleDeviceSharding(device, memory_kind="pinned_host")
    x = jnp.ones((gib * 2**28,), jnp.float32, device=device).block_until_ready()
    out, back = [], []
    for _ in range(reps):
        start = time.perf_counter()
        h = jax.device_put(x, on_host).block_until_ready()
        out.append(time.perf_counter() - start)
        start = time.perf_counter()
        jax.device_put(h, on_device).block_until_ready()
        back.append(time.perf_counter() - start)
    return x.nbytes / statistics.median(out), x.nbytes / statistics.median(back)


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "" if not a or not b else f" ({a / b:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    ap.add_argument("--moe", default="dropless", choices=("dropless", "capacity"))
    ap.add_argument("--experts", type=int, help="cut a MoE model to this many experts")
    ap.add_argument("--no-host-link", action="store_true", help="skip the host link's measure")
    ap.add_argument("--only", action="append", help="a recipe name (repeatable)")
    ap.add_argument("--hardware", help="catalogue string whose device facts the estimate uses")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: run one recipe, print JSON
    a = ap.parse_args()
    if a.one == "host-link":
        print(json.dumps(host_link()))
        return
    if a.one:
        row = one(
            a.one, a.model, a.layers, a.batch, a.steps, a.hardware,
            seq=a.seq, moe=a.moe, experts=a.experts,
        )  # fmt: skip
        print(json.dumps(row))
        return
    import jax

    if jax.default_backend() != "gpu":
        print(f"no GPU (jax's backend is {jax.default_backend()!r})")
        sys.exit(2)
    print(f"devices: {jax.devices()}; kind {jax.devices()[0].device_kind!r}", flush=True)
    # Every measurement in a child of its own: this process must not take the GPU's memory.
    if not a.no_host_link:
        argv = [sys.executable, __file__, "--one", "host-link"]
        link = subprocess.run(argv, capture_output=True)
        out, back = json.loads(link.stdout.decode().strip().splitlines()[-1])
        print(f"host link: {out / 1e9:.1f} GB/s to pinned host memory, {back / 1e9:.1f} back")
    rows = []
    for name in a.only or RECIPES:
        argv = [sys.executable, __file__, "--one", name, "--model", a.model]
        argv += ["--layers", str(a.layers)]
        argv += ["--batch", str(a.batch), "--steps", str(a.steps), "--moe", a.moe]
        argv += ["--seq", str(a.seq)] if a.seq else []
        argv += ["--experts", str(a.experts)] if a.experts else []
        argv += ["--hardware", a.hardware] if a.hardware else []
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        if a.json:  # after every row: a run cut short keeps what it measured
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(
            f"{row['model']} {row['moe'] or ''} {name}: step {row['measured_s']:.3f} s measured, "
            f"estimate "
            f"{row['estimate_s'] or 0:.3f}{_ratio(row['estimate_s'], row['measured_s'])}; "
            f"memory GB estimate {_gb(row['estimate_bytes'])} / compiled "
            f"{_gb(row['compiled_bytes'])}{_ratio(row['estimate_bytes'], row['compiled_bytes'])}"
            f" / peak in use {_gb(row['peak_in_use'])}; host GB {_gb(row['estimate_host_bytes'])}"
            f" / {_gb(row['compiled_host_bytes'])}; loss {row['loss_first']:.3f} -> "
            f"{row['loss_last']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
