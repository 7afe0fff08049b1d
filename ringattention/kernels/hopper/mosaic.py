"""Mosaic GPU pieces shared by every Hopper kernel (FlashAttention-3, Shah et al. 2024).

The launch of a kernel of two (the forward's ``"pingpong3"``: three) compute warpgroups and one
producer warpgroup (``launch``, also under ``shard_map(check_vma=True)``), the register split
between them (``set_registers``), loop bounds read from kernel arguments (``bound``), the window
mask, the forward's static configuration (``FwdConfig``) and ``Ops``: the few operations that only
exist on the device (wgmma through accumulator refs, register layouts), which with
``interpret=True`` become plain ``jnp`` so the same kernels, barriers and TMA pipelines run in
Mosaic GPU's interpret mode on CPU. Used by the forward
(``fwd_kernel.py``, ``fwd_loops.py``) and every backward (``backward.py``, ``bwd_common.py``,
``bwd_kernels.py``, ``fused_bwd.py``, ``cta_dq_bwd.py``, ``split_bwd.py``, ``split_kernels.py``).
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

F32 = jnp.float32
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
COMPUTE_WGS = 2
REGISTER_CHOICES = (232, 240)  # compute warpgroups; the producer keeps what is left (40/24); 224 lost
# everywhere it was timed (docs/kernels.md)
# The forward's three-warpgroup schedule ("pingpong3"): 3 x 128 x 160 + 128 x 32 fills the 65,536
# registers of an SM, FA3's split for three consumer warpgroups.
THREE_WG_REGISTERS = 160


def launch_registers(wgs: int) -> int:
    """Registers per thread at launch of ``wgs`` compute warpgroups and a producer: 65536 over the
    CTA's threads, rounded down to a multiple of 8 (168 for two, 128 for three)."""
    return 65536 // ((wgs + 1) * 128) // 8 * 8


def set_registers(registers: int, compute: bool, interpret: bool, wgs: int = COMPUTE_WGS) -> None:
    """Re-balances the register file between the roles (``setmaxnreg``): the ``wgs`` compute
    warpgroups take ``registers`` each, the producer the rest of the launch allocation, so the CTA's
    total stays put."""
    if interpret:
        return
    if compute:
        plgpu.set_max_registers(registers, action="increase")
    else:
        producer = (wgs + 1) * launch_registers(wgs) - wgs * registers
        plgpu.set_max_registers(producer, action="decrease")


_IDX = inspect.signature(plgpu.load).parameters.get("idx")
# jax 0.10 requires the index; 0.11 deprecates it (a warning per call) and 0.12 removed it
_LOAD_TAKES_INDEX = _IDX is not None and _IDX.default is inspect.Parameter.empty


def _load(ref, layout):
    """SMEM -> registers in ``layout`` (``plgpu.load``'s index argument: required in jax 0.10,
    deprecated in 0.11, gone in 0.12)."""
    if _LOAD_TAKES_INDEX:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def _unoptimized_store():
    """jax >= 0.12's ``store(ref, value, optimized=False)``, or None (older jax: no such check)."""
    try:
        from jax._src.pallas.mosaic_gpu.primitives import store
    except ImportError:
        return None
    return store


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


def launch(body, out_type, scratch, *, grid: tuple[int, int, int], interpret: bool, wgs: int = COMPUTE_WGS):
    """``plgpu.kernel`` over grid axes ("h", "i", "b") with ``wgs`` compute + one producer warpgroups.

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
    mesh = plgpu.Mesh(grid=grid, grid_names=("h", "i", "b"), num_threads=wgs + 1, thread_name="wg")
    compiler_params = plgpu.CompilerParams(approx_math=True)

    def scoped(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch, collective_axes="wg")

    typed = typed_by_args(
        lambda out: pl.kernel(
            scoped,
            out_type=out,
            mesh=mesh,
            interpret=params,
            compiler_params=compiler_params,
            name=getattr(body, "__name__", "anonymous"),
        ),
        out_type,
    )

    def call(*args):
        if any(_vma(a) for a in args if isinstance(a, jax.Array)):
            return typed(*args)
        return plgpu.kernel(
            body,
            out_type=out_type,
            scratch_types=scratch,
            grid=grid,
            grid_names=("h", "i", "b"),
            num_threads=wgs + 1,
            thread_name="wg",
            compiler_params=compiler_params,
            interpret=params,
        )(*args)

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

    def store(self, ref, x):
        """GMEM ``ref[...] = x`` from a wgmma tile. In 16 bits each thread holds 4 bytes of a row's
        32-byte sector (float32: 8), which jax >= 0.12 refuses as an optimized store ("does not
        access a whole number of complete 32 byte sectors"); the unoptimized one issues the same
        stores, and older jax does not check."""
        store = None if self.interpret or jnp.dtype(x.dtype).itemsize == 4 else _unoptimized_store()
        if store is None:
            ref[...] = x
        else:
            store(ref, x, optimized=False)

    def stage(self, smem, x):
        """Registers -> SMEM, visible to the async proxy (TMA, wgmma) afterwards."""
        smem[...] = x
        if not self.interpret:
            plgpu.commit_smem()

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
        return lax.dot_general(
            self._operand(a), self._operand(b), (((1,), (0,)), ((), ())), preferred_element_type=F32
        )

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

        return pl.run_scoped(
            scope, plgpu.WGMMAAccumulatorRef(shape, F32), plgpu.WGMMAAccumulatorRef(acc.shape, F32)
        )

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
    wgs: int = COMPUTE_WGS  # compute warpgroups (3: "pingpong3", registers THREE_WG_REGISTERS)

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
