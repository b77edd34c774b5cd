"""The decoder's layers in order under scans (docs/design.md sections 11 and 14).

A scan runs alike layers. Layers differ in their stack (dense `layers/` or MoE `moe_layers/`,
ModelSpec's MoE fields) and in the window their attention slides over (`ModelSpec.window`:
local layers see the last `sliding_window` tokens, global ones the whole causal prefix). The
layer order is cut into runs of alike layers, each a scan over its slice of its stack. Where
the kinds repeat (from `first_dense_layers`, with period lcm(moe_every, global_every)) the
repeating part is one scan over groups of a period, its body the period's runs in order:
MaxText's inhomogeneous layer cycle (Gemma 3: five local layers, then a global one). A model
whose MoE layers are every `moe_every`-th runs the first dense layers, then groups of
`moe_every - 1` dense layers and a MoE layer, then the dense layers left over.

Each run's window is a static argument of its layer function, so a local layer compiles to
the platform's window-aware kernel (splash's local mask skips the blocks outside the window,
cuDNN's sliding window likewise). A window carried through one scan as data could only be a
mask array, which neither kernel takes without giving up its block skipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jax

from .spec import ModelSpec

Params = dict[str, Any]
Layer = Callable[[jax.Array, Params], tuple[jax.Array, Any]]
LayerFor = Callable[[int], Layer]  # a window (0: global) -> the layer function for it
STACKS = ("layers", "moe_layers")


@dataclass(frozen=True)
class Run:
    """`count` consecutive layers of stack `stack` from its layer `start`, all with `window`."""

    stack: str
    window: int
    start: int
    count: int


@lru_cache(maxsize=64)
def layer_kinds(model: ModelSpec) -> tuple[tuple[str, int], ...]:
    """Each layer's stack and window, in order."""
    moe: set[int] = set()
    if model.num_experts:
        first, every = model.first_dense_layers, model.moe_every
        moe = {first + k * every + every - 1 for k in range(model.num_moe_layers)}
    return tuple(
        ("moe_layers" if i in moe else "layers", model.window(i)) for i in range(model.num_layers)
    )


def windows(model: ModelSpec, start: int, stop: int) -> set[int]:
    """The windows of layers `start` .. `stop - 1` (one value: they can share a scan)."""
    return {w for _, w in layer_kinds(model)[start:stop]}


def run_layers(
    layer_for: LayerFor, x: jax.Array, params: Params, model: ModelSpec, *, count: int = 0
) -> jax.Array:
    """The first `count` layers of `model` (0: all) on the residual stream `x`, from the
    `layers/` and `moe_layers/` stacks of `params`."""
    n = count or model.num_layers
    kinds = layer_kinds(model)[:n]
    stacks = {
        s: {k.split("/", 1)[1]: v for k, v in params.items() if k.startswith(s + "/")}
        for s in STACKS
    }
    start, period = _cycle(model)
    groups = (n - start) // period if period > 1 and n > start else 0
    stop = start + groups * period
    x = _apply(layer_for, x, stacks, _runs(kinds, 0, start), single=False)
    if groups:
        x = _grouped(layer_for, x, stacks, kinds, start, period, groups)
    return _apply(layer_for, x, stacks, _runs(kinds, stop, n), single=False)


def _cycle(model: ModelSpec) -> tuple[int, int]:
    """Where the layer kinds start to repeat, and their period (1: no cycle)."""
    moe = model.moe_every if model.num_experts else 1
    window = model.global_every if model.sliding_window and model.global_every else 1
    period = math.lcm(moe, window)
    return (model.first_dense_layers if model.num_experts else 0), period


def _runs(kinds: tuple[tuple[str, int], ...], lo: int, hi: int) -> list[Run]:
    """Layers `lo` .. `hi - 1` as runs of alike layers, `start` counted in each stack."""
    out: list[Run] = []
    for i in range(lo, hi):
        stack, window = kinds[i]
        if out and (out[-1].stack, out[-1].window) == (stack, window):
            last = out[-1]
            out[-1] = Run(stack, window, last.start, last.count + 1)
        else:
            start = sum(1 for s, _ in kinds[:i] if s == stack)
            out.append(Run(stack, window, start, 1))
    return out


def _grouped(
    layer_for: LayerFor,
    x: jax.Array,
    stacks: dict[str, Params],
    kinds: tuple[tuple[str, int], ...],
    start: int,
    period: int,
    groups: int,
) -> jax.Array:
    """`groups` periods from layer `start` as one scan, each stack's layers of them reshaped
    to [groups, per period, ...]; the body runs one period's runs."""
    runs = _runs(kinds, start, start + period)
    first: dict[str, int] = {}  # each stack's first layer in the groups
    for r in runs:
        first.setdefault(r.stack, r.start)
    per = {s: sum(r.count for r in runs if r.stack == s) for s in first}
    body_runs = [Run(r.stack, r.window, r.start - first[r.stack], r.count) for r in runs]
    grouped = {
        s: {
            k: v[first[s] : first[s] + groups * per[s]].reshape(groups, per[s], *v.shape[1:])
            for k, v in stacks[s].items()
        }
        for s in first
    }

    def group(x: jax.Array, weights: dict[str, Params]) -> tuple[jax.Array, None]:
        return _apply(layer_for, x, weights, body_runs, single=True), None

    return jax.lax.scan(group, x, grouped)[0]


def _apply(
    layer_for: LayerFor, x: jax.Array, stacks: dict[str, Params], runs: list[Run], *, single: bool
) -> jax.Array:
    """Each run as a scan over its slice of its stack; with `single`, a run of one layer as a
    plain call (a period's MoE layer)."""
    for run in runs:
        layer = layer_for(run.window)
        weights = {k: v[run.start : run.start + run.count] for k, v in stacks[run.stack].items()}
        if single and run.count == 1:
            x = layer(x, {k: v[0] for k, v in weights.items()})[0]
        else:
            x = jax.lax.scan(layer, x, weights)[0]
    return x
