"""The frame of the fused Pallas Mosaic GPU (Hopper) ring-step backward: one kernel for dq, dk, dv.

The FlashAttention-3 backward (Shah et al. 2024) for one step of Ring Attention (Liu, Zaharia &
Abbeel 2023), ``pallas_hopper.BlockSizes(backward="fused")`` at head dims <= 128 and MLA's 192 / 128
(the default at 64, 128 and 192 / 128). This module holds what its kernel (``cta_dq_bwd.py``, where
the two compute warpgroups of a CTA share one dq tile) is built in. Where the "mosaic" backward
(``backward.py``) runs a dq kernel and a dk/dv kernel that both recompute the probabilities (7 tile
matmuls per query block x key block pair), the fused one runs only a key-CTA kernel (grid: kv head,
key CTA, batch; ``key_cta_kernel``): each compute warpgroup keeps dk/dv of its 64 keys in float32
registers, loops over the G query heads of the kv group and their visible query blocks (the same
lo/mid/hi bounds and visiting order as the dk/dv kernel, ``bwd_common.visit``) and dq contributions
``ds @ k`` (float32) go to global memory by TMA reduce-adds (``FusedOps.reduce_add``): 5 tile
matmuls per pair. The reduce-adds arrive in a run-dependent order, so dq is not bitwise
reproducible.

dq accumulates in a zero-initialised float32 buffer, passed to the kernel as a JAX ``Ref`` (read
and written in place, i.e. aliased in and out; ``_launch``). dk and dv are in the step's layout at
head dim 64 and head-major ([B, K, Sk, D], transposed after the kernel) above it
(``dkv_head_major``, where the measurements behind the choice are: at head dim 128 and 128K tokens
the step's layout ran 0.9-6% slower; docs/kernels.md). ``ds^T`` goes through shared memory so that
wgmma can read it transposed.

With grouped heads the grid's first axis is the kv head and each key CTA loops over the group's
query heads, unless ``use_split_group`` (the default's measured rule, or ``BlockSizes.split_group``
forced) runs one key CTA per query head: k, v repeated over the group, dk, dv per query head summed
afterwards (``key_cta_backward``). The CTAs running side by side then reduce-add into one query
head's dq, not the group's, which at long lengths outgrows the L2 (results: docs/kernels.md,
2026-12-02).

A variant with one dq tile per compute warpgroup (``dq_tile="warpgroup"``) lost to the shared tile
and was deleted (docs/kernels.md, "Tried and lost").

Interpret mode (CPU): Mosaic GPU's interpreter implements neither TMA reductions nor atomics, so
``FusedOps.reduce_add`` becomes a read-modify-write of the dq tile. That is exact there because the
interpreter runs grid points one after another and each tile has one writer at a time; the device's
TMA reduce-add (and the ``wait_smem_to_gmem`` / ``commit_smem`` ordering around its staging buffer)
is checked on the device only (``tools/hopper_check.py``; results in docs/kernels.md).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention import masks
from ringattention._vma import typed_by_args
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import bwd_common as hbc
from ringattention.kernels.hopper import bwd_kernels as hbk
from ringattention.kernels.hopper import mosaic as hm

F32 = jnp.float32
WGS = hm.COMPUTE_WGS
ROWS = hb.ROWS  # own key rows per compute warpgroup and streamed query block length
CTA = hb.CTA


def dkv_head_major(d: int) -> bool:
    """Whether the key-CTA kernels write dk, dv head-major, [B, K, Sk, D] (two transposes follow),
    rather than in the step's [B, Sk, K, D] layout: measured on an H200 in
    docs/kernels.md. At head dim 128 and 128K tokens
    without a mask the step's layout ran 6% slower (1,971 against 1,855 ms) with dq scaled in the
    loop and 0.9% slower (1,829 against 1,814 ms, within that run's spread) with it scaled after
    the kernel, as now. At 16K the step's layout ran the bare backward 1.6% faster, at 32K-64K
    from 5% slower to 1.5% faster by cell, and forward+backward at 16K showed no difference next to
    cuDNN (docs/kernels.md), so head-major stays. At head dim 64 it ran 2% faster
    than head-major with a causal mask and 0.3-0.5% without one (128K tokens, kv heads 8 and 32)."""
    return d != 64


def dkv_out(B: int, sk: int, K: int, d: int, width: int | None = None) -> jax.ShapeDtypeStruct:
    """The float32 dk (and dv: ``width`` columns where v has its own head dim) a key-CTA kernel of
    padded head dim ``d`` writes, in ``dkv_head_major(d)``'s layout."""
    w = d if width is None else width
    return jax.ShapeDtypeStruct((B, K, sk, w) if dkv_head_major(d) else (B, sk, K, w), F32)


def dkv_to_step(dk: jax.Array, dv: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A key-CTA kernel's dk, dv ([B, K, Sk, D] or [B, Sk, K, D]; dv may have Dv columns) -> the
    step's [B, Sk, K, D] (dv [B, Sk, K, Dv])."""
    if dkv_head_major(dk.shape[3]):
        return jnp.swapaxes(dk, 1, 2), jnp.swapaxes(dv, 1, 2)
    return dk, dv


@dataclasses.dataclass(frozen=True)
class FusedOps(hm.Ops):
    """``hm.Ops`` plus the reduce-add of the dq path."""

    def reduce_add(self, staging_smem, x, gmem):
        """gmem += x (float32 tile) through the staging buffer and a TMA reduce-add."""
        if self.interpret:  # no TMA reductions in the interpreter: see the module docstring
            gmem[...] = gmem[...] + x
            return
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous add has read the buffer
        self.stage(staging_smem, x)
        plgpu.copy_smem_to_gmem(staging_smem, gmem, reduction_op="add")

    def flush(self):
        if not self.interpret:
            plgpu.wait_smem_to_gmem(0)


@dataclasses.dataclass(frozen=True)
class KeyCta:
    """What the compute warpgroups of a fused key-CTA kernel work with (``key_cta_kernel``)."""

    cfg: hbc.BwdConfig
    b: jax.Array  # batch row
    i: jax.Array  # key CTA index
    kvh: jax.Array  # kv head
    wg: jax.Array  # compute warpgroup
    bounds: tuple  # lo, mid, hi (+ edge) over the reversed query blocks
    ops: FusedOps
    rows: pl.Slice  # the warpgroup's own 64 keys
    own: tuple  # their positions, ids, causal positions as row vectors (``hbk.load_keys``)
    smem: tuple  # k, v, q, do, lse2, delta, positions, ids: ``hbk.kv_probs``'s order
    loaded: object  # barriers: query slot loaded, slot free
    free: object
    q_ref: object
    outs: tuple  # dq accumulator, dk, dv (GMEM)
    scratch: tuple  # the kernel's own buffers after the dk/dv kernel's
    n: jax.Array  # visible query blocks per head of the group

    def probs(self, t, masked: bool):
        """The t-th streamed pair (over the group's heads): waits for its slot, then slot, p^T
        (float32) and ds^T (16-bit) [r keys, c queries] (``hbk.kv_probs``)."""
        slot = lax.rem(t, jnp.int32(self.cfg.stages))
        plgpu.barrier_wait(self.loaded.at[slot])
        p_t, ds_t = hbk.kv_probs(self.cfg, self.ops, self.wg, slot, self.own, self.smem, masked)
        return slot, p_t, ds_t.astype(self.smem[2].dtype)

    def dq_rows(self, j, g):
        """Query head and rows of the dq tile of visit j of head g of the group."""
        h = self.kvh * self.cfg.groups + g
        blk = hbc.visit(j, self.bounds, self.i, self.q_ref.shape[1] // self.cfg.block)
        return h, pl.ds(blk * self.cfg.block, self.cfg.block)

    def loop(self, body) -> None:
        """``hbk.group_loop`` of ``body(j, (dk, dv), g, masked)`` over the visible blocks of every
        head of the group; writes the warpgroup's dk, dv rows."""
        _, dk_ref, dv_ref = self.outs
        d = self.smem[0].shape[2]
        at = (self.b, self.kvh, self.rows) if dkv_head_major(d) else (self.b, self.rows, self.kvh)
        hbk.group_loop(
            self.cfg,
            self.ops,
            body,
            self.bounds,
            self.cfg.masked,
            d,
            (dk_ref.at[at], dv_ref.at[at]),
            self.smem[1].shape[2],
        )


def key_cta_kernel(refs, cfg: hbc.BwdConfig, compute) -> None:
    """The frame of the fused key-CTA kernels (grid ("h", "i", "b") over kv heads and key CTAs,
    warpgroups "wg"; GMEM inputs as ``hbk.dkv_kernel``, then the dq accumulator, a Ref added to;
    out: dk, dv): the producer warpgroup streams the visible query blocks of every head of the kv
    group, each compute warpgroup loads its own 64 keys and runs ``compute(KeyCta)``."""
    bounds, gmem, (qp_ref, kp_ref), (qs_ref, ks_ref), outs, scratch = hbc.split_refs(refs, cfg, 3)
    q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref = gmem
    (k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s, own_bar, loaded, free) = scratch[:13]
    b, i, bounds = hbc.cta_index(cfg, bounds, reverse=False)  # causal: early keys are heaviest
    lo, hi = bounds[0], bounds[2]
    kvh, wg = lax.axis_index("h"), lax.axis_index("wg")
    n = hi - lo  # query blocks per head of the group
    slots = (q_s, do_s, lse_s, dl_s, qp_s, qs_s)
    issue = hbk.query_issuer(cfg, b, kvh, bounds, i, (q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref), slots)

    @pl.when(wg == WGS)
    def _():
        hbc.stream(cfg, n * cfg.groups, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        hm.set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
        ops = FusedOps(cfg.interpret)
        rows = pl.ds(i * (WGS * cfg.rows) + wg * cfg.rows, cfg.rows)
        gmem, smem = (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s)
        own = hbk.load_keys(
            cfg, ops, b, kvh, wg, rows, gmem, smem, own_bar.at[wg], hbc.row_prefix(refs, cfg, b)
        )
        smem = (k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        rest = (loaded, free, q_ref, tuple(outs), tuple(scratch[13:]), n)
        compute(KeyCta(cfg, b, i, kvh, wg, bounds, ops, rows, own, smem, *rest))


def _launch(body, out_type, scratch, *, grid, interpret: bool):
    """Like ``hm.launch`` but through ``pl.kernel``, which accepts Ref arguments (aliased in and
    out); ``plgpu.kernel`` does not in this jax."""
    params = None
    if interpret:
        params = hm.interpret_params()
        if params is None:
            raise NotImplementedError("this jax has no Mosaic GPU interpret mode")
    mesh = plgpu.Mesh(grid=grid, grid_names=("h", "i", "b"), num_threads=WGS + 1, thread_name="wg")

    def scoped(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch, collective_axes="wg")

    return typed_by_args(
        lambda out: pl.kernel(
            scoped,
            out_type=out,
            mesh=mesh,
            interpret=params,
            compiler_params=plgpu.CompilerParams(approx_math=True),
        ),
        out_type,
    )


# ``BlockSizes(split_group=None)`` (the default): when the fused backward runs one key CTA per query
# head (``split_group``) instead of per kv head, from the GQA A/B on an H200 (32:8:64 and 32:8:128,
# 16K-128K, 3 interleaved rounds, docs/kernels.md). Split where the kv group's float32 dq of a
# batch row (G * Sq * D * 4 bytes) is at least half the 60 MB L2 (head dim 64 without a mask: 32K
# 0.97 -> 1.00x cuDNN, 128K 0.96 -> 1.02x; 16K 1.00 -> 0.98x below it; causal 32K-128K +0.02-0.03x),
# except with a causal mask at head dim 128 (16K-64K 1.00/0.97/0.97 -> 0.95/0.94/0.96x; 128K
# 0.99 -> 1.00x), and only while the k/v repeat and per-query-head float32 dk/dv cost at most
# SPLIT_MAX_EXTRA_BYTES (at 1M tokens, 32:8:64, they would take 18 GiB).
SPLIT_MIN_GROUP_DQ_BYTES = 32 * 2**20
SPLIT_MAX_EXTRA_BYTES = 8 * 2**30


def split_group_extra_bytes(B: int, Sk: int, H: int, K: int, d: int, itemsize: int) -> int:
    """The memory ``split_group`` adds with GQA: k and v repeated over the group (16-bit) and dk, dv
    per query head instead of per kv head (float32), for padded head dim ``d``."""
    return B * Sk * (H - K) * d * 2 * (itemsize + 4)


def use_split_group(
    split_group: bool | None, q_shape: tuple, k_shape: tuple, d: int, causal: bool, itemsize: int
) -> bool:
    """Whether the fused backward runs one key CTA per query head: ``split_group`` if it is a bool
    (and the heads are grouped), else the measured rule above. ``d``: the padded head dim."""
    B, Sq, H, _ = q_shape
    Sk, K = k_shape[1], k_shape[2]
    if H == K or split_group is False:
        return False
    if split_group:
        return True
    return (
        (H // K) * Sq * d * 4 >= SPLIT_MIN_GROUP_DQ_BYTES
        and not (causal and d > 64)
        and split_group_extra_bytes(B, Sk, H, K, d, itemsize) <= SPLIT_MAX_EXTRA_BYTES
    )


def key_cta_backward(
    run,
    check,
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
    window: int | None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """What runs around the fused backward's kernel (``cta_dq_bwd``): pads, calls
    ``check(D, padded D, padded Dv)`` (raises for shapes the kernel cannot take), builds the
    config, the key-CTA bounds and the extra inputs, runs ``run`` (-> dq f32 [B, Sq, H, D], already
    scaled, dk f32 [B, Sk, K, D], dv [B, Sk, K, Dv]) and cuts the padding: float32 dq
    [B, Sq, H, D], dk [B, Sk, K, D], dv [B, Sk, K, Dv]. Optional features as ``hb.backward``'s.

    With GQA (H > K) and ``use_split_group``: the kernel runs as if every query head had its own kv
    head (k, v repeated over the group: one key CTA per query head and key block, no group loop),
    and dk, dv of the query heads are summed over each group here, in a fixed order."""
    B, Sq, H, D = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    d_pad = -(-D // 64) * 64
    split = use_split_group(bs.split_group, q.shape, k.shape, d_pad, causal, q.dtype.itemsize)
    if split:  # query head h reads kv head h // (H // K), as the group loop does
        k, v = (jnp.repeat(x, H // K, axis=2) for x in (k, v))  # [B, Sk, H, D]
    q, k, v, do, lse2, delta, q_pos, k_pos, q_seg, k_seg = hb._pad(
        q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg
    )
    check(D, q.shape[3], v.shape[3])
    segments = q_seg is not None
    positions = causal or window is not None
    extra = ((q_pos, k_pos) if positions else ()) + ((q_seg, k_seg) if segments else ())
    cfg = hbc.BwdConfig(
        rows=ROWS,
        block=ROWS,
        stages=bs.bwd_stages,
        registers=bs.registers,
        causal=causal,
        segments=segments,
        groups=H // k.shape[2],
        n_cta=k.shape[1] // CTA,
        qk_scale=softmax_scale * hm.LOG2E,
        scale=softmax_scale,
        interpret=interpret,
        window=window,
        **hb.features(softcap, prefix, bidirectional),
    )
    table = masks.block_table(
        q_pos, k_pos, q_seg, k_seg, causal, ROWS, CTA, window, prefix=prefix, bidirectional=bidirectional
    )
    bounds = hbc.key_cta_bounds(table, B, window)  # over the reversed query blocks, per key CTA
    extra += tuple(bounds[3:])  # a window's edge bound, then the prefix, are the last inputs
    extra += () if prefix is None else (hb.keep_above_min(prefix),)
    dq, dk, dv = run(*bounds[:3], q, k, v, do, lse2, delta, *extra, cfg=cfg)
    if split:  # [B, Sk, H, D] per query head -> [B, Sk, K, D]
        dk, dv = (x.reshape(B, x.shape[1], K, H // K, x.shape[3]).sum(axis=3) for x in (dk, dv))
    return dq[:, :Sq, :, :D], dk[:, :Sk, :, :D], dv[:, :Sk, :, :Dv]
