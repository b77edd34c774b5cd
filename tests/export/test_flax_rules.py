"""Flax logical axis rules from a plan: the table, and a linen model sharded with them on a
planned 8-device mesh training to the single-device losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes, roles, stages_of
from loadax_mesh.workload.stages import STAGED, staged_shapes


def test_rules_follow_the_roles_of_the_plan_axes() -> None:
    plan = MeshConfig.from_preset("fsdp_tp").plan(simulate_devices("tpu-v5p-128"))
    rules = dict(plan.to_flax_rules())
    assert rules == {
        "batch": ("data", "fsdp") if plan.shape["data"] > 1 else "fsdp",
        "length": None,
        "embed": "fsdp",
        "heads": "model",
        "kv_heads": "model",
        "kv": None,
        "mlp": "model",
        "vocab": "model",
        "exp": None,
        "embed_no_exp": "fsdp",
        "stage": None,
    }
    sp = MeshConfig.from_preset("dp_sp").plan(simulate_devices("tpu-v5litepod-8"))
    rules = dict(sp.to_flax_rules())
    assert rules["batch"] == "data_parallel" and rules["length"] == "sequence_parallel"
    # context parallelism shards the weights as fsdp does (docs/design.md section 14)
    assert rules["embed"] == "sequence_parallel" and rules["mlp"] is None


def test_an_axis_with_no_logical_meaning_is_refused() -> None:
    config = MeshConfig((2, 4), ("data", "stage"), "data")
    plan = config.plan(simulate_devices("cpu-8"))
    with pytest.raises(MeshConfigError, match=r"'stage' .size 4. shards no logical axis"):
        plan.to_flax_rules()


class _MLP(nn.Module):
    """A tiny LM-shaped model: embed, a SwiGLU-free MLP with logical axes, unembed."""

    vocab: int = 32
    d: int = 16
    f: int = 32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        init = nn.initializers.normal(0.2)
        emb = self.param(
            "embed", nn.with_logical_partitioning(init, ("vocab", "embed")), (self.vocab, self.d)
        )
        x = nn.with_logical_constraint(emb[tokens], ("batch", "length", "embed"))
        w_in = self.param(
            "w_in", nn.with_logical_partitioning(init, ("embed", "mlp")), (self.d, self.f)
        )
        w_out = self.param(
            "w_out", nn.with_logical_partitioning(init, ("mlp", "embed")), (self.f, self.d)
        )
        h = nn.with_logical_constraint(jax.nn.relu(x @ w_in), ("batch", "length", "mlp"))
        x = x + h @ w_out
        unembed = self.param(
            "unembed", nn.with_logical_partitioning(init, ("embed", "vocab")), (self.d, self.vocab)
        )
        return nn.with_logical_constraint(x @ unembed, ("batch", "length", "vocab"))


def _train(mesh: jax.sharding.Mesh | None, rules: tuple, steps: int = 4) -> list[float]:
    model = _MLP()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (8, 8)), jnp.int32)

    def loss_fn(params: dict, batch: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, batch[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, batch[:, 1:, None], axis=-1).mean()

    @jax.jit
    def step(params: dict, batch: jax.Array) -> tuple[dict, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss

    with nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(model.init, jax.random.key(0), tokens)
        specs = nn.get_partition_spec(abstract)["params"]
        params = nn.unbox(model.init(jax.random.key(0), tokens))["params"]
        if mesh is not None:
            shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
            params = jax.device_put(params, shardings)
            batch_sharding = nn.logical_to_mesh_sharding(
                jax.sharding.PartitionSpec("batch", None), mesh, rules
            )
            tokens = jax.device_put(tokens, batch_sharding)
        losses = []
        for _ in range(steps):
            if mesh is None:
                params, loss = step(params, tokens)
            else:
                with jax.set_mesh(mesh):
                    params, loss = step(params, tokens)
            losses.append(float(loss))
    if mesh is not None:  # the weights really are sharded over the plan's axes
        assert params["w_in"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "model")
        assert len(params["w_in"].addressable_shards[0].data.reshape(-1)) == 16 * 32 // 8
    return losses


@pytest.mark.slow
def test_a_linen_model_sharded_by_the_rules_trains_to_the_single_device_losses() -> None:
    plan = MeshConfig((1, 4, 2), ("data", "fsdp", "model"), ("data", "fsdp")).plan(jax.devices())
    rules = plan.to_flax_rules()
    sharded = _train(plan.to_jax_mesh(), rules)
    single = _train(None, rules)
    assert sharded[-1] < sharded[0]  # it trains
    np.testing.assert_allclose(sharded, single, rtol=2e-5)


def test_the_expert_dim_goes_to_the_expert_axis_and_their_d_model_to_fsdp() -> None:
    ep = dict(
        MeshConfig.from_preset("fsdp_ep").plan(simulate_devices("tpu-v5p-128")).to_flax_rules()
    )
    assert ep["exp"] == "expert" and ep["embed_no_exp"] == "fsdp"
    assert ep["embed"] == ("fsdp", "expert") and ep["batch"] == ("fsdp", "expert")
    fsdp = dict(
        MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-128")).to_flax_rules()
    )
    assert fsdp["exp"] is None and fsdp["embed_no_exp"] == "fsdp" and fsdp["embed"] == "fsdp"


@pytest.mark.parametrize("hardware", ["tpu-v5p-128", "tpu-v5p-128-2"])
def test_the_stage_dim_of_pipelined_weights_goes_to_the_pipeline_axis(hardware: str) -> None:
    """On a pipelined plan (pipeline 4 x fsdp x tensor 2; on two slices the pipeline axis
    crosses them) every weight of the step, its pipelined layers in the stage layout, gets
    from the rules through Flax the PartitionSpec the step gives it."""
    devices = simulate_devices(hardware)
    config = MeshConfig((4, len(devices) // 8, 2), ("pipeline", "fsdp", "model"), ("fsdp",))
    plan = config.plan(devices, selector=hardware)
    rules = plan.to_flax_rules()
    assert dict(rules)["stage"] == "pipeline" and dict(rules)["batch"] == "fsdp"
    model = ModelSpec.from_name("llama3-8b")
    r = roles(tuple(plan.shape.items()), plan.batch_axis_names)
    st = stages_of(model, TrainSpec(global_batch=256, pipeline_repeats=2), r)
    assert st is not None and (st.stages, st.repeats, st.per_chunk) == (4, 2, 4)
    shapes = staged_shapes(param_shapes(model), st)
    staged = [name for name in shapes if name.startswith(STAGED)]
    assert staged and not any(name.startswith("layers/") for name in shapes)
    for name, (_, logical) in shapes.items():
        ours = jax.sharding.PartitionSpec(*r.mesh_axes(logical))
        assert nn.logical_to_mesh_axes(logical, rules) == ours, name
    _, logical = shapes[staged[0]]
    assert nn.logical_to_mesh_axes(logical, rules)[1] == "pipeline"
