"""MaxText's keys for the recipe's precision and optimizer sharding (TrainSpec.quantization,
TrainSpec.optimizer_over_data), and what each approximates.
"""

from __future__ import annotations

from ..workload.spec import TrainSpec

# TrainSpec.quantization -> MaxText's keys
_QUANTIZATION = {
    "fp8": {"quantization": "fp8_full", "use_qwix_quantization": "true"},
    "int8": {"quantization": "int8"},
}


def numerics_keys(train: TrainSpec) -> tuple[dict[str, str], list[str]]:
    """The low-precision and ZeRO-1 keys of `train` and what they approximate (none for a
    bf16 step with the optimizer as the parameters)."""
    keys: dict[str, str] = {}
    notes: list[str] = []
    if (q := train.quantization) != "none":
        scope = "e4m3 weights and activations, e5m2 gradients" if q == "fp8" else "int8 operands"
        keys |= _QUANTIZATION[q]
        notes.append(
            f"approximate: quantization={_QUANTIZATION[q]['quantization']} ({scope}) quantizes "
            "every matmul of MaxText's decoder layers, the router's included; the reference "
            "step quantizes the projections' and MLP matmuls (the experts' too) and keeps the "
            "router, attention and the head in the compute dtype"
        )
    if train.optimizer_over_data:
        keys["shard_optimizer_over_data"] = "true"
        notes.append(
            "approximate: MaxText's shard_optimizer_over_data gathers the parameters in "
            "bfloat16 before the accumulation loop; the reference step gathers them in "
            f"param_dtype ({train.param_dtype}) after the update"
        )
    return keys, notes
