"""AdamW (Loshchilov & Hutter 2019) with linear warmup, cosine decay and global-norm clipping.

Master weights and optimizer moments stay in the parameters' dtype (float32); the model computes in
its ``dtype`` (e.g. bfloat16). Weight decay applies to weight matrices only: never to norm scales
(even when layers are stacked by ``scan``) and, unless asked, not to the token embedding.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from train.config import OptimSection


def schedule(cfg: OptimSection, total_steps: int) -> optax.Schedule:
    """Learning rate by update count: up to lr over warmup, then cosine to lr * min_lr_ratio."""
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    base = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=cfg.lr * cfg.min_lr_ratio,
    )
    return lambda count: base(count + 1)  # optax counts from 0: the first step gets lr/warmup


def _key_name(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
    """True for leaves that get weight decay: matrices, not norm scales (nor the embedding)."""

    def decays(path, leaf) -> bool:
        names = [_key_name(k) for k in path]
        if names and names[-1] == "scale" or any(n.endswith("norm") for n in names):
            return False
        if names and names[-1] == "embedding" and not decay_embeddings:
            return False
        return getattr(leaf, "ndim", 0) >= 2

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(cfg: OptimSection, total_steps: int) -> optax.GradientTransformation:
    """Clipping (if ``clip_norm`` > 0) then AdamW with the warmup-cosine schedule."""
    adamw = optax.adamw(
        schedule(cfg, total_steps),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=lambda p: decay_mask(p, cfg.decay_embeddings),
    )
    if cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
    return adamw
