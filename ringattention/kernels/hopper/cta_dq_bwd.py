"""Fused Pallas Mosaic GPU (Hopper) ring-step backward with one dq tile per CTA (head dims <= 128, MLA).

The kernel of ``pallas_hopper.BlockSizes(backward="fused")`` (FlashAttention-3 backward, Shah et
al. 2024, for one step of Ring Attention, Liu, Zaharia & Abbeel 2023; the default at head dims 64
and 128), in the key-CTA frame of ``fused_bwd.py``. The two compute warpgroups of a CTA (which
visit the same query blocks in the same order) share one dq tile per pair rather than each
reduce-adding its own ``ds_w @ k_w`` ([64 queries, D] float32; that variant, ``dq_tile=
"warpgroup"``, lost and was deleted: docs/kernels.md), so the reduce-add traffic (what limited that
variant: removing it made the step 1.22-1.25x faster on an H200; with one tile per CTA, at 32K
32:8:128 causal, removing it no longer changes the time, and MLA's forward+backward would gain
1.11x: docs/kernels.md) and the float32 dq accumulator are half of that variant's, and the
accumulator is one [B, Sq, H, D] buffer in the step's layout (head-major plus one transpose ran no
faster at 16K-128K tokens on an H200: docs/kernels.md). The tiles are added unscaled and dq is
scaled once after the kernel. At head dim 128 dk, dv are written head-major ([B, K, Sk, D], one
transpose each after the kernel, ``hfb.dkv_head_major``). Scaling every tile before its reduce-add
and writing dk, dv in the step's layout (92f7d26) made 32:32:128 at 128K without a mask 0.92x cuDNN
where this runs 0.99x (1,971 against 1,814 ms; with only the scale undone 1,829 ms, with only the
layout 1,855 ms; an L2 hit rate of 88% against 98% at 64K; docs/kernels.md). At head dim 64 an A/B
of the scale after the kernel (dk's moved out as well) ran the backward 0.5-1.5% faster in 9 of 10
cells at 16K-128K tokens and 0.3% slower in the tenth (docs/kernels.md); dk, dv stay in the step's
layout there (0.3-2% faster than head-major at 128K tokens):

* head dims 65-128 (``cta_dq_kernel``): after both have written ds^T of their 64 keys to shared
  memory, warpgroup w computes the columns Dw = [w D/2, (w + 1) D/2) of
  ``dq = ds_0 @ k_0 + ds_1 @ k_1`` (two wgmmas into one [64, D/2] accumulator, 32 registers per
  thread at D = 128 instead of 64) and reduce-adds that half tile; the price is a barrier between
  the two warpgroups per pair (ds^T of both written) and one before ds^T is overwritten;
* MLA's q/k head dim 192 with v <= 128 (``_three_tiles``): dq's 192 columns are three
  64-column tiles (a half, 96 columns, would cut a 128-byte swizzle tile); in pair t the
  warpgroup with t + w even adds tiles 0 and 2, the other tile 1, one [64, 64] accumulator at a
  time. dk [64, 192] and dv [64, 128] hold 160 float32 registers per thread, so s^T and dp^T run
  one after the other (``hbk.kv_probs``: dp^T's accumulator starts at -delta) instead of in
  flight together, which made ptxas serialize every wgmma. 2 stages (208 KB; 3 need 248 KB);
* head dims <= 64 (``alternating_kernel``; half of 64 columns is not a whole swizzle tile): the
  warpgroups take turns, warpgroup t % 2 computing and adding pair t's whole tile, with ds^T
  double-buffered by the pair's parity so that the other one runs on.

Everything else (dk/dv of the own keys, the visiting order, the GQA group loop, the producer, the
masks and a sliding window's ``edge`` bound) is the key-CTA frame's (``fused_bwd``), through
the ``bwd_kernels`` helpers. dq sums in a run-dependent order (TMA reduce-adds). Interpret
mode: the reduce-add is a read-modify-write
(``fused_bwd.FusedOps``), exact because grid points run one after another and the two
warpgroups own disjoint columns.

Shared memory at D = 128, bf16 (``smem_bytes``): own k, v 2 x 2 x 16 KB; per stage q, do 2 x 16 KB;
ds^T 2 x 8 KB; dq staging 2 x 16 KB: 176 KB with 2 stages, 208 KB with 3 (182 / 214 KB as Mosaic
GPU allocates them; the deleted per-warpgroup variant's two [64, 128] float32 staging tiles left
no room for a third stage).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention._vma import vary_like
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import bwd_common as hbc
from ringattention.kernels.hopper import bwd_kernels as hbk
from ringattention.kernels.hopper import fused_bwd as hfb
from ringattention.kernels.hopper import mosaic as hm

F32 = jnp.float32
WGS = hm.COMPUTE_WGS
ROWS = hb.ROWS  # own key rows per compute warpgroup and streamed query block length
CTA = hb.CTA
TILE = 64  # columns of a 16-bit 128-byte swizzle tile: the unit the dq columns are split in
HEAD_DIMS = (64, 128, 192)  # padded q/k head dims: alternating_kernel, _halves, _three_tiles
MAX_V_HEAD_DIM = 128  # padded: dv [64, Dv] float32 beside dk in registers


def _kv_update(c: hfb.KeyCta, carry, p_t, ds_t, ds_smem, slot):
    """dk += ds^T q, dv += p^T do (``hbk.kv_update``: p^T, ds^T from registers). ``ds_smem``, where
    ds^T was just staged for dq, is unused here: the seam through which an A/B had dk's wgmma read
    it instead (it lost: docs/kernels.md)."""
    del ds_smem
    return hbk.kv_update(c.ops, carry, p_t, ds_t, c.smem[2].at[slot], c.smem[3].at[slot])


def _dq_half(ops: hm.Ops, ds_s, k_s, dw, shape):
    """float32 ``shape`` = sum over the warpgroups w' of ds_w' [queries, keys] @ k_w'[:, dw]: both
    wgmmas issued into one accumulator before one wait."""
    terms = [(hm.Smem(ds_s.at[w], transposed=True), hm.Smem(k_s.at[w, :, dw])) for w in range(WGS)]
    if ops.interpret:
        return sum(ops._dot(a, b) for a, b in terms)

    def scope(acc_ref):  # a fresh accumulator starts at zero
        for a, b in terms:
            ops._issue(acc_ref, a, b)
        return acc_ref[...]

    # run_scoped, not run_state: run_state returns the literal indices w that the terms close
    # over as outputs, which Mosaic GPU's warpgroup lowering (jax >= 0.11's default) rejects
    return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32))


def cta_dq_kernel(*refs, cfg: hbc.BwdConfig):
    """``hfb.key_cta_kernel`` with the dq accumulator f32 [B, Sq, H, D], a ds^T tile and half a dq
    staging tile per warpgroup, and the barriers ds^T written / ds^T read. Out: dk, dv f32
    (``hfb.dkv_out``)."""
    hfb.key_cta_kernel(refs, cfg, _split_columns)


def _split_columns(c: hfb.KeyCta):
    ops, wg = c.ops, c.wg
    k_s = c.smem[0]
    ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]  # (an A/B may append buffers)
    lo, d = c.bounds[0], k_s.shape[2]
    add_dq = _three_tiles if d == 3 * TILE else _halves

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
        ops.stage(ds_s.at[wg], ds_t)
        plgpu.barrier_arrive(ds_ready)
        carry = _kv_update(c, carry, p_t, ds_t, ds_s.at[wg], slot)
        plgpu.barrier_arrive(c.free.at[slot])
        plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
        h, rows_q = c.dq_rows(j, g)
        add_dq(c, t, ds_s, dq_s, ds_free, lambda cols: c.outs[0].at[c.b, rows_q, h, cols])
        return carry

    c.loop(body)
    pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
    ops.flush()


def _halves(c: hfb.KeyCta, t, ds_s, dq_s, ds_free, dq_at):
    """Head dims 65-128: warpgroup w adds columns [w D/2, (w + 1) D/2) of the pair's dq tile."""
    d = c.smem[0].shape[2]
    dw = pl.ds(c.wg * (d // WGS), d // WGS)
    dq = _dq_half(c.ops, ds_s, c.smem[0], dw, (c.cfg.block, d // WGS))  # [c, D/2]
    plgpu.barrier_arrive(ds_free)
    c.ops.reduce_add(dq_s.at[c.wg], dq, dq_at(dw))


def _three_tiles(c: hfb.KeyCta, t, ds_s, dq_s, ds_free, dq_at):
    """Head dim 192 (MLA's q/k): the pair's dq tile is three 64-column tiles (96 columns would cut
    a 128-byte swizzle tile); the warpgroup with (t + w) even adds tiles 0 and 2, the other tile
    1, so the two alternate the heavier share pair by pair. One [64, 64] float32 accumulator at a
    time (32 registers per thread beside dk [64, 192] and dv [64, 128]: 160)."""
    tile = lambda x: _dq_half(c.ops, ds_s, c.smem[0], pl.ds(x * TILE, TILE), (c.cfg.block, TILE))  # noqa: E731
    add = lambda x, dq: c.ops.reduce_add(dq_s.at[c.wg], dq, dq_at(pl.ds(x * TILE, TILE)))  # noqa: E731
    two = lax.rem(t + c.wg, jnp.int32(2)) == 0

    @pl.when(two)
    def _():
        add(0, tile(0))
        dq = tile(2)
        plgpu.barrier_arrive(ds_free)
        add(2, dq)

    @pl.when(jnp.logical_not(two))
    def _():
        dq = tile(1)
        plgpu.barrier_arrive(ds_free)
        add(1, dq)


def alternating_kernel(*refs, cfg: hbc.BwdConfig):
    """Head dim 64: as ``cta_dq_kernel``, but the warpgroups take turns instead of splitting the
    columns (half of 64 columns is not a whole 128-byte swizzle tile): pair t's whole dq tile
    ``ds_0 @ k_0 + ds_1 @ k_1`` ([64 queries, 64] float32) is computed and reduce-added by
    warpgroup t % 2 alone. ds^T is double-buffered by the pair's parity (``ds_s[t % 2]``), with a
    barrier pair per parity: ``ready[p]`` (both ds^T written; waited by warpgroup p only) and
    ``done[p]`` (warpgroup p has read them; waited by both before they overwrite ds_s[p] two pairs
    later), so every thread waits on every phase of a barrier it uses, and the warpgroup whose turn
    it is not runs ahead into the next pair."""
    hfb.key_cta_kernel(refs, cfg, _take_turns)


def _take_turns(c: hfb.KeyCta):
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s = c.smem[0]
    ds_s, dq_s, ready, done = c.scratch[:4]
    lo, d = c.bounds[0], k_s.shape[2]

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        par = lax.rem(t, jnp.int32(2))
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t >= 2)(lambda: plgpu.barrier_wait(done.at[par]))  # read two pairs ago
        ops.stage(ds_s.at[par, wg], ds_t)
        plgpu.barrier_arrive(ready.at[par])
        carry = _kv_update(c, carry, p_t, ds_t, ds_s.at[par, wg], slot)
        plgpu.barrier_arrive(c.free.at[slot])

        @pl.when(wg == par)
        def _():
            plgpu.barrier_wait(ready.at[par])  # ds^T of both warpgroups written
            dq = _dq_half(ops, ds_s.at[par], k_s, pl.ds(0, d), (cfg.block, d))  # [c, D]
            plgpu.barrier_arrive(done.at[par])
            h, rows_q = c.dq_rows(j, g)
            ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, rows_q, h])

        return carry

    c.loop(body)
    for par in range(2):  # observe the last phase of each parity's done barrier
        pl.when(c.n * cfg.groups > par)(lambda par=par: plgpu.barrier_wait(done.at[par]))
    ops.flush()


def _scratch(d: int, dtype, stages: int, positions: bool, segments: bool, dv: int | None = None):
    """The dk/dv kernel's buffers (v's and do's ``dv`` columns wide; None: d), ds^T per warpgroup,
    half a dq tile per warpgroup, then the barriers: ds^T of both written, ds^T of both read."""
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # 16-bit, 128 bytes
    f32_tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
    common = hb._scratch(ROWS, ROWS, d, dtype, stages, 0, 2, positions, segments, dv)
    if d == 64:  # alternating_kernel: ds^T per parity, a whole dq tile per warpgroup
        return [
            *common,
            plgpu.SMEM((2, WGS, ROWS, ROWS), dtype, transforms=tiles),
            plgpu.SMEM((WGS, ROWS, d), F32, transforms=f32_tiles),
            plgpu.Barrier(num_arrivals=WGS, num_barriers=2),
            plgpu.Barrier(num_arrivals=1, num_barriers=2),
        ]
    return [
        *common,
        plgpu.SMEM((WGS, ROWS, ROWS), dtype, transforms=tiles),  # ds^T [r keys, c queries]
        plgpu.SMEM((WGS, ROWS, _staged(d)), F32, transforms=f32_tiles),  # dq columns staged
        plgpu.Barrier(num_arrivals=WGS),
        plgpu.Barrier(num_arrivals=WGS),
    ]


def smem_bytes(d: int, dtype, stages: int, dv: int | None = None) -> int:
    """Shared memory of the tiles (k, v own; q, do streamed; ds^T; dq staging), ints excluded;
    ``dv``: v's padded head dim (None: d)."""
    tiles = (WGS + stages) * ROWS * (d + (d if dv is None else dv)) * jnp.dtype(dtype).itemsize
    if d == 64:  # two parities of ds^T, a whole dq tile per warpgroup
        return tiles + WGS * ROWS * (2 * ROWS * jnp.dtype(dtype).itemsize + d * 4)
    return tiles + WGS * ROWS * (ROWS * jnp.dtype(dtype).itemsize + _staged(d) * 4)


def _staged(d: int) -> int:
    """Columns of a warpgroup's dq staging tile: half the head dim, one 64-column tile at 192."""
    return TILE if d == 3 * TILE else d // WGS


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbc.BwdConfig):
    """Padded inputs -> dq f32 [B, Sq, H, D] (scaled), dk f32 [B, Sk, K, D], dv [B, Sk, K, Dv]
    (written as ``hfb.dkv_out`` says)."""
    B, sq, H, d = q.shape
    sk, K, d_v = k.shape[1], k.shape[2], v.shape[3]
    # The accumulator Ref is built invariant over the manual axes even inside shard_map(
    # check_vma=True): Mosaic GPU's mpmd_map (jax >= 0.11) refuses Refs that vary over them. Each
    # device still has its own buffer (a Ref is never shared); the sum read back below is typed
    # varying like q, as under check_vma=False, where no array carries manual axes.
    dq_acc = jax.new_ref(jnp.zeros((B, sq, H, d), F32), memory_space=plgpu.GMEM)
    out = hfb.dkv_out(B, sk, K, d)
    out_v = out if d_v == d else hfb.dkv_out(B, sk, K, d, d_v)
    kernel = alternating_kernel if d == 64 else cta_dq_kernel
    dk, dv = hfb._launch(
        functools.partial(kernel, cfg=cfg),
        (out, out_v),
        _scratch(d, q.dtype, cfg.stages, cfg.positions, cfg.segments, None if d_v == d else d_v),
        grid=(K, sk // CTA, B),
        interpret=cfg.interpret,
    )(lo, mid, hi, q, k, v, do, lse2, delta, *extra, dq_acc)
    # the tiles are added unscaled (see the module docstring)
    return (vary_like(dq_acc[...], q) * cfg.scale, *hfb.dkv_to_step(dk, dv))


def backward(
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
    bs,
    causal: bool,
    softmax_scale: float,
    interpret: bool,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """float32 dq [B, Sq, H, D], dk [B, Sk, K, D], dv [B, Sk, K, Dv] (contract in
    ``implementations.py``; optional features as ``backward.backward``'s)."""

    def check(D: int, d: int, dv: int):
        if d not in HEAD_DIMS:
            raise ValueError(
                f"pallas_hopper backward='fused': head dim {D} (padded {d}) must pad to 64, 128 or 192"
            )
        if dv > MAX_V_HEAD_DIM:
            raise ValueError(
                f"pallas_hopper backward='fused': v's head dim {v.shape[3]} (padded "
                f"{dv}) must pad to at most {MAX_V_HEAD_DIM}"
            )
        smem = smem_bytes(d, q.dtype, bs.bwd_stages, dv)
        if smem > hb.SMEM_LIMIT - 4096:
            raise ValueError(
                f"pallas_hopper backward='fused': head dim {D} with "
                f"bwd_stages={bs.bwd_stages} needs {smem} bytes of shared memory (limit "
                f"{hb.SMEM_LIMIT}); use fewer bwd_stages"
            )

    args = (q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg)
    kw = dict(bs=bs, causal=causal, softmax_scale=softmax_scale, interpret=interpret, window=window)
    kw.update(softcap=softcap, prefix=prefix, bidirectional=bidirectional)
    return hfb.key_cta_backward(_run, check, *args, **kw)
