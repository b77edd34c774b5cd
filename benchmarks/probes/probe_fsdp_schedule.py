"""How libtpu runs an FSDP step's weight collectives: per layer-loop body of an optimised HLO
(ours or MaxText's, dumped with `--xla_dump_to`), each collective over the fsdp axis by how it
runs, with its buffer's bytes.

- in line: a plain `all-gather(` / `all-reduce(` / `reduce-scatter(` in the loop body; the core
  waits for it (exposed);
- async: the collective inside an async collective fusion (continuation fusion,
  `async-collective-start` ... `-done`) or an `*-start` / `*-done` pair: it runs beside the
  matmul fusions scheduled between its start and its end.

A full gradient reduced by an in-line `all-reduce` and then sliced (no `reduce-scatter` layout)
moves the buffer twice (a reduce-scatter and an all-gather) where a reduce-scatter moves it once.

    python benchmarks/probes/probe_fsdp_schedule.py DUMP_DIR [--min-mib 16]

DUMP_DIR holds `*train_step*after_optimizations.txt` (MaxText) or `*jit_step*` (ours); the
first module whose name holds "train_step" or "step" is read. Compile the steps with
benchmarks/bench_maxtext.py's command line (MaxText) or `compile_step` with XLA_FLAGS
`--xla_dump_to` (ours).
"""

from __future__ import annotations

import argparse
import math
import re
from collections import Counter
from pathlib import Path

from loadax_mesh.compiler.hlo import HloText, Instruction

_KINDS = ("all-gather", "all-reduce", "reduce-scatter")
_SHAPE = re.compile(r"(bf16|f32|s32|u32|f16|s8)\[([\d,]*)\]")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1}


def buffer_bytes(shape: str) -> tuple[str, int]:
    """The first array of a result shape (an async start's tuple holds its operand first) and
    its bytes."""
    m = _SHAPE.search(shape)
    if m is None:
        return "?", 0
    dims = [int(d) for d in m[2].split(",") if d]
    return f"{m[1]}[{m[2]}]", _BYTES[m[1]] * math.prod(dims)


def _kind(i: Instruction) -> tuple[str, bool] | None:
    """(collective kind, whether it is an async start), or None for any other op."""
    base = i.opcode.removesuffix("-start")
    return (base, i.opcode != base) if base in _KINDS else None


def _calls(i: Instruction) -> list[str]:
    return [name for how, name in i.called() if how == "calls"]


def collectives_in(hlo: HloText, name: str, depth: int = 0) -> list[Instruction]:
    """The collective ops inside a called computation (fusions nest)."""
    if depth > 4:
        return []
    found = []
    for i in hlo.computations.get(name, []):
        if _kind(i):
            found.append(i)
        for callee in _calls(i):
            found += collectives_in(hlo, callee, depth + 1)
    return found


def loop_bodies(hlo: HloText) -> list[tuple[str, str]]:
    """(body, what the while op's metadata calls it) for every while loop."""
    bodies = []
    for body in hlo.computations.values():
        for i in body:
            called = dict(i.called())
            if i.opcode == "while" and "body" in called:
                what = re.search(r'op_name="([^"]+)"', i.attributes)
                bodies.append((called["body"], what[1] if what else "?"))
    return bodies


def classify(hlo: HloText, body: str, min_bytes: int) -> Counter[str]:
    """The body's collectives of at least `min_bytes`, keyed 'how: kind buffer', counted."""
    seen: Counter[str] = Counter()
    for i in hlo.computations[body]:
        if "-done" in i.name:  # an async pair is counted at its start
            continue
        own = _kind(i)
        if own:
            shape, nbytes = buffer_bytes(i.shape)
            if nbytes >= min_bytes:
                how = "async" if own[1] else "in line"
                seen[f"{how}: {own[0]} {shape} ({nbytes / 2**20:.0f} MiB)"] += 1
            continue
        if "start" not in i.name:  # matmul fusions holding a continuation's pieces: at the start
            continue
        for inner in (x for c in _calls(i) for x in collectives_in(hlo, c)):
            kind = _kind(inner)
            shape, nbytes = buffer_bytes(inner.shape)
            if kind and nbytes >= min_bytes:
                seen[f"async: {kind[0]} {shape} ({nbytes / 2**20:.0f} MiB)"] += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--min-mib", type=float, default=16.0)
    args = parser.parse_args()
    files = sorted(args.dump.glob("*after_optimizations.txt"))
    hlo = next(f for f in files if "train_step" in f.name or "step" in f.name.split(".")[1])
    text = HloText(hlo.read_text())
    print(hlo.name)
    # layers under a scan: each loop body; unrolled layers: the entry computation
    for body, what in loop_bodies(text) or [(text.entry, "entry (unrolled)")]:
        seen = classify(text, body, int(args.min_mib * 2**20))
        if seen:
            print(f"{what} ({body[:40]}):")
            for key, n in sorted(seen.items()):
                print(f"  {n} x {key}")


if __name__ == "__main__":
    main()
