"""The pieces ``train.train.main`` composes: shape checks, host batches, state, jitted steps.

Global batches are [accum, rows, seq] arrays sharded ``P(None, ("dp", "fsdp"), "sp")`` (``("sp",
"usp")`` with a Ulysses axis): each host
builds only the rows its devices hold, already in the model's ring layout (Ring Attention, Liu et
al. 2023; Striped Attention, Brandon et al. 2023), and gradient accumulation scans over ``accum``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models import llama
from models.sharding import BATCH, attention_axes, seq_shards
from ringattention import layouts
from train import data as data_lib
from train import optim
from train.config import OptimSection, TrainConfig

F32 = jnp.float32


def model_config(config: TrainConfig, **overrides) -> llama.LlamaConfig:
    """The model of a training config: ``model.preset`` with ``model.overrides`` (then
    ``overrides``) applied, and the top-level ``deterministic``."""
    return llama.get_config(
        config.model.preset, **{**config.model.overrides, "deterministic": config.deterministic, **overrides}
    )


def check_shapes(config: TrainConfig, model_cfg: llama.LlamaConfig, mesh: Mesh, vocab_size: int) -> None:
    """Raises ValueError (naming the options) if batch, sequence, mesh and vocab don't fit."""
    sp, nb = mesh.shape["sp"], mesh.shape["dp"] * mesh.shape["fsdp"]
    seq, batch, accum = config.data.seq_len, config.data.batch_size, config.optim.accum_steps
    try:
        layouts.check_divisible(seq, model_cfg.layout, sp)
    except ValueError as e:
        raise ValueError(f"data.seq_len={seq} does not fit the ring: {e}") from None
    if seq % seq_shards(mesh):
        raise ValueError(f"data.seq_len={seq} is not divisible by mesh.sp*mesh.usp={seq_shards(mesh)}")
    shard = seq // sp  # the ring's shard (with Ulysses: the whole group's sequence)
    block = min(model_cfg.q_chunk, model_cfg.kv_chunk)
    if shard > block and shard % block:
        raise ValueError(
            f"data.seq_len={seq} / mesh.sp={sp} = {shard} tokens per ring shard is not a "
            f"multiple of the attention block {block} (model q_chunk/kv_chunk)"
        )
    if (batch // accum) % nb:
        raise ValueError(
            f"data.batch_size={batch} / optim.accum_steps={accum} = {batch // accum} "
            f"sequences per micro-batch is not divisible by mesh dp*fsdp={nb}"
        )
    if vocab_size > model_cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {vocab_size} tokens but the model's vocab_size is "
            f"{model_cfg.vocab_size}; set model.overrides.vocab_size"
        )


@dataclasses.dataclass(frozen=True)
class BatchMaker:
    """Turns this host's rows into global [accum, rows, seq] arrays (and back for data state)."""

    mesh: Mesh
    accum: int
    rows: int  # sequences per micro-batch (global)
    seq_len: int
    layout: str

    @property
    def sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(None, BATCH, attention_axes(self.mesh)[0]))

    @property
    def state_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(None, BATCH, None))

    def host_streams(self) -> list[int]:
        """Global stream (row) ids whose data this host's devices hold, sorted."""
        shape = (self.accum, self.rows, self.seq_len)
        out = set()
        for idx in self.sharding.addressable_devices_indices_map(shape).values():
            for a in range(*idx[0].indices(self.accum)):
                out.update(a * self.rows + r for r in range(*idx[1].indices(self.rows)))
        return sorted(out)

    def owned_rows(self) -> np.ndarray:
        """bool [len(host_streams)]: the rows this process counts in totals over processes (a row
        that several processes hold, e.g. sequence-sharded over hosts, counts on the lowest one)."""
        shape = (self.accum, self.rows, self.seq_len)
        owner: dict[int, int] = {}
        for dev, idx in self.sharding.devices_indices_map(shape).items():
            for a in range(*idx[0].indices(self.accum)):
                for r in range(*idx[1].indices(self.rows)):
                    j = a * self.rows + r
                    owner[j] = min(owner.get(j, dev.process_index), dev.process_index)
        return np.array([owner[j] == jax.process_index() for j in self.host_streams()])

    def _global(self, local: np.ndarray, shape: tuple, sharding: NamedSharding) -> jax.Array:
        pos = {g: i for i, g in enumerate(self.host_streams())}

        def fetch(idx):
            a_rng = range(*idx[0].indices(shape[0]))
            r_rng = range(*idx[1].indices(shape[1]))
            sel = [[pos[a * self.rows + r] for r in r_rng] for a in a_rng]
            return local[np.asarray(sel, np.int64).reshape(len(a_rng), len(r_rng))][..., idx[2]]

        return jax.make_array_from_callback(shape, sharding, fetch)

    def batch(self, rows: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host rows [len(host_streams), seq] (natural order) -> global arrays in ring layout."""
        sp = self.mesh.shape["sp"]
        rows = data_lib.to_ring_layout(rows, self.layout, sp)
        shape = (self.accum, self.rows, self.seq_len)
        out = {k: self._global(v, shape, self.sharding) for k, v in rows.items()}
        out["loss_mask"] = out["loss_mask"].astype(F32)
        return out

    def state(self, local: np.ndarray) -> jax.Array:
        """Host data positions [len(host_streams), 3] -> global int32 [accum, rows, 3]."""
        shape = (self.accum, self.rows, data_lib.STATE_WIDTH)
        return self._global(local.astype(np.int32), shape, self.state_sharding)

    def local_state(self, state: jax.Array) -> np.ndarray:
        """Global [accum, rows, 3] -> this host's rows [len(host_streams), 3] (int64)."""
        out = {}
        for shard in state.addressable_shards:
            a_rng = range(*shard.index[0].indices(self.accum))
            r_rng = range(*shard.index[1].indices(self.rows))
            block = np.asarray(shard.data)
            for i, a in enumerate(a_rng):
                for k, r in enumerate(r_rng):
                    out[a * self.rows + r] = block[i, k]
        return np.stack([out[g] for g in self.host_streams()]).astype(np.int64)


def abstract_params(model_cfg: llama.LlamaConfig, mesh: Mesh) -> Any:
    """ShapeDtypeStructs (with shardings) of the parameters."""
    shardings = llama.param_shardings(model_cfg, mesh)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        llama.abstract_params(model_cfg),
        shardings,
    )


def opt_state_shardings(tx: optax.GradientTransformation, params_abstract: Any, mesh: Mesh) -> Any:
    """Shardings of ``tx.init(params)``: moments like their parameter, scalars replicated."""
    out = jax.jit(tx.init).lower(params_abstract).compile().output_shardings
    rep = NamedSharding(mesh, P())
    return jax.tree.map(lambda s: s if isinstance(s, NamedSharding) else rep, out)


def abstract_like(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        jax.eval_shape(lambda t: t, tree),
        shardings,
    )


def _global_norm(tree: Any) -> jax.Array:
    norm = getattr(getattr(optax, "tree", None), "norm", None)  # optax >= 0.2.5
    return norm(tree) if norm is not None else optax.global_norm(tree)


def make_train_step(
    model_cfg: llama.LlamaConfig, mesh: Mesh, tx: optax.GradientTransformation, param_sh: Any, opt_sh: Any
) -> Callable:
    """jit(params, opt_state, batch[accum, rows, seq]) -> (params, opt_state, metrics)."""

    def grads_of(params, micro):
        fn = lambda p: llama.loss_fn(model_cfg, p, micro, mesh=mesh)
        (_, aux), g = jax.value_and_grad(fn, has_aux=True)(params)
        # grad of the mean times the token count = grad of the sum, so micro-batches add up exactly
        g = jax.tree.map(lambda x: x.astype(F32) * aux["tokens"], g)
        return g, aux["loss_sum"], aux["tokens"]

    def step(params, opt_state, batch):
        accum = batch["input_ids"].shape[0]
        g, loss_sum, tokens = grads_of(params, jax.tree.map(lambda x: x[0], batch))
        if accum > 1:

            def body(carry, micro):
                g_i, l_i, t_i = grads_of(params, micro)
                return jax.tree.map(jnp.add, carry, (g_i, l_i, t_i)), None

            rest = jax.tree.map(lambda x: x[1:], batch)
            (g, loss_sum, tokens), _ = jax.lax.scan(body, (g, loss_sum, tokens), rest)
        g = jax.tree.map(lambda x, p: (x / jnp.maximum(tokens, 1.0)).astype(p.dtype), g, params)
        grad_norm = _global_norm(g)
        loss = loss_sum / jnp.maximum(tokens, 1.0)
        # a non-finite loss or gradient leaves the state as it was (train.guard stops or skips)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt_state = tx.update(g, opt_state, params)
        updates = jax.tree.map(lambda u: jnp.where(ok, u, jnp.zeros_like(u)), updates)
        opt_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_opt_state, opt_state)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, "grad_norm": grad_norm, "tokens": tokens, "ok": ok}
        return params, opt_state, metrics

    rep = NamedSharding(mesh, P())
    return jax.jit(step, out_shardings=(param_sh, opt_sh, rep), donate_argnums=(0, 1))


def make_eval_step(model_cfg: llama.LlamaConfig, mesh: Mesh) -> Callable:
    """jit(params, batch[1, rows, seq]) -> (loss_sum, tokens), replicated float32 scalars."""

    def step(params, batch):
        micro = jax.tree.map(lambda x: x[0], batch)
        _, aux = llama.loss_fn(model_cfg, params, micro, mesh=mesh)
        return aux["loss_sum"], aux["tokens"]

    rep = NamedSharding(mesh, P())
    return jax.jit(step, out_shardings=(rep, rep))


@dataclasses.dataclass(frozen=True)
class Functions:
    """Everything that depends only on (model, mesh, optimizer, schedule length): built once."""

    tx: optax.GradientTransformation
    params_abstract: Any
    param_shardings: Any
    opt_shardings: Any
    opt_abstract: Any
    scan_layers: bool
    init_params: Callable
    train_step: Callable
    eval_step: Callable


@functools.lru_cache(maxsize=8)
def functions(
    model_cfg: llama.LlamaConfig, mesh: Mesh, optim_cfg: OptimSection, total_steps: int
) -> Functions:
    """Optimizer, state shardings and jitted steps (cached, so a resumed run in the same process
    reuses the compiled step)."""
    tx = optim.make_optimizer(optim_cfg, total_steps)
    params_abs = abstract_params(model_cfg, mesh)
    param_sh = jax.tree.map(lambda a: a.sharding, params_abs)
    opt_sh = opt_state_shardings(tx, params_abs, mesh)
    opt_abs = abstract_like(jax.eval_shape(tx.init, params_abs), opt_sh)
    init = jax.jit(lambda rng: llama.init_params(model_cfg, rng, mesh), out_shardings=param_sh)
    return Functions(
        tx,
        params_abs,
        param_sh,
        opt_sh,
        opt_abs,
        model_cfg.scan_layers,
        init,
        make_train_step(model_cfg, mesh, tx, param_sh, opt_sh),
        make_eval_step(model_cfg, mesh),
    )
