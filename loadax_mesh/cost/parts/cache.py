"""A cache for the plain step's parts, keyed on what they read of the recipe.

`choose_mesh` prices every recipe of a pipelined mesh: each its pipeline's micro-batches and
repeats. The plain step's parts (a layer's bytes, the step's memory terms) read no pipeline
field of a TrainSpec (the pipelined step passes its `Stages` apart), so they are cached on the
TrainSpec without them: one recipe's parts are found once for every pipeline searched with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, wraps
from typing import Any, ParamSpec, TypeVar, cast

from ...workload.spec import TrainSpec

P = ParamSpec("P")
R = TypeVar("R")


@lru_cache(maxsize=8192)
def without_pipeline(train: TrainSpec) -> TrainSpec:
    """`train` with the pipeline's fields at their defaults (what a plain step's part reads)."""
    return replace(
        train, pipeline_microbatches=0, pipeline_repeats=1, pipeline_layers=0,
        pipeline_remat="layer",
    )  # fmt: skip


def plain_cache(maxsize: int, *, copy: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`functools.lru_cache` for a pure function of (model, train, ...) that reads no pipeline
    field of `train`, keyed on `without_pipeline(train)`; `copy`: its result is a dict that
    callers may change, so each gets its own copy of the cached one."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            model, train, *rest = args
            found: Any = cast(Any, cached)(model, without_pipeline(train), *rest, **kwargs)
            return cast(R, dict(found) if copy else found)

        return call

    return decorate
