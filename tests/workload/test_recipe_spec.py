"""TrainSpec's recipe fields (remat placements, micro-batches, logits chunks), its choice
fields' types and its fields' docstrings (no jax)."""

from dataclasses import fields
from typing import Literal, get_args, get_origin, get_type_hints

import pytest

from loadax_mesh import MeshConfigError, TrainSpec
from loadax_mesh.workload.spec import (
    ATTENTION,
    CONTEXT_STRATEGIES,
    DTYPES,
    MOE,
    PIPELINE_REMAT,
    PIPELINE_SCHEDULES,
    POLICIES,
    QUANTIZATION,
    ROUTING,
    TENSORS,
    field_docs,
    parse_remat,
)


def test_a_mapping_names_some_tensors_and_the_rest_follow_full_remat() -> None:
    train = TrainSpec(global_batch=8, remat={"layer_input": "offload", "query": "offload"})
    assert train.placements["layer_input"] == "offload"
    assert train.placements["query"] == "offload"
    assert {train.placements[t] for t in TENSORS[2:]} == {"recompute"}
    assert train.remat_text == "layer_input=offload,query=offload"
    assert TrainSpec(global_batch=8, remat=train.remat) == train  # stored pairs round-trip
    hash(train)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_mapping_equal_to_a_policy_is_stored_as_its_name(name: str) -> None:
    stored = TrainSpec(global_batch=8, remat=dict(POLICIES[name])).remat
    assert TrainSpec(global_batch=8, remat=name).placements == POLICIES[name]
    if name != "none":
        assert stored == name
        return
    # Every named tensor on the device is a checkpointed layer (MaxText's minimal_flash), not
    # "none" (no checkpoint): stored as "dots_attention", and round-trips as it.
    assert stored == "dots_attention"
    assert TrainSpec(global_batch=8, remat=tuple(POLICIES["none"].items())).remat == stored
    assert TrainSpec(global_batch=8, remat="none").remat == "none"


def test_the_command_line_form() -> None:
    assert parse_remat("dots") == "dots"
    assert parse_remat("layer_input=offload, value=device") == {
        "layer_input": "offload",
        "value": "device",
    }
    with pytest.raises(MeshConfigError, match="no new tensor=placement pair"):
        parse_remat("query=device,query=offload")
    with pytest.raises(MeshConfigError, match="no new tensor=placement pair"):
        parse_remat("query=device,offload")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"remat": {"keys": "device"}}, "tensor 'keys' is not a named tensor.*layer_input"),
        ({"remat": {"query": "host"}}, "query='host'; accepted: recompute, device, offload"),
        ({"remat": {"layer_input": "recompute"}}, "layer_input='recompute'.*device, offload"),
        ({"remat": "all"}, "remat='all'; accepted: full, dots, dots_attention, none, offload"),
        ({"remat": 3}, "remat=3"),
        ({"microbatches": 0}, "microbatches=0; accepted: a positive integer"),
        ({"microbatches": 2.0}, "microbatches=2.0"),
        ({"microbatches": 3}, "microbatches=3 does not divide global_batch=8"),
        ({"logits_chunks": 0}, "logits_chunks=0; accepted: a positive integer"),
        ({"logits_chunks": True}, "logits_chunks=True"),
        ({"optimizer_over_data": 1}, "optimizer_over_data=1; accepted: True or False"),
        ({"context_load_balance": 0}, "context_load_balance=0; accepted: True or False"),
        ({"context_strategy": "ulysses"}, "context_strategy='ulysses'; accepted: all_gather, ring"),
    ],
)
def test_bad_recipe_fields(kwargs: dict, message: str) -> None:
    with pytest.raises(MeshConfigError, match=message):
        TrainSpec(global_batch=8, **kwargs)


def test_every_choice_field_is_typed_with_its_choices_and_every_field_documented() -> None:
    hints = get_type_hints(TrainSpec)
    choices = {
        "param_dtype": DTYPES,
        "compute_dtype": DTYPES,
        "opt_state_dtype": DTYPES,
        "attention": ATTENTION,
        "moe": MOE,
        "routing": ROUTING,
        "pipeline_remat": PIPELINE_REMAT,
        "pipeline_schedule": PIPELINE_SCHEDULES,
        "quantization": QUANTIZATION,
        "context_strategy": CONTEXT_STRATEGIES,
    }
    literal = {f.name for f in fields(TrainSpec) if get_origin(hints[f.name]) is Literal}
    assert literal == set(choices)
    for name, accepted in choices.items():
        assert get_args(hints[name]) == accepted, name
        default = getattr(TrainSpec(global_batch=8), name)
        assert default in accepted
        with pytest.raises(MeshConfigError, match=f"{name}='x'; accepted: {', '.join(accepted)}"):
            TrainSpec(global_batch=8, **{name: "x"})
    docs = field_docs()
    assert set(docs) == {f.name for f in fields(TrainSpec)}  # a field without a docstring fails
    assert all(len(text) > 20 and "\n" not in text for text in docs.values())
    assert "bfloat16" in docs["opt_state_dtype"] and "non-negative" in docs["pipeline_layers"]
