"""MaxText's keys for context parallelism (TrainSpec.context_strategy and
context_load_balance) and what MaxText refuses of them."""

from __future__ import annotations

from ..errors import MeshConfigError
from ..hardware.traits import platform_traits
from ..workload.model import ModelSpec
from ..workload.spec import TrainSpec


def context_keys(
    train: TrainSpec, platform: str, size: int, model: ModelSpec | None
) -> dict[str, str]:
    """The context-parallel keys: the strategy (MaxText's names) and the dual-chunk-swap load
    balance (applied at the input, as the step does). MaxText's TPU ring is tokamax's splash
    ring kernel; configs/types.py refuses it without `use_tokamax_splash` and the below."""
    keys = {
        "context_parallel_strategy": train.context_strategy,
        "context_parallel_load_balance": str(train.context_load_balance).lower(),
    }
    if train.context_strategy != "ring" or platform_traits(platform).fused_attention != "splash":
        return keys  # no ring, or off TPU
    refused = []
    if train.attention == "plain":
        refused.append(f"attention={train.attention!r} (MaxText's TPU ring needs flash)")
    if model is not None and model.seq_len % (size * size):
        refused.append(f"seq_len={model.seq_len} (not divisible by the seq size {size} squared)")
    if train.context_load_balance and size % 2:
        refused.append(f"context_load_balance=True with an odd seq size {size}")
    if refused:
        raise MeshConfigError(
            f"to_maxtext: context_strategy='ring' on TPU with {'; '.join(refused)}: MaxText "
            "refuses it; accepted: fused attention, seq_len divisible by the seq size squared, "
            "an even seq size when load balanced, or context_strategy='all_gather'"
        )
    return keys | {"use_tokamax_splash": "true"}
