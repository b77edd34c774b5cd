"""The simulation's fidelity: `simulate_devices` against libtpu's compile-only devices.

For every TPU string of the catalogue (and multislice strings), each attribute the planner reads
is compared device by device, and three presets are planned on both sets (mesh as physical
positions, ring quality). Prints one row per string: "=" where they agree, the difference's
reason where they do not (a difference without a listed reason is a defect).

    python benchmarks/bench_fidelity.py [--markdown]
"""

from __future__ import annotations

import argparse
import time

from loadax_mesh.fidelity import ATTRIBUTES, KNOWN, catalogue_strings, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--platform", default="tpu")
    args = parser.parse_args()
    columns = [*ATTRIBUTES, "ids", "plans"]
    notes: dict[str, int] = {}
    rows = []
    start = time.perf_counter()
    for hardware in catalogue_strings(args.platform):
        result = compare(hardware)
        found = dict(zip(result.differences, result.reasons, strict=True))
        cells = [hardware, f"{result.simulated}/{result.compiled}"]
        for column in columns:
            hits = [d for d in found if ("plans" if d.startswith("plan") else d) == column]
            if not hits:
                cells.append("=")
                continue
            reason = found[hits[0]] or "DEFECT"
            number = notes.setdefault(reason, len(notes) + 1)
            cells.append(f"differs ({number})")
        rows.append(cells)
    header = ["hardware", "devices sim/libtpu", *columns]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for cells in [header, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
    print()
    for reason, number in notes.items():
        print(f"({number}) {reason}")
    agree = sum(all(c == "=" for c in r[2:]) for r in rows)
    print(
        f"\n{len(rows)} strings, {agree} agree on every attribute and plan; "
        f"{sum('DEFECT' in n for n in notes)} unexplained differences; "
        f"{len(KNOWN)} known differences listed; {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
