"""Pallas TPU (Mosaic) kernels for one ring step: ``implementation="pallas_tpu"``.

The inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) as FlashAttention-2 style kernels (Dao
2023) written to TPU rules: a forward kernel over grid (batch, head, q block, kv block) with float32
running max / denominator / output in VMEM scratch, a dq kernel over the same grid, and a dk/dv
kernel over (batch, kv head, kv block, group, q block) that sums the query heads of a GQA group into
one kv head's float32 dk/dv without repeating k/v. Causal, sliding-window and segment masks come from
global positions and ids (any layout); per-block SKIP/PARTIAL/FULL kinds (``masks.block_table``) and
the block to hold at each grid step reach the kernels by scalar prefetch, so SKIP blocks are neither
computed nor copied to VMEM and FULL blocks skip the elementwise mask. The optional features (soft
cap, bidirectional prefix per row, bidirectional segments, v head dim) are in ``features.py``, what
the kernels share (their static configuration, dot, ref split, block dispatch) in ``frame.py``.
Contract: ``ringattention/implementations.py``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ringattention._vma import struct
from ringattention.kernels.tpu.blocks import (
    LANES,
    BlockSizes,
    HeadView,
    check_inputs,
    fetch_index,
    resolve_blocks,
    tables,
)
from ringattention.kernels.tpu.features import cap_grad, feature_cfg, logits, visible
from ringattention.kernels.tpu.frame import (
    F32,
    NN,
    NT,
    _aux,
    _Cfg,
    _dot,
    _interpret,
    _split_refs,
    _when_computed,
)

__all__ = ["BlockSizes", "forward_step", "backward_step"]


# ----------------------------------------------------------------------------------------- forward


def _fwd_kernel(kind_ref, fetch_ref, *refs, cfg: _Cfg):
    (q_ref, k_ref, v_ref), aux, kb, rest = _split_refs(refs, cfg, 3)
    o_ref, lse_ref, m_sc, l_sc, acc_sc = rest
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, F32)
        l_sc[...] = jnp.zeros(l_sc.shape, F32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

    def update(masked: bool):
        s = logits(_dot(q_ref[...], k_ref[...], NT, cfg), cfg)  # [bq, bk]
        if masked:
            s = jnp.where(visible(*aux, cfg, True), s, -jnp.inf)
        m_prev, l_prev = m_sc[...][:, :1], l_sc[...][:, :1]  # [bq, 1]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe)  # [bq, bk], 0 where masked
        corr = jnp.exp(m_prev - m_safe)
        v = v_ref[...]
        l_sc[...] = jnp.broadcast_to(l_prev * corr + p.sum(axis=1, keepdims=True), l_sc.shape)
        m_sc[...] = jnp.broadcast_to(m_new, m_sc.shape)
        acc_sc[...] = acc_sc[...] * corr + _dot(p.astype(v.dtype), v, NN, cfg)

    _when_computed(cfg, update, kind_ref, kb, b, i, j)

    @pl.when(j == cfg.n_inner - 1)
    def _finish():
        l = l_sc[...]  # [bq, 128]
        seen = l > 0
        l_safe = jnp.where(seen, l, 1.0)
        o_ref[...] = acc_sc[...] / l_safe[:, :1]
        lse = jnp.where(seen, m_sc[...] + jnp.log(l_safe), -jnp.inf)  # [bq, 128]
        lse_ref[...] = lse.T[:1, :]  # lane-dense row [1, bq]


def forward_step(
    q,
    k,
    v,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    causal,
    softmax_scale,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """One ring step forward (contract in ``implementations.py``). Returns (o f32, lse f32)."""
    check_inputs(q, k, v, q_pos, k_pos, q_seg, k_seg)
    feats = feature_cfg(causal, q_seg, q.shape[0], softcap, prefix, bidirectional)
    B, Sq, H, D = q.shape  # [batch, q_shard, heads, head_dim]
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]  # k [B, Sk, K, D], v [B, Sk, K, Dv]
    G = H // K
    bq, bk = resolve_blocks(block_sizes, Sq, Sk, backward=False)
    nq, nk = Sq // bq, Sk // bk
    kind, fetch = tables(
        q_pos, k_pos, q_seg, k_seg, causal, bq, bk, window, prefix, bidirectional
    )  # [Bt, nq, nk]
    cfg = _Cfg(
        bool(causal),
        float(softmax_scale),
        q_seg is not None,
        kind.shape[0] > 1,
        nq,
        nk,
        G,
        q.dtype == jnp.float32,
        window,
        blocked_kinds=interpret is True,
        **feats,
    )
    hv, hv_v = HeadView.for_dim(D), HeadView.for_dim(Dv)
    kv_blk = lambda b, h, i, j, kr, fr: cfg.fetched(fr, b, i, j)  # noqa: E731
    q_idx = lambda b, h, i, j, kr, fr: (b, i, h)  # noqa: E731
    kv_idx = lambda b, h, i, j, kr, fr: (b, kv_blk(b, h, i, j, kr, fr), lax.div(h, G))  # noqa: E731  GQA
    in_specs = [hv.spec(bq, q_idx), hv.spec(bk, kv_idx), hv_v.spec(bk, kv_idx)]
    args = [hv.view(q), hv.view(k), hv_v.view(v)]
    q_rows = lambda b, h, i, j, kr, fr: (b, i)  # noqa: E731
    k_rows = lambda b, h, i, j, kr, fr: (b, kv_blk(b, h, i, j, kr, fr))  # noqa: E731
    aux_specs, aux_args = _aux(cfg, q_pos, k_pos, q_seg, k_seg, prefix, bq, bk, q_rows, k_rows, True)
    kind_specs, kind_args = cfg.kind_blocks(kind, lambda b, h, i, j, kr, fr: (b, i, j))
    in_specs, args = in_specs + aux_specs + kind_specs, args + aux_args + kind_args
    out_specs = [
        hv_v.spec(bq, q_idx),
        pl.BlockSpec((None, None, 1, bq), lambda b, h, i, j, kr, fr: (b, h, 0, i)),
    ]
    # outputs vary over the manual axes the inputs vary over (shard_map's check_vma)
    out_shape = [struct(hv_v.shape(B, Sq, H), F32, *args), struct((B, H, 1, Sq), F32, *args)]
    scratch = [pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, Dv), F32)]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(B, H, nq, nk),
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=scratch,
    )
    o, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg),
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=_interpret(interpret),
        name="ring_flash_fwd",
    )(kind.reshape(-1), fetch.reshape(-1), *args)
    return hv_v.unview(o, H), lse.reshape(B, H, Sq)


# ---------------------------------------------------------------------------------------- backward


def _dq_kernel(kind_ref, fetch_ref, *refs, cfg: _Cfg):
    (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref), aux, kb, rest = _split_refs(refs, cfg, 6)
    dq_ref, dq_sc, lse_sc, dl_sc = rest
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        dq_sc[...] = jnp.zeros(dq_sc.shape, F32)
        # rows [1, bq] -> lane-broadcast columns [bq, 128], once per query block
        lse_sc[...] = jnp.broadcast_to(lse_ref[...], (LANES, lse_ref.shape[-1])).T
        dl_sc[...] = jnp.broadcast_to(dl_ref[...], (LANES, dl_ref.shape[-1])).T

    def update(masked: bool):
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        s = logits(_dot(q, k, NT, cfg), cfg)  # [bq, bk]
        p = jnp.exp(s - lse_sc[...][:, :1])
        if masked:
            p = jnp.where(visible(*aux, cfg, True), p, 0.0)
        dp = _dot(do, v, NT, cfg)  # [bq, bk]
        ds = cap_grad(p * (dp - dl_sc[...][:, :1]), s, cfg) * cfg.scale
        dq_sc[...] += _dot(ds.astype(k.dtype), k, NN, cfg)

    _when_computed(cfg, update, kind_ref, kb, b, i, j)

    @pl.when(j == cfg.n_inner - 1)
    def _finish():
        dq_ref[...] = dq_sc[...]


def _dkv_kernel(kind_ref, fetch_ref, *refs, cfg: _Cfg):
    (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref), aux, kb, rest = _split_refs(refs, cfg, 6)
    dk_ref, dv_ref, dk_sc, dv_sc = rest
    b, j, g, i = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)

    @pl.when((g == 0) & (i == 0))
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, F32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, F32)

    def update(masked: bool):
        # kv-major: scores transposed [bk, bq], so the per-query lse / delta are lane-dense rows
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        st = logits(_dot(k, q, NT, cfg), cfg)  # [bk, bq]
        pt = jnp.exp(st - lse_ref[...])
        if masked:
            pt = jnp.where(visible(*aux, cfg, False), pt, 0.0)
        dv_sc[...] += _dot(pt.astype(do.dtype), do, NN, cfg)
        dpt = _dot(v, do, NT, cfg)  # [bk, bq]
        dst = cap_grad(pt * (dpt - dl_ref[...]), st, cfg) * cfg.scale
        dk_sc[...] += _dot(dst.astype(q.dtype), q, NN, cfg)

    _when_computed(cfg, update, kind_ref, kb, b, j, i)

    @pl.when((g == cfg.groups - 1) & (i == cfg.n_inner - 1))
    def _finish():
        dk_ref[...] = dk_sc[...]
        dv_ref[...] = dv_sc[...]


def _bwd_common(
    q,
    k,
    v,
    do,
    lse,
    delta,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    causal,
    block_sizes,
    window=None,
    prefix=None,
    bidirectional=False,
):
    check_inputs(q, k, v, q_pos, k_pos, q_seg, k_seg)
    B, Sq, H, D = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    if do.shape != (B, Sq, H, Dv) or lse.shape != delta.shape or lse.shape != (B, H, Sq):
        raise ValueError(
            f"expected do [B, Sq, H, Dv] and lse/delta [B, H, Sq]; got {do.shape=} "
            f"{q.shape=} {v.shape=} {lse.shape=} {delta.shape=}"
        )
    bq, bk = resolve_blocks(block_sizes, Sq, Sk, backward=True)
    kind, fetch = tables(
        q_pos, k_pos, q_seg, k_seg, causal, bq, bk, window, prefix, bidirectional
    )  # [Bt, nq, nk]
    hvs = HeadView.for_dim(D), HeadView.for_dim(Dv)  # q/k/dq/dk; v/do/dv
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse).astype(F32)
    rows = (
        hvs[0].view(q),
        hvs[0].view(k),
        hvs[1].view(v),
        hvs[1].view(do.astype(q.dtype)),
        lse_safe.reshape(B, H, 1, Sq),
        delta.astype(F32).reshape(B, H, 1, Sq),
    )
    return (B, Sq, H, D, Sk, K, bq, bk), kind, fetch, hvs, rows


def _dq_call(cfg, dims, kind, fetch, hvs, rows, aux, interpret):
    B, Sq, H, D, Sk, K, bq, bk = dims
    G, (hv, hv_v) = cfg.groups, hvs
    kv_blk = lambda b, h, i, j, kr, fr: cfg.fetched(fr, b, i, j)  # noqa: E731
    q_idx = lambda b, h, i, j, kr, fr: (b, i, h)  # noqa: E731
    kv_idx = lambda b, h, i, j, kr, fr: (
        b,
        kv_blk(b, h, i, j, kr, fr),  # noqa: E731
        lax.div(h, G),
    )  # GQA: kv head h // G
    q_spec, kv_spec = hv.spec(bq, q_idx), hv.spec(bk, kv_idx)
    row_spec = pl.BlockSpec((None, None, 1, bq), lambda b, h, i, j, kr, fr: (b, h, 0, i))
    aux_specs, aux_args = aux(
        lambda b, h, i, j, kr, fr: (b, i), lambda b, h, i, j, kr, fr: (b, kv_blk(b, h, i, j, kr, fr)), True
    )
    kind_specs, kind_args = cfg.kind_blocks(kind, lambda b, h, i, j, kr, fr: (b, i, j))
    aux_specs, aux_args = aux_specs + kind_specs, aux_args + kind_args
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(B, H, Sq // bq, Sk // bk),
        in_specs=[
            q_spec,
            kv_spec,
            hv_v.spec(bk, kv_idx),
            hv_v.spec(bq, q_idx),
            row_spec,
            row_spec,
            *aux_specs,
        ],
        out_specs=q_spec,
        scratch_shapes=[pltpu.VMEM((bq, D), F32), pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32)],
    )
    return pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid_spec=grid_spec,
        out_shape=struct(hv.shape(B, Sq, H), F32, *rows, *aux_args),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=_interpret(interpret),
        name="ring_flash_dq",
    )(kind.reshape(-1), fetch.reshape(-1), *rows, *aux_args)


def _dkv_call(cfg, dims, kind, fetch, hvs, rows, aux, interpret):
    B, Sq, H, D, Sk, K, bq, bk = dims
    G, (hv, hv_v) = cfg.groups, hvs
    q_blk = lambda b, kh, j, g, i, kr, fr: cfg.fetched(fr, b, j, i)  # noqa: E731
    q_idx = lambda b, kh, j, g, i, kr, fr: (
        b,
        q_blk(b, kh, j, g, i, kr, fr),  # noqa: E731
        kh * G + g,
    )
    kv_idx = lambda b, kh, j, g, i, kr, fr: (b, j, kh)  # noqa: E731
    q_spec, k_spec, v_spec = hv.spec(bq, q_idx), hv.spec(bk, kv_idx), hv_v.spec(bk, kv_idx)
    row_spec = pl.BlockSpec(
        (None, None, 1, bq), lambda b, kh, j, g, i, kr, fr: (b, kh * G + g, 0, q_blk(b, kh, j, g, i, kr, fr))
    )
    aux_specs, aux_args = aux(
        lambda b, kh, j, g, i, kr, fr: (b, q_blk(b, kh, j, g, i, kr, fr)),
        lambda b, kh, j, g, i, kr, fr: (b, j),
        False,
    )
    kind_specs, kind_args = cfg.kind_blocks(kind, lambda b, kh, j, g, i, kr, fr: (b, j, i))
    aux_specs, aux_args = aux_specs + kind_specs, aux_args + kind_args
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(B, K, Sk // bk, G, Sq // bq),
        in_specs=[q_spec, k_spec, v_spec, hv_v.spec(bq, q_idx), row_spec, row_spec, *aux_specs],
        out_specs=[k_spec, v_spec],
        scratch_shapes=[pltpu.VMEM((bk, D), F32), pltpu.VMEM((bk, hv_v.head_dim), F32)],
    )
    return pl.pallas_call(
        functools.partial(_dkv_kernel, cfg=cfg),
        grid_spec=grid_spec,
        out_shape=[struct(x.shape(B, Sk, K), F32, *rows, *aux_args) for x in hvs],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")
        ),
        interpret=_interpret(interpret),
        name="ring_flash_dkv",
    )(kind.reshape(-1), fetch.reshape(-1), *rows, *aux_args)


def backward_step(
    q,
    k,
    v,
    do,
    lse,
    delta,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    causal,
    softmax_scale,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """One ring step backward (contract in ``implementations.py``). Returns float32 dq, dk, dv."""
    feats = feature_cfg(causal, q_seg, q.shape[0], softcap, prefix, bidirectional)
    dims, kind, fetch, hvs, rows = _bwd_common(
        q,
        k,
        v,
        do,
        lse,
        delta,
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        causal,
        block_sizes,
        window,
        prefix,
        bidirectional,
    )
    B, Sq, H, D, Sk, K, bq, bk = dims
    nq, nk = Sq // bq, Sk // bk
    base = dict(
        causal=bool(causal),
        scale=float(softmax_scale),
        has_seg=q_seg is not None,
        batch_table=kind.shape[0] > 1,
        groups=H // K,
        f32_inputs=q.dtype == jnp.float32,
        window=window,
        blocked_kinds=interpret is True,
        **feats,
    )
    cfg_q = _Cfg(n_outer=nq, n_inner=nk, **base)
    aux = functools.partial(_aux, cfg_q, q_pos, k_pos, q_seg, k_seg, prefix, bq, bk)
    dq = _dq_call(cfg_q, dims, kind, fetch, hvs, rows, aux, interpret)
    kind_t = jnp.swapaxes(kind, 1, 2)  # [Bt, nk, nq]
    cfg_k = _Cfg(n_outer=nk, n_inner=nq, **base)
    dk, dv = _dkv_call(cfg_k, dims, kind_t, fetch_index(kind_t), hvs, rows, aux, interpret)
    return hvs[0].unview(dq, H), hvs[0].unview(dk, K), hvs[1].unview(dv, K)
