"""The reference training step in plain jax: a decoder-only LM (docs/design.md section 7).

Embedding (one table for the logits too when tied), RMSNorm, grouped-query attention (or DeepSeek's
multi-head latent attention) with a causal mask and rotary positions, an MLP (SwiGLU, or two
matrices with ReLU or GELU between), one after the other or as a parallel block (both off one
norm, their outputs summed), layers under `lax.scan` with a remat policy, cross-entropy in
float32, Adam, and the recipe of TrainSpec: each named tensor of a layer recomputed, saved on the
device or offloaded to host memory; gradients accumulated over micro-batches; the loss over chunks.
Parameters, Adam moments and activations are sharded by the logical rules of `layout`. Inputs can
be `jax.ShapeDtypeStruct`s (to compile for thousands of devices without allocating) or real arrays
(to train on this machine's devices).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..hardware.traits import platform_traits
from . import quantized
from .attention import attention, rotary, rotate
from .context import reordered, token_positions
from .kernels import traced_for
from .layout import Roles, check_fit, param_shapes, regathered, roles
from .loss import VocabSplit, cross_entropy_loss
from .mla import latent_qkv
from .mla import rms_norm as _rms_norm
from .moe import moe_mlp
from .optimizer import adam, initial_state, moment_shardings
from .pipeline import decoder, leading, staged
from .pipeline_1f1b import pipelined_loss
from .remat import _regathered_projection, stage_policy
from .remat import remat_policy as remat_policy
from .spec import ModelSpec, TrainSpec
from .stages import STAGED, Stages, check_windows, staged_shapes

Params = dict[str, Any]
# A two-matrix MLP's activation (jax's GELU is the tanh approximation, as flax's and MaxText's).
_ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}


@dataclass(frozen=True, eq=False)
class Step:
    """The step for one mesh, model and train spec: `fn(params, opt_state, batch)` returns the
    new params and optimizer state (both donated) and the loss."""

    mesh: Mesh
    model: ModelSpec
    train: TrainSpec
    roles: Roles
    # The projections (query, key, value) whose backward pass gathers the weight again
    # (`layout.regathered`).
    regathered: tuple[str, ...] = ()
    # The pipeline over the `pipeline` axis (stages.py); `roles` then run it as a batch axis
    # outside the pipelined layers.
    stages: Stages | None = None

    def spec(self, logical: tuple[str | None, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, P(*self.roles.mesh_axes(logical)))

    @cached_property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
        """Every parameter's shape and logical axes (pipelined layers in the stage layout)."""
        shapes = param_shapes(self.model)
        return shapes if self.stages is None else staged_shapes(shapes, self.stages)

    @cached_property
    def param_shardings(self) -> Params:
        return {k: self.spec(axes) for k, (_, axes) in self.shapes.items()}

    @cached_property
    def opt_shardings(self) -> Params:
        """Adam's moments' shardings (optimizer.py: the parameters', cut over data too under
        ZeRO-1)."""
        return moment_shardings(
            self.mesh, self.roles, self.shapes, self.train, self.param_shardings
        )

    @cached_property
    def batch_sharding(self) -> NamedSharding:
        """The batch over the plan's batch axes (a pipeline axis splits it inside the step)."""
        return self._stage.spec(("batch", "seq"))

    def abstract_args(self) -> tuple[Any, Any, Any]:
        """ShapeDtypeStructs (with shardings) for params, optimizer state and a batch."""
        shapes = self.shapes
        pdt, odt = jnp.dtype(self.train.param_dtype), jnp.dtype(self.train.opt_state_dtype)

        def tree(dtype: Any, shardings: Params) -> Params:
            return {
                k: jax.ShapeDtypeStruct(s, dtype, sharding=shardings[k])
                for k, (s, _) in shapes.items()
            }

        count = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(self.mesh, P()))
        tokens = jax.ShapeDtypeStruct(
            (self.train.global_batch, self.model.seq_len), jnp.int32, sharding=self.batch_sharding
        )
        return (
            tree(pdt, self.param_shardings),
            {
                "m": tree(odt, self.opt_shardings),
                "v": tree(odt, self.opt_shardings),
                "count": count,
            },
            {
                "tokens": tokens,
                "targets": tokens,
            },
        )

    @cached_property
    def fn(self) -> Any:
        """The jitted step (params and optimizer state donated); `fn.lower(*abstract_args())`
        compiles it ahead of time."""
        params, opt, batch = self.abstract_args()
        shardings = jax.tree.map(lambda s: s.sharding, (params, opt, batch))
        replicated = NamedSharding(self.mesh, P())

        def step(params: Params, opt: Params, batch: Params) -> tuple[Params, Params, Any]:
            with traced_for(self.mesh):  # the platform's kernels built for the mesh's devices
                return self._step(params, opt, batch)

        return jax.jit(
            step,
            in_shardings=shardings,
            out_shardings=(shardings[0], shardings[1], replicated),
            donate_argnums=(0, 1),
        )

    def init(self, key: jax.Array) -> tuple[Params, Params]:
        """Real, sharded parameters (scaled normal; norms 1) and a zero optimizer state; with
        pipeline stages, the values of the step without them, in the stage layout."""
        params, opt, _ = self.abstract_args()
        shardings = jax.tree.map(lambda a: a.sharding, (params, opt))
        return initial_state(self.model, self.train, self.stages, opt["m"], shardings, key)

    # -- the computation ----------------------------------------------------------------------

    def _step(self, params: Params, opt: Params, batch: Params) -> tuple[Params, Params, Any]:
        loss, grads = self._gradients(params, batch)
        new, opt = adam(
            params, opt, grads, train=self.train, moments=self.opt_shardings,
            shardings=self.param_shardings,
        )  # fmt: skip
        return new, opt, loss

    def _gradients(self, params: Params, batch: Params) -> tuple[jax.Array, Params]:
        """Loss and gradients of the step's batch; with `microbatches` M > 1, a scan over M
        slices of it with the gradients summed in float32 (the mean over slices of equal
        size is the batch's mean). Each device keeps its own rows: row i of a device's block
        goes to micro-batch i % M, so slicing moves no data between devices."""
        m = self.train.microbatches
        if m == 1:
            return jax.value_and_grad(self.loss)(params, batch)
        split = self.spec((None, "batch", "seq"))

        def slices(a: jax.Array) -> jax.Array:
            b, s = a.shape
            return jax.lax.with_sharding_constraint(
                jnp.moveaxis(a.reshape(b // m, m, s), 1, 0), split
            )

        f32 = {k: NamedSharding(self.mesh, v.spec) for k, v in self.param_shardings.items()}

        def one(carry: tuple[jax.Array, Params], micro: Params) -> tuple[Any, None]:
            total, acc = carry
            loss, grads = jax.value_and_grad(self.loss)(params, micro)
            acc = {
                k: jax.lax.with_sharding_constraint(acc[k] + g.astype(jnp.float32), f32[k])
                for k, g in grads.items()
            }
            return (total + loss, acc), None

        zeros = {
            k: jax.lax.with_sharding_constraint(jnp.zeros(p.shape, jnp.float32), f32[k])
            for k, p in params.items()
        }
        micro = {k: slices(v) for k, v in batch.items()}
        (total, acc), _ = jax.lax.scan(one, (jnp.zeros((), jnp.float32), zeros), micro)
        grads = {k: (g / m).astype(params[k].dtype) for k, g in acc.items()}
        return total / m, grads

    @cached_property
    def positions(self) -> Any:
        """Each token slot's position in the sequence, in the order the step holds it
        (context.py: load-balanced over a `seq` axis), or None: the sequence's own order."""
        return token_positions(self.model.seq_len, self.train, self.roles)

    def loss(self, params: Params, batch: Params) -> jax.Array:
        """Mean next-token cross-entropy (float32) over the batch (its tokens and targets in
        the sequence's order; over a `seq` axis the step permutes them into its own first)."""
        batch = reordered(batch, self.positions)
        cdt = jnp.dtype(self.train.compute_dtype)
        act, whole = self.spec(("batch", "seq", "hidden")), self.spec(("batch", "seq", None))
        # The table gathered over FSDP first: the lookup's output then comes out sharded by
        # batch, and its gradient is reduce-scattered back, as for every other weight.
        table = jax.lax.with_sharding_constraint(
            params["embed"].astype(cdt), self.spec(("vocab", None))
        )
        x = jnp.take(table, batch["tokens"], axis=0)
        # whole rows first, then each device keeps its slice of the hidden dim (no all-to-all)
        x = jax.lax.with_sharding_constraint(jax.lax.with_sharding_constraint(x, whole), act)
        stage = self._stage  # the layer with the roles of a pipeline stage (pipeline.py)
        stage_act = stage.spec(("batch", "seq", "hidden"))
        if self.stages is not None and self.stages.schedule == "1f1b":
            return self._one_f_one_b(x, params, batch["targets"], stage_act)
        x = decoder(
            x,
            params,
            model=self.model,
            stages=self.stages,
            layer=partial(self._checkpointed, act),
            stage_layer=partial(stage._layer, act=stage_act, window=self._stage_window),
            policy=stage_policy(self.train),
            mesh=self.mesh,
            act=act,
            stage_act=stage_act,
        )
        return self._head(x, params, batch["targets"])

    def _head(
        self, x: jax.Array, params: Params, targets: jax.Array, split: VocabSplit | None = None
    ) -> jax.Array:
        """The loss of the final hidden states `x`: the final norm, the logits (the tied table's
        or the unembedding's; `split`: this device's columns), the mean cross-entropy."""
        x = _rms_norm(x, params["final_norm"])
        unembed = params["embed"].T if self.model.tied_embeddings else params["unembed"]
        return cross_entropy_loss(
            x,
            unembed.astype(jnp.dtype(self.train.compute_dtype)),
            targets,
            chunks=self.train.logits_chunks,
            logits_sharding=self.spec(("batch", "seq", "vocab")),
            chunk_sharding=(
                self.spec((None, "batch", "seq", None)),
                self.spec((None, "batch", "seq")),
            ),
            split=split,
        )

    def _one_f_one_b(
        self, x: jax.Array, params: Params, targets: jax.Array, stage_act: NamedSharding
    ) -> jax.Array:
        """The loss under the 1F1B schedule from the embedded tokens `x`: the layers before
        the pipelined ones as the step's, then the pipelined ones and the head together
        (pipeline_1f1b.py), the head with a stage's roles."""
        st, stage = self.stages, self._stage
        assert st is not None
        layer = partial(self._checkpointed, self.spec(("batch", "seq", "hidden")))
        x = leading(layer, x, params, model=self.model, stages=st)
        table = ("embed", 0) if self.model.tied_embeddings else ("unembed", 1)
        head_names = ("final_norm", table[0])
        weights = staged(params)
        sh = self.param_shardings
        return pipelined_loss(
            x,
            targets,
            weights,
            {k: params[k] for k in head_names},
            st=st,
            mesh=self.mesh,
            act=stage_act,
            layer=partial(stage._layer, act=stage_act, window=self._stage_window),
            loss=stage._head,
            table=table,
            shardings=(
                {k: sh[STAGED + k] for k in weights},
                {k: sh[k] for k in head_names},
            ),
        )

    @cached_property
    def _stage(self) -> Step:
        """This step with the roles inside a pipeline stage: the pipeline axis no batch axis."""
        r = self.roles
        return replace(self, roles=replace(r, batch=tuple(a for a in r.batch if a != r.pipeline)))

    @property
    def _rotary_at(self) -> Any:
        """Where rotary positions are taken: each slot's position, or the sequence length."""
        return self.model.seq_len if self.positions is None else self.positions

    @cached_property
    def _stage_window(self) -> int:
        """The window of the pipelined layers (all alike: `stages.pipeline_stages`)."""
        return self.model.window(self.model.num_layers - 1)

    def _checkpointed(self, act: NamedSharding, window: int = 0) -> Callable[..., Any]:
        """The layer over `window` (0: global), its activations in `act`, under the recipe's
        checkpoint policy."""
        layer: Callable[..., Any] = partial(self._layer, act=act, window=window)
        policy = remat_policy(self.train)
        return layer if policy is None else jax.checkpoint(layer, policy=policy)

    def _layer(
        self, x: jax.Array, p: Params, *, act: NamedSharding, window: int = 0
    ) -> tuple[jax.Array, None]:
        # The layer's input named inside the checkpointed function: a policy may then offload
        # it (MaxText's decoder_layer_input); everything below reads the named value.
        x = checkpoint_name(x, "layer_input")
        h = _rms_norm(x, p["attn_norm"])
        if self.model.parallel_block:
            # Both halves read h; their outputs are summed into the residual. The MLP is written
            # first so that the backward pass adds the attention's partial gradients of h (q, k
            # and v) before the MLP's: libtpu then reduces the three over the tensor axis in one
            # collective, as in a sequential layer (attention first: one each;
            # docs/notes/2026-11-26-maxtext-2023-parallel-block.md).
            down = self._mlp(h, p)
            out = self._attention(h, p, window) + down
            return jax.lax.with_sharding_constraint(x + out, act), None
        x = jax.lax.with_sharding_constraint(x + self._attention(h, p, window), act)
        h = _rms_norm(x, p["mlp_norm"])
        if "router" in p:  # a MoE layer (moe.py)
            mix = moe_mlp(
                h,
                p,
                mesh=self.mesh,
                roles=self.roles,
                model=self.model,
                train=self.train,
                positions=self.positions,
            )
            return jax.lax.with_sharding_constraint(x + checkpoint_name(mix, "mlp_out"), act), None
        return jax.lax.with_sharding_constraint(x + self._mlp(h, p), act), None

    def _attention(self, h: jax.Array, p: Params, window: int) -> jax.Array:
        """The attention sublayer of the normed residual `h` over `window` (0: global),
        through its output projection (named `out_proj`)."""
        if self.model.attention == "mla":
            q, k, v = latent_qkv(h, p, model=self.model, matmul=self._matmul, at=self._rotary_at)
        else:
            again = set(self.regathered)
            q, k, v = (
                checkpoint_name(
                    self._matmul("bsd,dhk->bshk", h, p[w], regather=name in again), name
                )
                for w, name in (("wq", "query"), ("wk", "key"), ("wv", "value"))
            )
            sin, cos = rotary(self._rotary_at, self.model.head_dim)
            q, k = rotate(q, sin, cos), rotate(k, sin, cos)
        o = attention(
            q,
            k,
            v,
            kind=self.train.attention,
            mesh=self.mesh,
            roles=self.roles,
            window=window,
            positions=self.positions,
            strategy=self.train.context_strategy,
        )
        o = checkpoint_name(o, "attention_out")
        return checkpoint_name(self._matmul("bshk,hkd->bsd", o, p["wo"]), "out_proj")

    def _mlp(self, h: jax.Array, p: Params) -> jax.Array:
        """A dense layer's MLP of the normed residual `h` (its output named `mlp_out`)."""
        if self.model.mlp == "swiglu":  # gate first, as the memory model was measured on
            gate = checkpoint_name(self._matmul("bsd,df->bsf", h, p["w_gate"]), "mlp_in")
            up = checkpoint_name(self._matmul("bsd,df->bsf", h, p["w_up"]), "mlp_in")
            hidden = jax.nn.silu(gate) * up
        else:
            up = checkpoint_name(self._matmul("bsd,df->bsf", h, p["w_up"]), "mlp_in")
            hidden = _ACTIVATIONS[self.model.mlp](up)
        return checkpoint_name(self._matmul("bsf,fd->bsd", hidden, p["w_down"]), "mlp_out")

    def _matmul(self, spec: str, x: jax.Array, w: jax.Array, *, regather: bool = False) -> Any:
        """A projection or MLP matmul `spec` of the activation `x` and the stored weight `w`
        (cast to x's dtype), in the recipe's precision (`quantized.einsum`); `regather`: its
        backward pass gathers the weight again (`layout.regathered`)."""
        if regather and self.train.quantization == "none":
            return _regathered_projection(x, w)
        return quantized.einsum(spec, x, w, quantization=self.train.quantization, regather=regather)


def make_step(
    mesh: Mesh, model: ModelSpec, train: TrainSpec, *, batch_axes: Any, regather: bool | None = None
) -> Step:
    """The reference step on `mesh`; checks that every sharded dim divides by its axis.
    `regather`: whether the q, k and v weights are gathered again in the backward pass where
    `layout.regathered` says (None: as the platform's compiler wants,
    `PlatformTraits.regathers_attention_weights`)."""
    names = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    r = roles(tuple(mesh.shape.items()), names)
    st = check_fit(model, train, r)
    if regather is None:
        regather = platform_traits(mesh.devices.flat[0].platform).regathers_attention_weights
    again = regathered(model, train, r) if regather else ()
    if st is not None:  # outside the pipelined layers the pipeline axis acts as data
        check_windows(model, train, st.layers)
        r = replace(r, batch=tuple(a for a, _ in r.sizes if a in r.batch or a == r.pipeline))
    return Step(mesh, model, train, r, again, stages=st)
