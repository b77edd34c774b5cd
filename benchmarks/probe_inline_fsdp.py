"""The calibration set priced with the FSDP schedule libtpu compiles, not the one the time
model assumes (a what-if; the model is not changed).

The time model hides every FSDP weight gather and gradient reduce-scatter of a layer behind the
compute (cost/traffic.py). MaxText's GPT-3 175B step on compile-only v6e-256 devices (fsdp 256,
2 layers; its recipe's XLA flags, and again with LLaMA-3.1 70B's; benchmarks/RESULTS.md, read
with benchmarks/probe_fsdp_schedule.py) runs per layer and pass the attention block's weight
gathers (q, k, v and output) in line, the MLP's async beside matmuls, and reduces every weight
gradient with an in-line all-reduce of the whole gradient (twice a reduce-scatter's bytes).
This probe reprices every TPU run that way (dense layers; GPU and MoE layers as before), refits
the calibrations leave-one-out as bench_time.py does and prints its table:

    python benchmarks/probe_inline_fsdp.py [--only gathers|reductions] [--fit] [--markdown]

`--only` keeps one half of the schedule (the attention gathers in line, or the in-line
all-reduces). The other flags are bench_time.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import bench_time

from loadax_mesh.cost import mla, traffic
from loadax_mesh.cost.traffic import Collective
from loadax_mesh.workload.layout import Roles
from loadax_mesh.workload.spec import ModelSpec, TrainSpec, dtype_bytes

_estimate = sys.modules["loadax_mesh.cost.estimate"]  # the module (the package exports a function)
_assumed = traffic.collectives


def as_compiled(gathers: bool, reductions: bool) -> Callable[..., list[Collective]]:
    """`traffic.collectives` with a dense layer's FSDP collectives as libtpu schedules them."""

    def collectives(
        model: ModelSpec, train: TrainSpec, roles: Roles, *, overlapped: bool = False
    ) -> list[Collective]:
        found = _assumed(model, train, roles, overlapped=overlapped)
        if model.num_experts or not overlapped:  # MoE layers, and GPU: as the model has them
            return found
        attention = mla.attention_weights(model, roles.size("model")) * dtype_bytes(
            train.compute_dtype
        )
        out = []
        for c in found:
            if gathers and c.what == "layer weights":
                out += [
                    replace(c, what="attention weights", bytes=attention, overlaps=False),
                    replace(c, what="MLP weights", bytes=c.bytes - attention),
                ]
            elif reductions and c.what == "layer weight gradients" and c.kind == "reduce-scatter":
                out.append(replace(c, kind="all-reduce", overlaps=False))
            else:
                out.append(c)
        return out

    return collectives


def main() -> None:
    only = None
    if "--only" in sys.argv:
        at = sys.argv.index("--only")
        only = sys.argv[at + 1]
        del sys.argv[at : at + 2]
        if only not in ("gathers", "reductions"):
            raise SystemExit(f"--only {only}: accepted: gathers, reductions")
    _estimate.collectives = as_compiled(only != "reductions", only != "gathers")
    bench_time.main()


if __name__ == "__main__":
    main()
