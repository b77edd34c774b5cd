"""Where a layer loop's memory sits in libtpu's assignment: from an `--xla_dump_to` dir of one
compile (probe_fit.py --dump, or MaxText's train_compile), what the entry computation holds
live when the loop starts, and the largest buffers of the loop's body with their place in the
preallocated temp block.

libtpu's assignment is the arguments plus the temp block; the temp block's size is the highest
offset used. The live-range file covers the entry computation only, so a loop body's working
set shows here as the body's buffers' slots (each slot one offset, several values in turn).

    python benchmarks/probes/probe_loop.py DUMP_DIR [--loop while.44] [--top 30]

Without --loop, the last while loop of the entry computation (the backward pass's layer loop).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

_VALUE = re.compile(
    r"\s*value: <\d+ ([\w.\-]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> "
    r"\(size=(\d+),offset=(\d+)\)(?:: (\S+))?"
)


def _read(dump: Path, suffix: str) -> str:
    found = [p for p in dump.glob(f"*after_optimizations{suffix}") if "cpu_" not in p.name]
    return max(found, key=lambda p: p.stat().st_size).read_text()


def values(assignment: str) -> dict[str, tuple[int, int, int, str]]:
    """Each value's (allocation, offset, size, shape), by name with its tuple index."""
    out, alloc = {}, -1
    for line in assignment.splitlines():
        if m := re.match(r"allocation (\d+):", line):
            alloc = int(m.group(1))
        elif m := _VALUE.match(line):
            name = m.group(1) + (m.group(2) or "{}")
            out[name] = (alloc, int(m.group(4)), int(m.group(3)), m.group(5) or "")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--loop")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    ranges, hlo = _read(args.dump, "-live-range.txt"), _read(args.dump, ".txt")
    vals = values(_read(args.dump, "-buffer-assignment.txt"))
    order = dict(re.findall(r"^\s+(\d+):(\S+)$", ranges.split("BufferLiveRange")[0], re.M))
    loops = [(int(p), n) for p, n in order.items() if n.startswith("while")]
    pos, loop = next((p, n) for p, n in loops if n == args.loop) if args.loop else max(loops)
    slots: dict[tuple[int, int, int], str] = {}
    for name, start, end in re.findall(r"^\s+([\w.\-]+\{[\d,]*\}):(\d+)-(\d+)$", ranges, re.M):
        if int(start) <= pos <= int(end) and name in vals:
            alloc, offset, size, shape = vals[name]
            slots.setdefault((alloc, offset, size), f"{name} {shape[:50]}")
    live = sum(size for _, _, size in slots)
    print(f"{loop} at {pos}: live in the entry computation {live / 2**30:.2f} GiB")
    body = re.search(rf"%{re.escape(loop)} = .*?body=%([\w.\-]+)", hlo)
    assert body, f"no body for {loop}"
    text = re.search(rf"\n%?{re.escape(body.group(1))} .*?\{{\n(.*?)\n\}}\n", hlo, re.S)
    assert text, f"no computation {body.group(1)}"
    names = set(re.findall(r"^\s+(?:ROOT )?%([\w.\-]+) = ", text.group(1), re.M))
    inner: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for name, (alloc, offset, size, shape) in vals.items():
        if name.split("{")[0] in names:
            inner.setdefault((alloc, offset), []).append((size, f"{name} {shape[:50]}"))
    temp = max(alloc for alloc, _, _ in slots)
    top = max(off + max(s for s, _ in v) for (a, off), v in inner.items() if a == temp)
    print(f"its body: {len(names)} instructions; highest offset used {top / 1e9:.3f} GB")
    biggest = sorted(inner.items(), key=lambda kv: -max(s for s, _ in kv[1]))[: args.top]
    for (alloc, offset), held in biggest:
        size, what = max(held)
        print(
            f"  {size / 2**20:8.1f} MiB  a{alloc} at {offset / 1e9:7.3f} GB  x{len(held):<3} {what}"
        )


if __name__ == "__main__":
    main()
