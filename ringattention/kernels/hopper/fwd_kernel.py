"""Kernel body of the Pallas Mosaic GPU (Hopper) ring-step forward.

FlashAttention-3 (Shah et al. 2024) structure, written for sm_90: every CTA owns ``2 * bq`` query rows
of one (batch, query head) and runs three warpgroups. Warpgroups 0 and 1 compute (``bq`` rows each,
wgmma from shared memory, float32 online softmax in the log2 domain); warpgroup 2 is the producer and
streams the key/value blocks ``[lo, hi)`` of the step through a ring of ``stages`` shared-memory
slots with TMA, each slot guarded by a "loaded" barrier (TMA arrivals) and a "free" barrier (one
arrival per compute warpgroup). An optional schedule barrier makes the two compute warpgroups take
turns on the tensor cores (one's softmax overlaps the other's matmuls). The softmax takes the row
maximum of the unscaled logits, so each probability is one FMA and one ``exp2``; the next key
block is awaited while the current P·V product is in flight. The compute warpgroups' key-block
loops (and FA3's intra-warpgroup overlap of one block's softmax with the previous block's P·V,
``FwdConfig.overlap``) are in ``hopper_fwd_loops.py``.

Masking is the one of the Triton step (``gpu_kernels.py``): the wrapper derives per-CTA block
bounds from ``masks.block_table``; blocks in ``[lo, mid)`` are fully visible and run without a mask,
blocks in ``[mid, hi)`` compare global positions (``k_pos <= q_pos``) and segment ids elementwise,
all other blocks are never loaded. Key positions / ids travel with their key block through TMA. A
sliding window (``|q_pos - k_pos| < window``) adds a bound ``edge``: blocks ``[lo, edge)`` at the
window's far edge run masked before the fully visible ones (without a window the kernel is as before).

Optional features (``implementations.py``), each a static ``FwdConfig`` field, off by default (the
kernel is then lowered exactly as without it): a soft cap (``softcap``: each logit pays one multiply
and one ``tanh.approx.f32``, ``hopper_fwd_loops.capped``; the row maximum of the tanh values is the
capped one, so the softmax stays one pass), a bidirectional prefix per batch row (``prefix``: one
scalar per CTA) and bidirectional segments (``bidirectional``): both relax the causal mask, whose
relaxed form is folded into a per-row limit (``causal_limit``), so partially visible blocks still
pay one compare per element for it (fully visible ones, prefix and bidirectional blocks included,
none: ``masks.block_table``). v may have its own head dim (``Dv``: v slots ``[S, bk, Dv]``, the
accumulator ``[bq, Dv]``).

``Ops`` isolates the few operations that only exist on the device (wgmma through accumulator refs,
register layouts); with ``interpret=True`` they become plain ``jnp`` so the same kernel, barriers
and TMA pipeline run in Mosaic GPU's interpret mode on CPU. Shapes in comments: ``bq`` rows per
compute warpgroup, ``bk`` keys per block, ``D`` the padded head dim, ``S`` stages.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention._vma import _vma, typed_by_args
from ringattention.kernels.hopper import fwd_loops as hfl

F32 = jnp.float32
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
COMPUTE_WGS = 2
LAUNCH_REGISTERS = 168  # per thread at launch: 65536 / 384 threads, rounded down to a multiple of 8
REGISTER_CHOICES = (232, 240)  # compute warpgroups; the producer keeps what is left (40/24); 224 lost
# everywhere it was timed (docs/kernels.md)


def set_registers(registers: int, compute: bool, interpret: bool) -> None:
    """Re-balances the register file between the roles (``setmaxnreg``): the compute warpgroups take
    ``registers`` each, the producer the rest of the launch allocation, so the CTA's total stays put."""
    if interpret:
        return
    if compute:
        plgpu.set_max_registers(registers, action="increase")
    else:
        producer = (COMPUTE_WGS + 1) * LAUNCH_REGISTERS - COMPUTE_WGS * registers
        plgpu.set_max_registers(producer, action="decrease")


_LOAD_TAKES_INDEX = "idx" in inspect.signature(plgpu.load).parameters  # jax < 0.12


def _load(ref, layout):
    """SMEM -> registers in ``layout`` (``plgpu.load`` lost its index argument in jax 0.12)."""
    if _LOAD_TAKES_INDEX:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def interpret_params():
    """Mosaic GPU interpret-mode parameters, or None where this jax has no such mode."""
    for name in ("InterpretParams", "InterpretGPUParams"):
        if hasattr(plgpu, name):
            return getattr(plgpu, name)()
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:
        return None
    return InterpretGPUParams()


def launch(body, out_type, scratch, *, grid: tuple[int, int, int], interpret: bool):
    """``plgpu.kernel`` over grid axes ("h", "i", "b") with two compute + one producer warpgroups.

    Where the operands vary over manual axes (``shard_map(check_vma=True)``) the same kernel is
    built through ``pl.kernel`` + ``pl.run_scoped`` with outputs varying like the operands:
    ``plgpu.kernel`` traces the body with varying-axes checks switched off while the refs keep the
    operands' axes, so its loops would not type-check. Elsewhere ``plgpu.kernel`` itself (its
    batching rule serves the model's vmapped ring of one).
    """
    params = None
    if interpret:
        params = interpret_params()
        if params is None:
            raise NotImplementedError("this jax has no Mosaic GPU interpret mode")
    mesh = plgpu.Mesh(grid=grid, grid_names=("h", "i", "b"), num_threads=COMPUTE_WGS + 1,
                      thread_name="wg")
    compiler_params = plgpu.CompilerParams(approx_math=True)

    def scoped(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch, collective_axes="wg")

    typed = typed_by_args(lambda out: pl.kernel(
        scoped, out_type=out, mesh=mesh, interpret=params, compiler_params=compiler_params,
        name=getattr(body, "__name__", "anonymous")), out_type)

    def call(*args):
        if any(_vma(a) for a in args if isinstance(a, jax.Array)):
            return typed(*args)
        return plgpu.kernel(body, out_type=out_type, scratch_types=scratch, grid=grid,
                            grid_names=("h", "i", "b"), num_threads=COMPUTE_WGS + 1,
                            thread_name="wg", compiler_params=compiler_params,
                            interpret=params)(*args)

    return call


def bound(x):
    """A loop bound read from a kernel argument, as the loop counters see it. Inside
    ``shard_map(check_vma=True)`` the argument refs keep the operands' varying axes while the body
    is traced with varying-axes checks off, so a loop counter started at ``x`` would change type
    at ``+ 1``: ``x + 0`` (folded by the compiler) drops them. Outside (or under
    ``check_vma=False``) ``x`` itself, so those kernels are unchanged."""
    return x + jnp.int32(0) if _vma(x) else x


@dataclasses.dataclass(frozen=True)
class Smem:
    """A wgmma operand in shared memory, read as stored ([m, k] / [k, n]) or ``transposed``."""

    ref: Any
    transposed: bool = False


@dataclasses.dataclass(frozen=True)
class Ops:
    """Device-only operations, or their plain-JAX stand-ins in interpret mode."""

    interpret: bool

    def rows(self, ref):
        """A [n] vector in SMEM -> registers laid out to broadcast along a wgmma tile's rows."""
        if self.interpret:
            return ref[...]
        return _load(ref, plgpu.Layout.WGMMA.reduce(1))

    def cols(self, ref):
        """A [n] vector in SMEM -> registers laid out to broadcast along a wgmma tile's columns."""
        if self.interpret:
            return ref[...]
        return _load(ref, plgpu.Layout.WGMMA.reduce(0))

    def full(self, shape, value):
        x = jnp.full(shape, value, F32)
        if self.interpret:
            return x
        layout = plgpu.Layout.WGMMA if len(shape) == 2 else plgpu.Layout.WGMMA.reduce(1)
        return plgpu.layout_cast(x, layout)

    def _operand(self, x):
        """Registers stay registers; ``Smem`` becomes the (transposed) ref, or its value when
        interpreting."""
        if not isinstance(x, Smem):
            return x
        if self.interpret:
            return x.ref[...].T if x.transposed else x.ref[...]
        return x.ref.transpose((1, 0)) if x.transposed else x.ref  # what transpose_ref did

    def _issue(self, acc_ref, a, b):
        plgpu.wgmma(acc_ref, self._operand(a), self._operand(b))

    def _dot(self, a, b):
        return lax.dot_general(self._operand(a), self._operand(b), (((1,), (0,)), ((), ())),
                               preferred_element_type=F32)

    def qk(self, q_smem, k_smem, shape, after_issue=None):
        """float32 [bq, bk] = q [bq, D] @ k[bk, D]^T, both operands in SMEM. ``after_issue`` runs
        while the wgmma is in flight (FA3's hand-over of the tensor cores)."""
        a, b = Smem(q_smem), Smem(k_smem, transposed=True)
        if self.interpret:
            if after_issue is not None:
                after_issue()
            return self._dot(a, b)

        def scope(acc_ref):
            self._issue(acc_ref, a, b)
            if after_issue is not None:
                after_issue()
            return acc_ref[...]

        return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32))

    def pv(self, acc, p, v_smem, after_issue=None):
        """acc [bq, D] + p [bq, bk] (registers) @ v [bk, D] (SMEM); ``after_issue`` runs while the
        wgmma is in flight."""
        if self.interpret:
            if after_issue is not None:
                after_issue()
            return acc + self._dot(p, Smem(v_smem))

        def scope(acc_ref):
            self._issue(acc_ref, p, Smem(v_smem))
            if after_issue is not None:
                after_issue()

        return pl.run_state(scope)(plgpu.WGMMAAccumulatorRef.init(acc))

    def qk_pv(self, q_smem, k_smem, shape, acc, p, v_smem, before_pv, after_issue, on_s):
        """FA3's intra-warpgroup overlap: issues s = q @ k^T ([bq, bk], SMEM operands), then
        ``before_pv()`` (e.g. the wait for v) while it runs, then ``acc + p @ v`` (p [bq, bk] in
        registers); ``after_issue`` runs with both in flight and ``on_s(s)`` once s has landed,
        while p @ v is still in flight. Returns (on_s(s), acc + p @ v). Nothing between the two
        issues writes registers a wgmma reads (ptxas would serialize them, C7513)."""
        a, b = Smem(q_smem), Smem(k_smem, transposed=True)
        if self.interpret:
            before_pv()
            after_issue()
            return on_s(self._dot(a, b)), acc + self._dot(p, Smem(v_smem))

        def scope(s_ref, o_ref):
            o_ref[...] = acc
            self._issue(s_ref, a, b)
            before_pv()
            self._issue(o_ref, p, Smem(v_smem))
            after_issue()
            x = on_s(plgpu.wgmma_accumulator_load(s_ref, wait_n=1))  # s only; p @ v runs on
            return x, o_ref[...]

        return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32),
                             plgpu.WGMMAAccumulatorRef(acc.shape, F32))

    def pair(self, first, second, shape, on_first):
        """Two float32 ``shape`` products ``a @ b`` (``first``, ``second``: (a, b) of ``Smem``)
        issued back to back; returns ``(on_first(first product), second product)``, with
        ``on_first`` running while the second wgmma is still in flight."""
        if self.interpret:
            return on_first(self._dot(*first)), self._dot(*second)

        def scope(acc1, acc2):
            self._issue(acc1, *first)
            self._issue(acc2, *second)
            x = on_first(plgpu.wgmma_accumulator_load(acc1, wait_n=1))  # the first group only
            return x, acc2[...]

        acc = plgpu.WGMMAAccumulatorRef(shape, F32)
        return pl.run_scoped(scope, acc, acc)

    def mma(self, *terms):
        """``acc + a @ b`` for each (acc, a, b), all issued before one wait. acc: float32 registers,
        or a shape for a zero accumulator; a: registers or ``Smem``; b: ``Smem``."""
        accs = [self.full(acc, 0.0) if isinstance(acc, tuple) else acc for acc, _, _ in terms]
        if self.interpret:
            return tuple(acc + self._dot(a, b) for acc, (_, a, b) in zip(accs, terms, strict=True))

        def scope(refs):
            for ref, (_, a, b) in zip(refs, terms, strict=True):
                self._issue(ref, a, b)

        return pl.run_state(scope)(tuple(plgpu.WGMMAAccumulatorRef.init(acc) for acc in accs))


@dataclasses.dataclass(frozen=True)
class FwdConfig:
    bq: int  # query rows per compute warpgroup
    bk: int
    stages: int
    causal: bool
    segments: bool
    groups: int  # query heads per kv head
    nq: int  # CTAs along the query shard
    qk_scale: float  # softmax_scale * log2(e)
    pingpong: bool
    interpret: bool
    registers: int = 232  # per compute-warpgroup thread (REGISTER_CHOICES)
    window: int | None = None  # sliding window: keys with |q_pos - k_pos| >= window are hidden
    overlap: bool = False  # softmax of block j while P.V of block j-1 is in flight (FA3)
    # Optional features (implementations.py), each off by default, when the kernel is the one
    # without it (gated statically: nothing of it is lowered)
    softcap: float | None = None  # logits C * tanh(softmax_scale * q.k / C) (Gemma 2)
    prefix: bool = False  # a bidirectional prefix per batch row: one more input, int32 [B]
    bidirectional: bool = False  # queries of negative segments see their whole segment

    @property
    def positions(self) -> bool:
        """Whether query / key positions are loaded (causal masks and windows compare them)."""
        return self.causal or self.window is not None

    @property
    def logit_scale(self) -> float:
        """The factor of a logit in the exponent (log2 units): ``qk_scale``, or with ``softcap``
        ``C * log2(e)`` (the loops' logits are then ``tanh(softmax_scale * q.k / C)``)."""
        return self.qk_scale if self.softcap is None else self.softcap * LOG2E

    @property
    def cap_scale(self) -> float:
        """``softmax_scale / C``: what a raw logit q.k is multiplied by inside the tanh."""
        return self.qk_scale / (LOG2E * self.softcap)

    @property
    def relaxed(self) -> bool:
        """Whether the causal mask is relaxed (prefix or bidirectional segments): keys after a
        query may be visible, so a window is then checked on both sides."""
        return self.prefix or self.bidirectional


def window_mask(causal: bool, window: int, q_pos, k_pos):
    """bool: ``|q_pos - k_pos| < window`` (q_pos, k_pos broadcast to one shape; causal: the upper
    side only, the causal mask covers the other)."""
    d = q_pos - k_pos
    return d < window if causal else (d < window) & (-d < window)


def causal_limit(cfg: FwdConfig, q_pos, q_seg, prefix):
    """int32 [bq]: the last key position each query row sees under the causal mask relaxed by
    ``prefix`` (a scalar: keys before it are visible) and ``bidirectional`` (rows of negative
    segments see every position), so the relaxed mask is one compare per element, like the plain
    one (``masks.visible``: kp <= qp or kp < prefix or q_seg < 0). None without either."""
    if not cfg.relaxed:
        return None
    if cfg.prefix:  # kp < prefix <=> kp <= prefix - 1 (prefix clamped so that it cannot wrap)
        lim = jnp.maximum(q_pos, jnp.maximum(prefix, jnp.int32(-(2**31) + 1)) - 1)
    else:
        lim = q_pos
    return jnp.where(q_seg < 0, jnp.int32(2**31 - 1), lim) if cfg.bidirectional else lim


def _mask(cfg: FwdConfig, ops: Ops, s, q_pos, q_seg, kpos_smem, kseg_smem, q_lim=None):
    """s [bq, bk] with hidden entries set to -inf (positions / ids: row vectors or SMEM refs;
    ``q_lim``: :func:`causal_limit`'s rows where the causal mask is relaxed)."""
    vis = None
    col = lambda ref: lax.broadcast_in_dim(ops.cols(ref), s.shape, [1])  # noqa: E731
    if cfg.causal:
        vis = col(kpos_smem) <= lax.broadcast_in_dim(q_pos if q_lim is None else q_lim, s.shape,
                                                      [0])
    if cfg.window is not None:
        near = window_mask(cfg.causal and not cfg.relaxed, cfg.window,
                           lax.broadcast_in_dim(q_pos, s.shape, [0]), col(kpos_smem))
        vis = near if vis is None else vis & near
    if cfg.segments:
        same = col(kseg_smem) == lax.broadcast_in_dim(q_seg, s.shape, [0])
        vis = same if vis is None else vis & same
    return jnp.where(vis, s, -jnp.inf)


def fwd_kernel(*refs, cfg: FwdConfig):
    """Entry point for ``plgpu.kernel`` (grid axes "h", "i", "b"; warpgroup axis "wg").

    GMEM inputs: lo/mid/hi int32 [B, nq]; q [B, Sq, H, D]; k, v [B, Sk, K, D]; then (causal or
    window) q_pos [Sq], k_pos [Sk]; then (segments) q_seg [B, Sq], k_seg [B, Sk]; then (window) edge
    int32 [B, nq]; then (prefix) prefix int32 [B]. v may have its own head dim Dv: v [B, Sk, K, Dv].
    GMEM outputs: o f32 [B, Sq, H, Dv] (the step's layout: a warpgroup's tile is 64 rows of Dv
    contiguous floats, H * Dv apart, and no transpose follows the kernel), lse f32 [B, H, Sq]
    (natural log).
    """
    n_in = 6 + 2 * cfg.positions + 2 * cfg.segments + (cfg.window is not None) + cfg.prefix
    ins, (o_ref, lse_ref), scratch = refs[:n_in], refs[n_in:n_in + 2], refs[n_in + 2:]
    lo_ref, mid_ref, hi_ref, q_ref, k_ref, v_ref, *rest = ins
    qp_ref, kp_ref = (rest.pop(0), rest.pop(0)) if cfg.positions else (None, None)
    qs_ref, ks_ref = (rest.pop(0), rest.pop(0)) if cfg.segments else (None, None)
    edge_ref = rest.pop(0) if cfg.window is not None else None
    pf_ref = rest.pop(0) if cfg.prefix else None
    b, h, qi = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("i")
    if cfg.causal:  # the heaviest query blocks (latest positions) start first
        qi = cfg.nq - 1 - qi
    lo, mid, hi = bound(lo_ref[b, qi]), bound(mid_ref[b, qi]), bound(hi_ref[b, qi])
    g = dict(b=b, h=h, qi=qi, lo=lo, mid=mid, hi=hi, q_ref=q_ref, k_ref=k_ref, v_ref=v_ref,
             qp_ref=qp_ref, kp_ref=kp_ref, qs_ref=qs_ref, ks_ref=ks_ref, o_ref=o_ref,
             lse_ref=lse_ref)
    if edge_ref is not None:
        g["edge"] = bound(edge_ref[b, qi])
    if pf_ref is not None:  # one scalar per CTA: its batch row's prefix
        g["prefix"] = bound(pf_ref[b])
    wg = lax.axis_index("wg")
    pl.when(wg < COMPUTE_WGS)(lambda: _compute(cfg, wg, *scratch, **g))
    pl.when(wg == COMPUTE_WGS)(lambda: _produce(cfg, *scratch, **g))


def _produce(cfg, q_smem, k_smem, v_smem, qpos_smem, kpos_smem, qseg_smem, kseg_smem, q_bar, k_bar,
             v_bar, k_free, v_free, sched, *, b, h, lo, hi, k_ref, v_ref, kp_ref, ks_ref, **_):
    """Producer warpgroup: TMA key/value blocks [lo, hi) into the slot ring."""
    set_registers(cfg.registers, compute=False, interpret=cfg.interpret)
    kvh = lax.div(h, jnp.int32(cfg.groups))

    def load(j, carry):
        t = j - lo
        slot = lax.rem(t, jnp.int32(cfg.stages))
        rows = pl.ds(j * cfg.bk, cfg.bk)

        @pl.when(t >= cfg.stages)
        def _():
            plgpu.barrier_wait(k_free.at[slot])

        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, kvh], k_smem.at[slot], k_bar.at[slot])
        if cfg.positions:
            plgpu.copy_gmem_to_smem(kp_ref.at[rows], kpos_smem.at[slot], k_bar.at[slot])
        if cfg.segments:
            plgpu.copy_gmem_to_smem(ks_ref.at[b, rows], kseg_smem.at[slot], k_bar.at[slot])

        @pl.when(t >= cfg.stages)
        def _():
            plgpu.barrier_wait(v_free.at[slot])

        plgpu.copy_gmem_to_smem(v_ref.at[b, rows, kvh], v_smem.at[slot], v_bar.at[slot])
        return carry

    lax.fori_loop(lo, hi, load, None)

    def drain(j, carry):  # observe the last releases, so no barrier phase goes unseen
        slot = lax.rem(j - lo, jnp.int32(cfg.stages))
        plgpu.barrier_wait(k_free.at[slot])
        plgpu.barrier_wait(v_free.at[slot])
        return carry

    lax.fori_loop(jnp.maximum(lo, hi - cfg.stages), hi, drain, None)


def _compute(cfg, wg, q_smem, k_smem, v_smem, qpos_smem, kpos_smem, qseg_smem, kseg_smem, q_bar,
             k_bar, v_bar, k_free, v_free, sched, *, b, h, qi, lo, mid, hi, q_ref, qp_ref, qs_ref,
             o_ref, lse_ref, edge=None, prefix=None, **_):
    """Compute warpgroup ``wg``: rows [row0, row0 + bq) of the CTA's query block."""
    set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
    ops = Ops(cfg.interpret)
    bq, dv = q_smem.shape[1], v_smem.shape[2]  # dv: v's (padded) head dim, the accumulator's
    row0 = qi * (COMPUTE_WGS * bq) + wg * bq
    rows = pl.ds(row0, bq)
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[wg], q_bar.at[wg])
    if cfg.positions:
        plgpu.copy_gmem_to_smem(qp_ref.at[rows], qpos_smem.at[wg], q_bar.at[wg])
    if cfg.segments:
        plgpu.copy_gmem_to_smem(qs_ref.at[b, rows], qseg_smem.at[wg], q_bar.at[wg])
    plgpu.barrier_wait(q_bar.at[wg])
    q_pos = ops.rows(qpos_smem.at[wg]) if cfg.positions else None  # [bq]
    q_seg = ops.rows(qseg_smem.at[wg]) if cfg.segments else None
    q_lim = causal_limit(cfg, q_pos, q_seg, prefix)  # [bq] | None (prefix / bidirectional)

    def turn():  # hand the tensor cores to the other compute warpgroup
        if cfg.pingpong:
            plgpu.barrier_arrive(sched)
            plgpu.barrier_wait(sched)

    def wait_keys(j):  # block j's keys: awaited while the previous block's PV is in flight
        @pl.when(j < hi)
        def _():
            plgpu.barrier_wait(k_bar.at[lax.rem(j - lo, jnp.int32(cfg.stages))])

    def mask(s, slot):  # s [bq, bk] with hidden entries -inf
        at = lambda ref: None if ref is None else ref.at[slot]  # noqa: E731
        return _mask(cfg, ops, s, q_pos, q_seg, at(kpos_smem), at(kseg_smem), q_lim)

    def write(acc, m, l):
        seen = l > 0.0
        inv = 1.0 / jnp.where(seen, l, 1.0)  # [bq]: one reciprocal per row, then multiplies
        o_ref.at[b, rows, h][...] = acc * lax.broadcast_in_dim(inv, acc.shape, [0])
        lse_ref.at[b, h, rows][...] = jnp.where(seen, m * LN2 - jnp.log(inv), -jnp.inf)

    w = hfl.Warpgroup(cfg, ops, q_smem.at[wg], k_smem, v_smem, k_bar, v_bar, k_free, v_free, sched,
                   turn, wait_keys, mask, lo, mid, hi, edge)
    wait_keys(lo)
    if not cfg.overlap:
        pl.when(wg == 1)(turn)
        carry = hfl.loops(w)
        pl.when(wg == 0)(turn)
        write(*carry)
        return

    @pl.when(lo < hi)  # the overlapped loop starts with block lo's QK^T
    def _():
        pl.when(wg == 1)(turn)
        carry = hfl.overlap_loops(w)
        pl.when(wg == 0)(turn)
        write(*carry)

    pl.when(lo >= hi)(lambda: write(ops.full((bq, dv), 0.0), ops.full((bq,), -jnp.inf),
                                    ops.full((bq,), 0.0)))
