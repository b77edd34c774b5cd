"""The kernels the reference step runs per platform, and the target they are traced for.

Grouped matmuls (the dropless MoE experts): on TPU and CPU `jax.lax.ragged_dot`, which libtpu
compiles to a grouped matmul over the routed rows. XLA's GPU compiler instead rewrites it into a
dense dot over every expert (its work and temp memory grow with the expert count:
docs/facts/gpu_grouped_gemm.md), so on GPU the step runs tokamax's `ragged_dot` (DeepMind's
Pallas kernel library: Mosaic GPU kernels for sm90 and sm100, with their own backward pass), whose
work and memory scale with the routed rows. Without tokamax a GPU step refuses: it never falls
back to the dense rewrite silently.

Both tokamax and jax's cuDNN attention read the GPU they build for from the process's devices
(tokamax: the default device's compute capability; jax: whether the backend is CUDA, before
it accepts a head wider than 128 on Hopper). Compiling for compile-only GPU devices on a machine
without one, the process's devices are CPUs, so `traced_for` makes the target GPU the default
device and answers jax's check with the target's capability while the step is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import jax
from jax.sharding import Mesh

from ..errors import MeshConfigError
from ..hardware.traits import platform_traits
from . import quantized

GroupedMatmul = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
INSTALL = "pip install 'loadax-mesh[gpu]' (tokamax, the grouped-matmul kernels for GPU)"


def grouped_matmul(platform: str, quantization: str = "none") -> GroupedMatmul:
    """`f(rows [m, k], weights [g, k, n], sizes [g]) -> [m, n]`: rows grouped in order, group
    i's `sizes[i]` rows times weights[i], as `platform` runs it best; in `quantization`'s
    precision where its kernel takes low-precision operands (`jax.lax.ragged_dot`: TPU and
    CPU). tokamax's kernels on GPU run in compute dtype: on sm90 they take no low-precision
    activations (a quantized weight only, dequantized inside), and they have no quantized
    backward pass."""
    if platform_traits(platform).grouped_matmul != "tokamax":
        if quantization == "none":
            return jax.lax.ragged_dot
        return partial(quantized.grouped, quantization=quantization)
    try:
        import tokamax
    except ImportError:
        raise MeshConfigError(
            f"platform={platform!r}: the dropless MoE step needs tokamax's grouped matmul on "
            f"GPU (XLA's own ragged_dot computes every expert for every token there); accepted: "
            f"install it with {INSTALL}, or TrainSpec(moe='capacity')"
        ) from None
    from absl import flags

    if not flags.FLAGS.is_parsed():
        # tokamax reads its options as absl flags, parsing sys.argv on first use: a program's
        # own arguments (pytest's, the command line's) are no absl flags, so its defaults
        flags.FLAGS.mark_as_parsed()

    def run(rows: jax.Array, weights: jax.Array, sizes: jax.Array) -> jax.Array:
        return tokamax.ragged_dot(rows, weights, sizes, implementation="mosaic")

    return run


def shard_map_mesh(mesh: Mesh) -> dict[str, Any]:
    """The `mesh` (and `axis_names`) keywords of a `jax.shard_map` over the axes of `mesh` the
    trace is not manual over already: inside a pipeline stage (pipeline.py, manual over the
    pipeline axis) the context's mesh and every other axis; elsewhere `mesh` itself."""
    context = jax.sharding.get_abstract_mesh()
    manual = set() if context.empty else set(context.manual_axes)
    if not manual:
        return {"mesh": mesh}
    return {"mesh": context, "axis_names": frozenset(mesh.axis_names) - manual}


def gathered(a: jax.Array, axis: str | None, dim: int) -> jax.Array:
    """A device's shard of keys or values whole along the sequence (`dim`): an all-gather over
    the `seq` axis written out under the `shard_map`, whose transpose is a reduce-scatter of
    their gradients. (Gathered at the `shard_map`'s edge instead, by an in_spec without the
    axis, the gradients are summed by an all-reduce of the whole sequence, which libtpu does
    not turn into a reduce-scatter: twice the bytes.)"""
    return a if axis is None else jax.lax.all_gather(a, axis, axis=dim, tiled=True)


@contextlib.contextmanager
def traced_for(mesh: Mesh) -> Iterator[None]:
    """While the step is traced: for devices whose kernels read the process's own device (GPU)
    that are not this process's own (compile-only), the target as the default device and as
    the GPU jax's cuDNN attention checks; for any other devices, nothing changes."""
    device = mesh.devices.flat[0]
    if not platform_traits(device.platform).kernels_read_own_device:
        yield
        return
    if device.platform == jax.default_backend():  # this process's own GPUs
        with _tokamax_quiet():
            yield
        return
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    target = tuple(int(x) for x in str(device.compute_capability).split("."))

    def check(capability: str) -> bool:
        return target >= tuple(int(x) for x in capability.split("."))

    saved: Any = cudnn.check_compute_capability
    cudnn.check_compute_capability = check
    try:
        with jax.default_device(device), _tokamax_quiet():
            yield
    finally:
        cudnn.check_compute_capability = saved


@contextlib.contextmanager
def _tokamax_quiet() -> Iterator[None]:
    """tokamax warns of an autotuning cache miss for every shape it has not tuned and then uses
    its heuristics (what a first run on a GPU does too): not a user's concern here."""
    import logging

    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
