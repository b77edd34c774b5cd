"""Which operations carry a compiled step's FLOPs, and what its collectives move.

Two commands. `ours` compiles the reference step (`compile_step`) and writes its optimised HLO
text; `list` reads such a text (ours, or MaxText's `*jit_train_step*after_optimizations.txt`
from `--xla_dump_to`) and prints per device: XLA's cost-analysis FLOPs with every loop trip
counted (`step_flops`, what `CompileReport.flops` reports; kernels add nothing there), the
roofline's FLOPs (the splash kernels counted from their shapes; megablox's grouped matmuls are
not counted), the operations by FLOPs (a fusion labelled by the matmuls it fuses, with the jax
op that made it), the bytes an offload copies to host memory and back, and the operand bytes
of each kind of collective.

    python benchmarks/probes/probe_flops.py ours tpu-v5p-1024 fsdp "llama3-405b:num_layers=2" \\
        1024 --remat attention_out=offload,mlp_out=offload --logits-chunks 4 --out ours.hlo.txt
    python benchmarks/probes/probe_flops.py list ours.hlo.txt [--top 30]
"""

from __future__ import annotations

import argparse
import os
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from loadax_mesh.compiler import report as report_module
from loadax_mesh.compiler.flops import step_flops
from loadax_mesh.compiler.hlo import HloText, Instruction, shape_bytes
from loadax_mesh.compiler.roofline import (
    _FREE,
    _blocks,
    _collective,
    _kernel,
    _normalised,
    _scheduled,
    _wrapped,
)

_OP_NAME = re.compile(r'^\s+(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{[^}]*op_name="([^"]*)"')
_MATMUL = re.compile(r"= (\S+) (dot|convolution)\((.*?)\)(.*?)(?:, metadata|$)")


def ours(args: argparse.Namespace) -> None:
    """Compile the reference step and write its optimised HLO text."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from loadax_mesh import MeshConfig, compile_step, topology_devices
    from loadax_mesh.workload import ModelSpec, TrainSpec
    from loadax_mesh.workload.spec import parse_remat

    name, _, overrides = args.model.partition(":")
    fields = {k: int(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
    model = replace(ModelSpec.from_name(name), **fields)
    train = TrainSpec(
        global_batch=args.batch,
        remat=parse_remat(args.remat),
        logits_chunks=args.logits_chunks,
        microbatches=args.microbatches,
    )
    plan = MeshConfig.from_preset(args.preset).plan(
        topology_devices(args.hardware), selector=args.hardware
    )
    texts: list[str] = []
    real = report_module.HloText

    def keep(text: str) -> HloText:
        texts.append(text)
        return real(text)

    report_module.HloText = keep  # type: ignore[misc]
    report = compile_step(plan, model, train)
    Path(args.out).write_text(texts[0])
    print(
        f"total {report.total_bytes / 1e9:.2f} GB, host {(report.host_bytes or 0) / 1e9:.2f} GB,"
        f" flops {report.flops:.4g}, roofline {report.roofline_seconds} s, "
        f"compile {report.compile_seconds:.0f} s -> {args.out}"
    )


def _label(i: Instruction, hlo: HloText) -> str:
    """An operation's kind: a fusion by the matmuls it fuses (with their operand types)."""
    if i.opcode != "fusion":
        return i.opcode
    kinds = [j.opcode for _, c in i.called() for j in hlo.computations.get(c, [])]
    found = [k for k in ("convolution", "dot") if k in kinds]
    return f"fusion[{','.join(found)}]" if found else "fusion"


def _matmuls(i: Instruction, hlo: HloText, text_of: dict[str, str]) -> list[str]:
    """The dot/convolution lines an operation runs (itself, or inside its fusion)."""
    names = [i.name] if i.opcode in ("dot", "convolution") else []
    for _, c in i.called():
        names += [j.name for j in hlo.computations.get(c, []) if j.opcode in ("dot", "convolution")]
    out = []
    for n in names:
        line = text_of.get(n, "")
        m = _MATMUL.search(line)
        out.append(f"{m[1]} {m[2]}({m[3]}){m[4][:120]}" if m else line[:200])
    return out


_PLUMBING = ("while", "body", "closed_call", "checkpoint", "dot_general", "shard_map", "cond")


def _where(op_name: str) -> tuple[str, str]:
    """(phase, source) of an op: the forward, its recomputation in the backward pass, or the
    backward's own products; the jax source (einsum or module path) without the plumbing."""
    phase = (
        "recompute"
        if "rematted_computation" in op_name
        else "backward"
        if "transpose(" in op_name
        else "forward"
    )
    parts = [
        p
        for p in op_name.split("/")
        if p
        and p not in _PLUMBING
        and not p.startswith(("jit(", "jvp(", "transpose(", "vmap(", "remat", "checkpoint"))
    ]
    return phase, "/".join(parts[-3:])


_HOST_ARRAY = re.compile(r"\w+\[[\d,]*\]\{[^}]*\}")


def host_transfers(hlo: HloText) -> tuple[float, float]:
    """Bytes copied to host memory and back per step: copies whose destination or source is in
    host memory space S(5) (an unrolled offload), and asynchronous dynamic-update-slices into /
    dynamic-slices out of a host buffer (a scan's stacked offload), loop trips counted."""
    out = back = 0.0
    for name, times in _scheduled(hlo).items():
        for i in hlo.computations[name]:
            arrays = _HOST_ARRAY.findall(i.shape)
            if "S(5)" not in i.shape or len(arrays) < 2:
                continue
            # a scan's host slices may print as async-start, named for the op they wrap
            op = i.name.rsplit(".", 1)[0] if i.opcode == "async-start" else i.opcode
            if op == "copy-start":  # (destination, source, context)
                if "S(5)" in arrays[0]:
                    out += times * shape_bytes(arrays[0])
                else:
                    back += times * shape_bytes(arrays[0])
            elif op == "dynamic-update-slice-start":  # ((buffer, update, ...), ...)
                out += times * shape_bytes(arrays[1])
            elif op == "dynamic-slice-start":  # ((buffer, indices), slice, context)
                back += times * max(shape_bytes(a) for a in arrays if "S(5)" not in a)
    return out, back


def listing(args: argparse.Namespace) -> None:
    """FLOPs by operation and collective bytes of an optimised HLO text."""
    import jax
    from jax._src.lib import _jax
    from jaxlib._hlo import hlo_module_from_text

    raw = Path(args.hlo).read_text()
    op_names = {m[1]: m[2] for line in raw.splitlines() if (m := _OP_NAME.match(line))}
    text_of = {
        m[1]: line.strip()
        for line in raw.splitlines()
        if (m := re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", line))
    }
    clean = _normalised(raw)
    hlo = HloText(clean)
    blocks = _blocks(clean)
    client = jax.devices("cpu")[0].client
    cost = step_flops(None, HloText(raw))
    rows: list[tuple[float, int, Instruction, str]] = []
    by_kind: dict[str, float] = defaultdict(float)
    by_source: dict[tuple[str, str], float] = defaultdict(float)
    moved: dict[str, float] = defaultdict(float)
    kernels = 0.0
    for name, times in _scheduled(hlo).items():
        for i in hlo.computations[name]:
            if _collective(i.opcode):
                if not i.opcode.endswith("-done"):
                    ops = [o.strip().split(" ")[-1].lstrip("%") for o in i.operands.split(",")]
                    size = sum(shape_bytes(hlo.by_name[o].shape) for o in ops if o in hlo.by_name)
                    moved[i.opcode.removesuffix("-start")] += times * size
                continue
            if i.opcode in _FREE or i.opcode.startswith("custom-call-"):
                continue  # an async custom call runs on the host (offload's HostExecute)
            if i.opcode == "custom-call":
                counted = _kernel(i, hlo)
                f = 0.0 if counted is None else counted[0]
                label = f"custom-call {i.name.split('.')[0]}" + (
                    " (not counted)" if counted is None else ""
                )
                kernels += times * f
            else:
                module = hlo_module_from_text(_wrapped(i, hlo, blocks))
                f = float(_jax.hlo_module_cost_analysis(client, module).get("flops", 0.0))
                label = _label(i, hlo)
            by_kind[label] += times * f
            where = ("kernels", label) if i.opcode == "custom-call" else None
            by_source[where or _where(op_names.get(i.name, "-"))] += times * f
            if f:
                rows.append((times * f, times, i, label))
    total = sum(by_kind.values())
    print(f"{args.hlo}")
    print(f"  cost analysis (step_flops, kernels add nothing): {cost or 0:.4g} FLOPs per device")
    print(f"  by operation (kernels from their shapes): {total:.4g}, kernels {kernels:.4g}")
    for label, f in sorted(by_kind.items(), key=lambda x: -x[1]):
        if f:
            print(f"    {label:<40} {f:.4g}  ({f / total:.1%})")
    print("  by phase and source (FLOPs per step):")
    for phase in ("forward", "recompute", "backward", "kernels"):
        part = {k[1]: f for k, f in by_source.items() if k[0] == phase and f > 1e-4 * total}
        print(f"    {phase}: {sum(f for k, f in by_source.items() if k[0] == phase):.4g}")
        for source, f in sorted(part.items(), key=lambda x: -x[1]):
            print(f"      {source[-70:]:<70} {f:.4g}")
    out, back = host_transfers(hlo)
    print(f"  host transfers per step: {out / 1e9:.3f} GB out, {back / 1e9:.3f} GB back")
    print("  collectives, operand bytes per step:")
    for kind, b in sorted(moved.items(), key=lambda x: -x[1]):
        print(f"    {kind:<24} {b / 1e9:.3f} GB")
    print(f"  top {args.top} operations (FLOPs per step = runs x FLOPs per run):")
    for f, times, i, label in sorted(rows, key=lambda r: -r[0])[: args.top]:
        print(f"    {f:.4g} = {times} x {f / times:.4g}  {label} {i.name} -> {i.shape[:60]}")
        print(f"        op_name: {op_names.get(i.name, '-')[:160]}")
        for line in _matmuls(i, hlo, text_of)[:3]:
            print(f"        {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("ours")
    o.add_argument("hardware")
    o.add_argument("preset")
    o.add_argument("model", help='a catalogue name, overrides after a colon: "m:num_layers=2"')
    o.add_argument("batch", type=int)
    o.add_argument("--remat", default="full")
    o.add_argument("--logits-chunks", type=int, default=1)
    o.add_argument("--microbatches", type=int, default=1)
    o.add_argument("--out", required=True)
    x = sub.add_parser("list")
    x.add_argument("hlo")
    x.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    (ours if args.command == "ours" else listing)(args)


if __name__ == "__main__":
    main()
