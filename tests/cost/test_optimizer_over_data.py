"""ZeRO-1 in the cost model and the MaxText export (TrainSpec.optimizer_over_data, docs/design.md
section 16): the optimizer term cut over the data axis, the gradients reduce-scattered there and
the updated parameters gathered once a step."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec

HSDP = ("data", "fsdp")


def _plan(hardware: str = "tpu-v5p-128", shape=(8, 8)):
    config = MeshConfig(shape, HSDP, batch_axis_names=HSDP)
    return config.plan(simulate_devices(hardware), selector=hardware)


def _estimates(model: str = "llama3-8b", **fields):
    plan, model_spec = _plan(), ModelSpec.from_name(model)
    return tuple(
        estimate(plan, model_spec, TrainSpec(global_batch=64, optimizer_over_data=z, **fields))
        for z in (False, True)
    )


def test_zero1_on_data_8_saves_seven_eighths_of_the_optimizer_term():
    plain, zero1 = _estimates()
    assert zero1.terms["optimizer"] == pytest.approx(plain.terms["optimizer"] / 8, rel=0.01)
    saved = plain.terms["optimizer"] - zero1.terms["optimizer"]
    assert plain.memory_bytes - zero1.memory_bytes == pytest.approx(saved, rel=1e-6)
    for name in ("params", "gradients"):
        assert zero1.terms[name] == plain.terms[name]


def test_zero1_reduce_scatters_the_gradients_and_gathers_the_parameters_over_data():
    plain, zero1 = _estimates()

    def data(est):
        return {(c.kind, c.what) for c in est.axes["data"].collectives}

    assert ("all-reduce", "layer weight gradients") in data(plain)
    assert ("reduce-scatter", "layer weight gradients") in data(zero1)
    assert ("all-gather", "updated parameters") in data(zero1)
    assert not any(kind == "all-reduce" for kind, _ in data(zero1))


def test_zero1_beside_a_pipeline_cuts_the_stage_optimizer_over_data():
    config = MeshConfig((2, 4, 8), ("pipeline", "data", "fsdp"), batch_axis_names=HSDP)
    plan = config.plan(simulate_devices("tpu-v5p-128"), selector="tpu-v5p-128")
    model = ModelSpec.from_name("llama3-8b")
    plain, zero1 = (
        estimate(plan, model, TrainSpec(global_batch=64, optimizer_over_data=z))
        for z in (False, True)
    )
    assert zero1.pipeline is not None
    assert zero1.terms["optimizer"] == pytest.approx(plain.terms["optimizer"] / 4, rel=0.01)


def test_the_maxtext_export_says_shard_optimizer_over_data():
    train = TrainSpec(global_batch=64, optimizer_over_data=True)
    exported = _plan().to_maxtext(train)
    assert exported.keys["shard_optimizer_over_data"] == "true"
    assert any("shard_optimizer_over_data" in n for n in exported.notes)
    assert "shard_optimizer_over_data" not in _plan().to_maxtext(TrainSpec(global_batch=64)).keys


def test_an_fsdp_plan_refuses_zero1_by_name():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-128"))
    with pytest.raises(MeshConfigError, match="optimizer_over_data=True: the plan has no data"):
        estimate(plan, ModelSpec.from_name("llama3-8b"),
                 TrainSpec(global_batch=64, optimizer_over_data=True))  # fmt: skip


def test_the_chooser_keeps_zero1_where_a_mesh_has_a_data_axis_and_drops_it_elsewhere():
    """ZeRO-1 asks the optimizer sharded over data; a mesh without a data axis already shards
    it as the parameters, so the search prices it there without the field, not refused."""
    from loadax_mesh.cost import choose_mesh

    ranking = choose_mesh(
        "tpu-v5p-128", "llama3-8b", TrainSpec(global_batch=256, optimizer_over_data=True)
    )
    seen = {c.train.optimizer_over_data: c for c in ranking}
    assert set(seen) == {True, False}
    for c in ranking:
        assert c.train.optimizer_over_data == (c.plan.shape.get("data", 1) > 1), c.plan.shape
