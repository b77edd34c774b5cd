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

    python benchmarks/probe_fsdp_schedule.py DUMP_DIR [--min-mib 16]

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

_HEAD = re.compile(r"^(?:ENTRY )?%(\S+) ")
_OP = re.compile(r" (all-gather|all-reduce|reduce-scatter)(-start)?\(%")
_SHAPE = re.compile(r"(bf16|f32|s32|u32|f16|s8)\[([\d,]*)\]")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1}


def computations(hlo: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        head = _HEAD.match(line)
        if head and line.rstrip().endswith("{"):
            name = head[1]
            found[name] = []
        elif name and line.startswith("  "):
            found[name].append(line)
    return found


def buffer_bytes(text: str) -> tuple[str, int]:
    """The first array shape of `text` (an op's result) and its bytes."""
    m = _SHAPE.search(text)
    if m is None:
        return "?", 0
    dims = [int(d) for d in m[2].split(",") if d]
    return f"{m[1]}[{m[2]}]", _BYTES[m[1]] * math.prod(dims)


def collectives_in(comps: dict[str, list[str]], name: str, depth: int = 0) -> list[str]:
    """The collective ops inside a called computation (fusions nest), as result lines."""
    if depth > 4:
        return []
    found = []
    for line in comps.get(name, []):
        if " = " not in line:
            continue
        rhs = line.split(" = ", 1)[1]
        if _OP.search(rhs):
            found.append(rhs)
        for callee in re.findall(r"calls=%([\w.\-]+)", rhs):
            found += collectives_in(comps, callee, depth + 1)
    return found


def loop_bodies(comps: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(body, what the while op's metadata calls it) for every while loop."""
    bodies = []
    for lines in comps.values():
        for line in lines:
            if " while(" in line and (body := re.search(r"body=%([\w.\-]+)", line)):
                what = re.search(r'op_name="([^"]+)"', line)
                bodies.append((body[1], what[1] if what else "?"))
    return bodies


def classify(comps: dict[str, list[str]], body: str, min_bytes: int) -> Counter[str]:
    """The body's collectives of at least `min_bytes`, keyed 'how: kind buffer', counted."""
    seen: Counter[str] = Counter()
    for line in comps[body]:
        if " = " not in line:
            continue
        lhs, rhs = line.split(" = ", 1)
        if "-done" in lhs:  # an async pair is counted at its start
            continue
        own = _OP.search(rhs)
        if own:
            shape, nbytes = buffer_bytes(rhs)
            if nbytes >= min_bytes:
                how = "async" if own[2] else "in line"
                seen[f"{how}: {own[1]} {shape} ({nbytes / 2**20:.0f} MiB)"] += 1
            continue
        if "start" not in lhs:  # matmul fusions holding a continuation's pieces: at the start
            continue
        callees = re.findall(r"calls=%([\w.\-]+)", rhs)
        for inner in (x for c in callees for x in collectives_in(comps, c)):
            kind = _OP.search(inner)
            shape, nbytes = buffer_bytes(inner)
            if kind and nbytes >= min_bytes:
                seen[f"async: {kind[1]} {shape} ({nbytes / 2**20:.0f} MiB)"] += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--min-mib", type=float, default=16.0)
    args = parser.parse_args()
    files = sorted(args.dump.glob("*after_optimizations.txt"))
    hlo = next(f for f in files if "train_step" in f.name or "step" in f.name.split(".")[1])
    comps = computations(hlo.read_text())
    print(hlo.name)
    entry = re.search(r"^ENTRY %(\S+) ", hlo.read_text(), re.M)
    # layers under a scan: each loop body; unrolled layers: the entry computation
    for body, what in loop_bodies(comps) or [(entry[1] if entry else "", "entry (unrolled)")]:
        seen = classify(comps, body, int(args.min_mib * 2**20))
        if seen:
            print(f"{what} ({body[:40]}):")
            for key, n in sorted(seen.items()):
                print(f"  {n} x {key}")


if __name__ == "__main__":
    main()
