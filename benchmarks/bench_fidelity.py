"""The simulation's fidelity: `simulate_devices` against the compile-only devices.

For every TPU and GPU string of the catalogue (and multislice TPU strings, partial GB200
racks), each attribute the planner reads is compared device by device (on GPU also as the
devices carry it: the "raw" column), and three presets are planned on both sets (mesh as
physical positions, ring quality). The compile-only devices are libtpu's for TPU and XLA's CUDA
client's for GPU. Prints one table per platform, one row per string: "=" where they agree, the
difference's reason where they do not (a difference without a listed reason is a defect).

    python benchmarks/bench_fidelity.py [--platform tpu|gpu|all] [--markdown]
"""

from __future__ import annotations

import argparse
import time

from loadax_mesh.compiler.fidelity import ATTRIBUTES, KNOWN, catalogue_strings, compare
from loadax_mesh.view.report import text_table


def table(platform: str, notes: dict[str, int]) -> list[list[str]]:
    """One row of cells per hardware string; reasons numbered in `notes`."""
    columns = [*ATTRIBUTES, "ids", *(["raw"] * (platform == "gpu")), "plans"]
    rows = [["hardware", "devices sim/compiled", *columns]]
    for hardware in catalogue_strings(platform):
        result = compare(hardware)
        found = dict(zip(result.differences, result.reasons, strict=True))
        cells = [hardware, f"{result.simulated}/{result.compiled}"]
        for column in columns:
            hits = [d for d in found if _column(d) == column]
            if not hits:
                cells.append("=")
                continue
            reason = found[hits[0]] or "DEFECT"
            number = notes.setdefault(reason, len(notes) + 1)
            cells.append(f"differs ({number})")
        rows.append(cells)
    return rows


def _column(difference: str) -> str:
    if difference.startswith("plan"):
        return "plans"
    return "raw" if difference.startswith("raw ") else difference


def show(rows: list[list[str]], *, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for cells in rows[1:]:
            print("| " + " | ".join(cells) + " |")
        return
    print(text_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--platform", choices=("tpu", "gpu", "all"), default="all")
    args = parser.parse_args()
    notes: dict[str, int] = {}
    start = time.perf_counter()
    strings = agree = 0
    for platform in ("tpu", "gpu") if args.platform == "all" else (args.platform,):
        rows = table(platform, notes)
        print(f"\n{platform.upper()}\n")
        show(rows, markdown=args.markdown)
        strings += len(rows) - 1
        agree += sum(all(c == "=" for c in r[2:]) for r in rows[1:])
    print()
    for reason, number in notes.items():
        print(f"({number}) {reason}")
    print(
        f"\n{strings} strings, {agree} agree on every attribute and plan; "
        f"{sum(r == 'DEFECT' for r in notes)} unexplained differences; "
        f"{len(KNOWN)} known differences listed; {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
