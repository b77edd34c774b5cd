"""attention="plain" against the compiler: the estimate beside the compiled roofline, and the
score-sized bytes the time model counts (cost/parts/plain_attention.py) beside those of the
optimised HLO.

One device of the hardware string (XLA's CUDA client for GPU, libtpu for TPU), a small
LLaMA-shaped model (LLaMA-3 8B's widths cut by 4: 2 layers, d_model 1024, 8 heads of 128 with
2 kv heads, d_ff 3584, vocabulary 8192), 2048-token sequences, batch 4, for each recipe.
Printed per recipe and attention kind: the estimated step and the compiled roofline
(compiler/roofline.py), FLOPs estimated and compiled, memory estimated and compiled (on TPU
libtpu's buffer assignment), and for plain attention the bytes of score-sized arrays (as many
elements as rows x heads x queries x keys of a layer on the device: the scores, weights, their
gradients and the mask as the compiler broadcasts it) that the roofline's operations read and
write, by loop (the layer scan's forward, its backward, the rest of the step), against the
model's count. What the layer scan's stacks copy in and out is the time model's `stacks`
term, not counted here; a stack is no score-sized array.

    python benchmarks/probes/probe_plain_attention.py [--hardware gpu-p5.48xlarge-8]
        [--remat full,dots_attention,none] [--seq 2048] [--dump DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig, topology_devices
from loadax_mesh.compiler.flops import step_flops
from loadax_mesh.compiler.hlo import ARRAY, HloText, shape_bytes
from loadax_mesh.compiler.report import assigned_bytes, held_bytes
from loadax_mesh.compiler.roofline import operation_costs, roofline
from loadax_mesh.cost import estimate
from loadax_mesh.cost.parts.plain_attention import plain_attention
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.hardware.traits import platform_traits
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step


def small_model(seq: int) -> ModelSpec:
    """LLaMA-3 8B's layer shapes cut by 4, 2 layers, a vocabulary of 8192."""
    return replace(
        ModelSpec.from_name("llama3-8b"),
        num_layers=2,
        d_model=1024,
        d_ff=3584,
        vocab_size=8192,
        num_heads=8,
        num_kv_heads=2,
        seq_len=seq,
    )


def score_bytes(text: str, elements: int) -> dict[str, float] | None:
    """Bytes of score-sized arrays (`elements` elements) each computation's operations read
    and write per step (runs counted), by computation; None where the roofline has none."""
    costs = operation_costs(text)
    if costs is None:
        return None
    hlo = HloText(text)
    by_name = {c: {i.name: i for i in body} for c, body in hlo.computations.items()}

    def sized(shape: str) -> int:
        return sum(
            shape_bytes(f"{t}[{dims}]")
            for t, dims in ARRAY.findall(shape)
            if math.prod(int(d) for d in dims.split(",") if d) == elements
        )

    out: dict[str, float] = {}
    for c in costs:
        i = by_name[c.computation][c.name]
        names = [o.strip().split(" ")[-1].lstrip("%") for o in i.operands.split(",") if o.strip()]
        moved = sized(c.shape) + sum(sized(hlo.by_name[n].shape) for n in names if n in hlo.by_name)
        if moved:
            out[c.computation] = out.get(c.computation, 0.0) + c.times * moved
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="gpu-p5.48xlarge-8")
    parser.add_argument("--remat", default="full,dots_attention,none")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dump", type=Path, help="keep each optimised module's text here")
    args = parser.parse_args()
    hw = args.hardware
    devices = topology_devices(hw)[:1]
    config = MeshConfig(mesh_shape=(1,), mesh_axis_names=("fsdp",), batch_axis_names=("fsdp",))
    plan = config.plan(devices, selector=hw)
    model = small_model(args.seq)
    facts = hardware_profile(hw).facts_for(1)
    assert facts.hbm_bandwidth is not None, f"{hw}: no HBM bandwidth in the catalogue"
    traits = platform_traits(devices[0].platform)
    print(f"{hw}, one device: {model.num_layers} layers, d_model {model.d_model}, seq {args.seq}")
    for remat in args.remat.split(","):
        for kind in ("flash", "plain"):
            train = TrainSpec(global_batch=args.batch, remat=remat, attention=kind)
            est = estimate(plan, model, train)
            step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
            lowered = step.fn.lower(*step.abstract_args())
            with tempfile.TemporaryDirectory() as tmp:
                compiled = lowered.compile(compiler_options=traits.compile_options(tmp))
                assigned = assigned_bytes(Path(tmp)) if traits.compiler_judges_fit else None
            text = compiled.as_text()
            if args.dump:
                (args.dump / f"{hw}_{remat}_{kind}.txt").write_text(text)
            memory = assigned or held_bytes(compiled.memory_analysis())
            roof = roofline(text, peak_flops=facts.peak_flops, hbm_bandwidth=facts.hbm_bandwidth)
            flops = step_flops(compiled, HloText(text))
            line = (
                f"{remat:15s} {kind:5s} step {est.step_seconds * 1e3:7.2f} ms est, roofline "
                f"{roof.seconds * 1e3 if roof else float('nan'):7.2f} ms"
                f" ({roof.seconds / est.step_seconds if roof else float('nan'):.2f} of est);"
                f" FLOPs {est.flops / 1e12:.4f} / {(flops or 0) / 1e12:.4f} T;"
                f" memory {est.memory_bytes / 1e9:.3f} / {memory / 1e9:.3f} GB"
                f" ({est.memory_bytes / memory:.2f})"
            )
            print(line, flush=True)
            if kind != "plain":
                continue
            elements = args.batch * model.num_heads * args.seq * args.seq
            counted = plain_attention(model, train)
            per_layer = [p.score_bytes * elements for p in counted.passes]
            model_bytes = model.num_layers * sum(per_layer)
            found = score_bytes(text, elements) or {}
            hlo_bytes = sum(found.values())
            parts = ", ".join(f"{c[:24]} {b / 1e9:.3f}" for c, b in found.items())
            print(
                f"    score-sized bytes: counted {model_bytes / 1e9:.3f} GB (a layer: forward "
                f"{per_layer[0] / 1e9:.3f}, again {per_layer[1] / 1e9:.3f}, backward "
                f"{per_layer[2] / 1e9:.3f}); HLO {hlo_bytes / 1e9:.3f} GB ({parts}); "
                f"counted / HLO {model_bytes / hlo_bytes:.2f}; per element and layer: "
                f"{model_bytes / elements / model.num_layers:.1f} counted, "
                f"{hlo_bytes / elements / model.num_layers:.1f} HLO"
            )


if __name__ == "__main__":
    main()
