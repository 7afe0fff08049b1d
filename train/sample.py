"""A short sample from the trained model: greedy or temperature sampling, a full forward per token.

Deliberately simple (no KV cache): the prompt sits in a fixed-length buffer whose length fits the
ring layout, so one compiled forward serves every token; causal attention keeps the padding after
the current position from influencing it. Every process runs it (the forward is a collective).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models import llama
from models.sharding import BATCH, attention_axes
from models.tokenizer import Tokenizer


def _next_token_fn(model_cfg: llama.LlamaConfig, mesh: Mesh, temperature: float):
    def next_token(params, buf, cur, key):
        logits = llama.forward(model_cfg, params, buf, mesh=mesh)  # [batch, T, vocab] f32
        last = jax.lax.dynamic_index_in_dim(logits[0], cur - 1, axis=0, keepdims=False)  # [vocab]
        if temperature <= 0:
            return jnp.argmax(last).astype(jnp.int32)
        return jax.random.categorical(key, last / temperature).astype(jnp.int32)

    return jax.jit(next_token, out_shardings=NamedSharding(mesh, P()))


def generate(
    model_cfg: llama.LlamaConfig,
    params: Any,
    mesh: Mesh,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    tokens: int,
    temperature: float,
    length: int,
    rng: jax.Array,
) -> str:
    """Continues ``prompt`` by up to ``tokens`` tokens within a buffer of ``length`` tokens."""
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError(f"sample.prompt={prompt!r} encodes to no tokens")
    if len(ids) >= length:
        raise ValueError(
            f"sample.prompt has {len(ids)} tokens; it must be shorter than the "
            f"sample buffer ({length} tokens, data.seq_len)"
        )
    nb = mesh.shape["dp"] * mesh.shape["fsdp"]
    buf = np.zeros((nb, length), np.int32)  # [batch, T], every row the same prompt
    buf[:, : len(ids)] = ids
    cur = len(ids)
    step = _next_token_fn(model_cfg, mesh, temperature)
    sharding = NamedSharding(mesh, P(BATCH, attention_axes(mesh)[0]))
    out = []
    while len(out) < tokens and cur < length:
        arr = jax.make_array_from_callback(buf.shape, sharding, lambda idx: buf[idx])
        tok = int(step(params, arr, jnp.int32(cur), jax.random.fold_in(rng, cur)))
        if tokenizer.eos_id is not None and tok == tokenizer.eos_id:
            break
        buf[:, cur] = tok
        out.append(tok)
        cur += 1
    return tokenizer.decode(out)
