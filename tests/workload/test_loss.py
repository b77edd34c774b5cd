"""The cross-entropy over logits cut by vocabulary (workload/loss.py `split_cross_entropy`, the
1F1B head's): every device's loss and every slice's gradient are those of the whole logits,
with the table padded to a multiple of the devices (the padding's columns take no part)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from loadax_mesh.workload.loss import VocabSplit, cross_entropy, split_cross_entropy


@pytest.mark.parametrize(("devices", "vocab"), [(2, 10), (4, 10), (8, 5)])
def test_a_vocabulary_cut_over_devices_gives_the_whole_logits_loss_and_gradients(devices, vocab):
    mesh = jax.make_mesh((devices,), ("v",), axis_types=(AxisType.Auto,))
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (4, 8, 16))
    table = jax.random.normal(keys[1], (16, vocab))
    targets = jax.random.randint(keys[2], (4, 8), 0, vocab)
    width = -(-vocab // devices)  # 8 devices over 5 columns: three hold padding alone
    padded = jnp.pad(table, ((0, 0), (0, width * devices - vocab)))

    def whole(x, table):
        return jnp.mean(cross_entropy(jnp.einsum("bsd,dv->bsv", x, table), targets))

    def mine(x, table):
        offset = jax.lax.axis_index("v") * width
        logits = jnp.einsum("bsd,dv->bsv", x, table)
        split = VocabSplit("v", offset, vocab)
        return jnp.mean(split_cross_entropy(logits, targets, split=split))

    def cut(x, table):
        loss, (dx, dtable) = jax.value_and_grad(mine, argnums=(0, 1))(x, table)
        return loss[None], jax.lax.psum(dx, "v"), dtable

    losses, dx, dtable = jax.jit(
        jax.shard_map(
            cut,
            mesh=mesh,
            in_specs=(P(), P(None, "v")),
            out_specs=(P("v"), P(), P(None, "v")),
            check_vma=False,
        )
    )(x, padded)
    loss, (want_dx, want_dtable) = jax.value_and_grad(whole, argnums=(0, 1))(x, table)
    np.testing.assert_allclose(losses, np.full(devices, loss), rtol=1e-6)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dtable[:, :vocab], want_dtable, rtol=1e-5, atol=1e-7)
    assert not np.asarray(dtable[:, vocab:]).any()  # the padding gets no gradient
