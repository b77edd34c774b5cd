"""Multi-head latent attention in the reference step: a tiny DeepSeek-style model (MLA, a dense
layer then MoE layers with a shared expert and a sigmoid router) trains on 8 CPU devices to the
losses of one device; its stacks hold every parameter; what does not divide is refused."""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes, roles
from loadax_mesh.workload.step import make_step

from .losses import TINY, train_losses

# DeepSeek-V3's form in miniature: 8 heads, q through a rank-32 bottleneck, k and v through a
# rank-16 one, heads of 16 nope + 8 rope dims, values 16 wide; one dense layer, then MoE layers
# of 8 experts (2 a token, their sum scaled by 2.5) beside a shared one.
MLA = replace(
    TINY,
    name="tiny-mla",
    num_layers=3,
    num_kv_heads=8,
    head_dim=24,
    attention="mla",
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    num_experts=8,
    experts_per_token=2,
    moe_d_ff=64,
    first_dense_layers=1,
    num_shared_experts=1,
    router="sigmoid",
    routed_scaling=2.5,
)


@pytest.fixture(scope="module")
def single():
    return MeshConfig((1,), ("data",)).plan(jax.devices()[:1])


def train(p, model):
    return train_losses(p, batch_axes=p.batch_axis_names, model=model, compute_dtype="float32")


def test_latent_attention_stacks_hold_every_parameter():
    for model in (MLA, replace(MLA, q_lora_rank=0), ModelSpec.from_name("deepseek-v3")):
        shapes = param_shapes(model)
        assert sum(int(np.prod(s)) for s, _ in shapes.values()) == model.num_params
    shapes = param_shapes(MLA)
    assert shapes["moe_layers/wkv_a"] == ((2, 128, 16 + 8), (None, "embed", None))
    assert shapes["layers/wq_b"] == ((1, 32, 8, 24), (None, "lora", "heads", None))
    assert shapes["moe_layers/wo"][0] == (2, 8, 16, 128)
    assert "layers/wq" in param_shapes(replace(MLA, q_lora_rank=0))


def test_experts_shard_their_d_model_over_fsdp_with_or_without_an_expert_axis():
    """MaxText's default layout (its DeepSeek-V3 recipe: 256 experts over fsdp 512): the
    experts' d_model over fsdp, their expert dim over the expert axis alone."""
    r = roles((("fsdp", 8),), ("fsdp",))
    assert r.mesh_axes(("exp", "embed_no_exp", "mlp")) == (None, "fsdp", None)
    ep = roles((("fsdp", 2), ("expert", 4)), ("fsdp", "expert"))
    assert ep.mesh_axes(("exp", "embed_no_exp", "mlp")) == ("expert", "fsdp", None)


def test_the_ranks_shard_as_d_model_and_the_heads_over_the_tensor_axis():
    r = roles((("fsdp", 2), ("expert", 2), ("model", 2)), ("fsdp", "expert"))
    assert r.mesh_axes(("lora", "heads", None)) == (("fsdp", "expert"), "model", None)
    assert r.mesh_axes(("embed", None)) == (("fsdp", "expert"), None)


# Measured spread against one device over four float32 steps: below 3e-6. Over a tensor axis
# the routed sum unscaled: scaled by 2.5 the learned router's choices flip by the third step
# under the tensor axis's reordered sums (6e-4; 2e-5 with balanced routing).
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "shape", "names"),
    [
        (MLA, (2, 4), ("fsdp", "expert")),
        (MLA, (8,), ("fsdp",)),
        (
            replace(MLA, q_lora_rank=0, routed_scaling=1.0),
            (2, 2, 2),
            ("fsdp", "expert", "model"),
        ),
        (replace(MLA, num_experts=4), (8,), ("fsdp",)),
    ],
    ids=["fsdp2-ep4", "fsdp8", "full-rank-q-tp2", "fsdp8-experts-by-d-model"],
)
def test_latent_attention_trains_on_eight_devices_like_one(single, model, shape, names):
    batch = tuple(n for n in names if n != "model")
    sharded = MeshConfig(shape, names, batch_axis_names=batch).plan()
    assert sharded.devices.size == 8
    losses = train(sharded, model)
    # float32 sums in another order across 8 devices: up to 1.5e-5 (relative) on this CPU by
    # the fourth step, at ec3d4dd too; a wrong gradient moves the loss by far more
    np.testing.assert_allclose(losses, train(single, model), rtol=1e-4)
    assert (np.diff(losses) < 0).all(), losses


@pytest.mark.parametrize(
    ("field", "value", "shards"),
    [("kv_lora_rank", 12, 8), ("q_lora_rank", 36, 8)],
)
def test_ranks_that_do_not_divide_over_fsdp_are_refused(field, value, shards):
    mesh = MeshConfig((2, 4), ("fsdp", "expert"), batch_axis_names=("fsdp", "expert"))
    mesh = mesh.create_device_mesh()
    model = replace(MLA, **{field: value})
    with pytest.raises(
        MeshConfigError,
        match=f"{field}={value} does not divide over the fsdp, seq and expert axes together "
        f"\\({shards} shards: 'fsdp' 2 x 'expert' 4\\), which shard the weights' d_model; "
        f"accepted: axes whose sizes' product divides {field}",
    ):
        make_step(mesh, model, TrainSpec(global_batch=8), batch_axes=("fsdp", "expert"))
