"""Ring quality per mesh axis: loadax_mesh against JAX's mesh_utils and a naive reshape.

For each TPU case the same stand-in devices (listed as JAX lists them) go to four layouts:
`loadax_mesh.plan_mesh`; JAX `create_device_mesh` (multislice: `create_hybrid_device_mesh`)
as is, and with `allow_split_physical_axes=True`; and a plain reshape of the device list. Every
layout is judged by the same measure (docs/design.md section 5, `loadax_mesh.quality.axis_quality`)
with the catalogue's wraparound for the slice: per axis, ring steps / physical hops (1.0 = every
step a direct link; above 1 where cores of one chip share steps). Where JAX raises, the table
says what it raised. The sum column adds the axes' efficiencies.

    python benchmarks/bench_quality.py [--markdown]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from bench_solver import tpu_devices

import loadax_mesh as lm
from loadax_mesh.hardware.devices import granule_keys, read_devices
from loadax_mesh.hardware.strings import wraparound
from loadax_mesh.quality import axis_quality
from loadax_mesh.solver.hybrid import Layout, Torus

# (label, devices: a hardware string or (chip shape, slices, kind), ICI shape, DCN shape)
Devices = str | tuple[tuple[int, int, int], int, str]
CASES: list[tuple[str, Devices, tuple[int, ...], tuple[int, ...] | None]] = [
    ("v4 4x4x4 one axis", "tpu-v4-128", (64,), None),
    ("v4 4x4x4 two whole dims", "tpu-v4-128", (16, 4), None),
    ("v4 4x4x4 three axes", "tpu-v4-128", (4, 4, 4), None),
    ("v4 4x4x4 split", "tpu-v4-128", (8, 8), None),
    ("v4 4x4x4 split", "tpu-v4-128", (2, 32), None),
    ("v4 4x4x8", "tpu-v4-256", (8, 16), None),
    ("v4 4x4x8 split, 4 axes", "tpu-v4-256", (2, 2, 8, 4), None),
    ("v4 4x8x8", "tpu-v4-512", (32, 8), None),
    ("v5p 8x8x8 one axis", "tpu-v5p-1024", (512,), None),
    ("v5p 8x8x8", "tpu-v5p-1024", (64, 8), None),
    ("v5p 16x16x16 one axis", "tpu-v5p-8192", (4096,), None),
    ("v5p 16x16x16", "tpu-v5p-8192", (16, 256), None),
    ("v5p 16x16x16 split", "tpu-v5p-8192", (8, 512), None),
    ("v5p 16x20x28 full pod", ((16, 20, 28), 1, "TPU v5"), (70, 128), None),
    ("v5p 16x20x28 full pod", ((16, 20, 28), 1, "TPU v5"), (20, 448), None),
    ("v5e 16x16", "tpu-v5litepod-256", (64, 4), None),
    ("v5e 16x16", "tpu-v5litepod-256", (32, 8), None),
    ("v6e 16x16", "tpu-v6e-256", (64, 4), None),
    ("v6e 8x16 (wrap on 16)", "tpu-v6e-128", (16, 8), None),
    ("v5e 4x4 (no wrap)", "tpu-v5litepod-16", (4, 4), None),
    ("7x 2x2x4, 2 cores", "tpu-7x-32", (4, 8), None),
    ("7x 4x4x4, 2 cores", "tpu-7x-128", (8, 16), None),
    ("7x 4x4x4, 2 cores", "tpu-7x-128", (4, 32), None),
    ("2 x v4 4x4x4", "tpu-v4-128-2", (16, 4), (2, 1)),
    ("4 x v5p 8x8x8", "tpu-v5p-1024-4", (8, 64), (4, 1)),
    ("2 x v5e 16x16", "tpu-v5litepod-256-2", (64, 4), (2, 1)),
]


def build(devices: Devices) -> list[Any]:
    if isinstance(devices, str):
        return lm.simulate_devices(devices)
    chips, slices, kind = devices
    return tpu_devices(chips, slices, kind=kind)


def measure(grid: np.ndarray, devices: list[Any], dcn: Sequence[int]) -> list[float]:
    """Per-axis efficiency of a device grid, judged on the devices' own torus."""
    table = read_devices(devices)
    row = {d.id: i for i, d in enumerate(devices)}
    index = np.vectorize(lambda d: row[d.id], otypes=[np.int64])(grid)
    granule, _ = granule_keys(table, "auto")
    assert table.coords is not None and table.core_on_chip is not None
    chips = tuple(int(x) for x in table.coords.max(axis=0) - table.coords.min(axis=0) + 1)
    torus = Torus(chips, wraparound(table.device_kind, chips), int(table.core_on_chip.max()) + 1)
    layout = Layout(index, granule, int(granule.max()) + 1, torus)
    names = tuple(f"a{i}" for i in range(grid.ndim))
    return [q.efficiency for q in axis_quality(layout, table.coords, names, tuple(dcn)).values()]


def jax_layout(
    devices: list[Any], ici: tuple[int, ...], dcn: tuple[int, ...] | None, *, split: bool
) -> np.ndarray:
    from jax.experimental import mesh_utils

    if dcn:
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=split
        )
    return mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=split)


def attempt(fn: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> np.ndarray | str:
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # JAX's own errors are the point of the comparison
        return f"raised {type(err).__name__}: {str(err).splitlines()[0][:60]}"


def cell(result: np.ndarray | str, devices: list[Any], dcn: Sequence[int]) -> str:
    if isinstance(result, str):
        return result
    eff = measure(result, devices, dcn)
    return " ".join(f"{e:5.3f}" for e in eff) + f"  (sum {sum(eff):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="one markdown table")
    args = parser.parse_args()
    methods = ("loadax_mesh", "JAX", "JAX split", "reshape")
    if args.markdown:
        print("| case | mesh | devices | " + " | ".join(methods) + " |")
        print("|---" * (3 + len(methods)) + "|")
    else:
        print(__doc__.split("\n\n")[0], "\n")
    wins = losses = 0
    for label, spec, ici, dcn in CASES:
        devices = build(spec)
        dcn_shape = dcn or (1,) * len(ici)
        full = tuple(i * d for i, d in zip(ici, dcn_shape, strict=True))
        names = ("data", *(f"a{i}" for i in range(1, len(ici))))
        shape = lm.HybridMeshShape(ici, dcn) if dcn else ici
        results = {
            "loadax_mesh": lm.plan_mesh(shape, devices, axis_names=names).devices,
            "JAX": attempt(jax_layout, devices, ici, dcn, split=False),
            "JAX split": attempt(jax_layout, devices, ici, dcn, split=True),
            "reshape": np.asarray(devices, dtype=object).reshape(full),
        }
        cells = {name: cell(results[name], devices, dcn_shape) for name in methods}
        mesh = "x".join(map(str, ici)) + (f" dcn {'x'.join(map(str, dcn))}" if dcn else "")
        if args.markdown:
            short = {k: v.split(":")[0] for k, v in cells.items()}
            print(f"| {label} | {mesh} | {len(devices)} | " + " | ".join(short.values()) + " |")
        else:
            print(f"{label}: mesh {mesh} ({len(devices)} devices)")
            for name in methods:
                print(f"  {name:12s} {cells[name]}")
            print()
        mine = measure(results["loadax_mesh"], devices, dcn_shape)
        for name in ("JAX", "JAX split"):
            theirs = results[name]
            if not isinstance(theirs, str):
                other = measure(theirs, devices, dcn_shape)
                wins += sum(mine) > sum(other) + 1e-9
                losses += mine[-1] < other[-1] - 1e-9 or sum(mine) < sum(other) - 1e-9
    print(
        f"\n{len(CASES)} cases; against JAX's layouts (both modes, where JAX answered): ours "
        f"better in the sum {wins} times, worse on the last axis or in the sum {losses} times"
    )


if __name__ == "__main__":
    main()
