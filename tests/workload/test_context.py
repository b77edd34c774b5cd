"""Context parallelism on the `seq` axis (docs/design.md section 14): the load-balanced order
(2 x seq chunks, device i holding chunks i and 2 seq - 1 - i), masks from positions, 8 CPU
devices training to one device's losses with context_strategy "all_gather", balanced or not,
with and without a window, and with "ring"; a sequence the chunks do not divide is refused
naming seq_len and the axis."""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.attention import allowed
from loadax_mesh.workload.context import chunk_order, token_positions
from loadax_mesh.workload.layout import roles
from loadax_mesh.workload.splash import _contiguous_chunks, _mask
from loadax_mesh.workload.step import make_step

from .losses import TINY, train_losses
from .test_windows import LOCAL_GLOBAL

# data 2 x seq 4: each device holds 32 of the 128 tokens, in two chunks of 16 when balanced;
# fsdp 2 x model 2 x seq 2: the sequence axis beside the weights' and heads' axes.
MESHES = {
    "data2-seq4": ((2, 4), ("data", "seq"), ("data",)),
    "fsdp2-model2-seq2": ((2, 2, 2), ("fsdp", "model", "seq"), ("fsdp",)),
}


def _roles(seq: int):
    return roles((("data", 8 // seq), ("seq", seq)), ("data",))


def test_the_balanced_order_gives_device_i_chunks_i_and_its_mirror():
    assert chunk_order(2) == (0, 3, 1, 2)
    assert chunk_order(4) == (0, 7, 1, 6, 2, 5, 3, 4)
    at = token_positions(16, TrainSpec(global_batch=8), _roles(2))
    # MaxText's docstring example, in chunks of 4: [0,1,2,3,4,5,6,7] -> [0,1,6,7,2,3,4,5]
    assert at.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    unbalanced = TrainSpec(global_batch=8, context_load_balance=False)
    assert token_positions(16, unbalanced, _roles(2)) is None
    assert token_positions(16, TrainSpec(global_batch=8), _roles(1)) is None


def test_balanced_shards_see_as_many_keys_each():
    """The causal pairs each of 4 devices' queries keep: equal under the balanced order; in the
    contiguous order shard r keeps r T^2 + T (T + 1) / 2 of them (T = 16 queries a shard)."""
    s, c = 64, 4
    at = token_positions(s, TrainSpec(global_batch=8), _roles(c))
    seen = np.asarray(allowed(at, np.arange(s), 0)).reshape(c, s // c, s).sum(axis=(1, 2))
    assert len(set(seen.tolist())) == 1
    contiguous = np.asarray(allowed(np.arange(s), np.arange(s), 0))
    per = contiguous.reshape(c, s // c, s).sum(axis=(1, 2))
    t = s // c
    assert per.tolist() == [r * t * t + t * (t + 1) // 2 for r in range(c)]


@pytest.mark.parametrize("window", [0, 16])
def test_splash_masks_follow_the_permuted_query_positions(window):
    """The TPU kernel's lazy mask rows at each slot's position, its keys contiguous once the
    gathered chunks are put back in order: what `allowed` says the slot's query sees."""
    at = token_positions(128, TrainSpec(global_batch=8), _roles(4))
    mask = _mask(128, 2, window, at).masks[0]
    np.testing.assert_array_equal(mask[:, :], np.asarray(allowed(at, np.arange(128), window)))
    chunks = _contiguous_chunks(at)
    assert np.concatenate([at[a:b] for a, b in chunks]).tolist() == list(range(128))


@pytest.mark.parametrize(
    ("seq_len", "balance", "message"),
    [
        (
            120,
            True,
            r"model 'tiny': seq_len=120 does not divide over the seq axis 'seq' of size 8 "
            r"\(context_load_balance=True cuts it into 2 x 8 chunks\); accepted: a seq_len "
            r"that is a multiple of 16, or context_load_balance=False",
        ),
        (
            100,
            False,
            r"model 'tiny': seq_len=100 does not divide over the seq axis 'seq' of size 8 "
            r"\(8 chunks, one a device\); accepted: a seq_len that is a multiple of 8$",
        ),
    ],
)
def test_a_sequence_the_chunks_do_not_divide_is_refused(seq_len, balance, message):
    mesh = MeshConfig((1, 8), ("data", "seq")).create_device_mesh()
    train = TrainSpec(global_batch=8, context_load_balance=balance)
    with pytest.raises(MeshConfigError, match=message):
        make_step(mesh, replace(TINY, seq_len=seq_len), train, batch_axes="data")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("balance", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("model", [TINY, LOCAL_GLOBAL], ids=["global", "window"])
def test_all_gather_trains_like_one_device(mesh, balance, model):
    shape, names, batch = MESHES[mesh]
    plan = MeshConfig(shape, names, batch_axis_names=batch).plan()
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    spec = {"compute_dtype": "float32", "context_load_balance": balance}
    got = train_losses(plan, batch_axes=batch, model=model, **spec)
    want = train_losses(single, batch_axes=("data",), model=model, **spec)
    # Measured: float32 spread against one device below 1e-6 over four steps.
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (np.diff(got) < 0).all(), got


@pytest.mark.slow
@pytest.mark.parametrize("model", [TINY, LOCAL_GLOBAL], ids=["global", "window"])
def test_all_gather_on_the_plain_path_trains_like_one_device(model):
    shape, names, batch = MESHES["data2-seq4"]
    plan = MeshConfig(shape, names, batch_axis_names=batch).plan()
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    spec = {"compute_dtype": "float32", "attention": "plain"}
    got = train_losses(plan, batch_axes=batch, model=model, **spec)
    np.testing.assert_allclose(
        got, train_losses(single, batch_axes=("data",), model=model, **spec), rtol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("balance", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("model", [TINY, LOCAL_GLOBAL], ids=["global", "window"])
def test_the_ring_trains_like_one_device(balance, model):
    """context_strategy "ring" (workload/ring.py: key and value blocks round the seq axis) in
    the whole step, 8 CPU devices against one."""
    shape, names, batch = MESHES["data2-seq4"]
    plan = MeshConfig(shape, names, batch_axis_names=batch).plan()
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    spec = {"compute_dtype": "float32", "context_load_balance": balance}
    got = train_losses(plan, batch_axes=batch, model=model, context_strategy="ring", **spec)
    want = train_losses(single, batch_axes=("data",), model=model, **spec)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (np.diff(got) < 0).all(), got


# -- the seq axis shards the model as fsdp does ---------------------------------------------


def test_the_seq_axis_shards_weights_and_moments_as_fsdp_does():
    """Every weight's d_model dim over fsdp and seq (MaxText's context axis, torchtitan's
    dp_shard x cp): context parallelism does not replicate the model."""
    mesh = MeshConfig((2, 4), ("fsdp", "seq"), batch_axis_names=("fsdp",)).create_device_mesh()
    step = make_step(mesh, TINY, TrainSpec(global_batch=8), batch_axes="fsdp")
    for name, (_, axes) in step.shapes.items():
        spec = step.param_shardings[name].spec
        assert step.opt_shardings[name].spec == spec
        want = tuple(("fsdp", "seq") if a == "embed" else None for a in axes)
        assert tuple(spec) == want, (name, spec)
    assert step.roles.weight_axes == ("fsdp", "seq")
    # a seq axis of size 1 shards nothing
    one = MeshConfig((8, 1), ("fsdp", "seq"), batch_axis_names=("fsdp",)).create_device_mesh()
    flat = make_step(one, TINY, TrainSpec(global_batch=8), batch_axes="fsdp")
    assert tuple(flat.param_shardings["layers/wq"].spec) == (None, "fsdp", None, None)


def test_a_d_model_the_fsdp_and_seq_axes_do_not_divide_is_refused():
    mesh = MeshConfig((2, 4), ("fsdp", "seq"), batch_axis_names=("fsdp",)).create_device_mesh()
    with pytest.raises(
        MeshConfigError,
        match=r"model 'tiny': d_model=132 does not divide over the fsdp, seq and expert axes "
        r"together \(8 shards: 'fsdp' 2 x 'seq' 4\), which shard the weights' d_model; "
        r"accepted: axes whose sizes' product divides d_model",
    ):
        make_step(mesh, replace(TINY, d_model=132), TrainSpec(global_batch=8), batch_axes="fsdp")
