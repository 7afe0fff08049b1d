"""A lone ring step writes the final dtype (``Implementation.out_dtype``, ``implementations.py``).

Where the forward lap is one step (a ring of one device, Ulysses) and no sinks are merged, nothing
merges its output, so ``pallas_hopper``'s kernel writes o in q's dtype instead of float32 that XLA
converts after: the same bits (both round to nearest even), without the float32 write and the
conversion. Checked here: the kernel's two output dtypes bitwise (interpret mode), who passes
``out_dtype`` (a recording implementation on CPU rings of 1, 2 and 4, with and without sinks, and
Ulysses), its validation, and the kernel's lowering for CUDA on every jax of the matrix (jax 0.12
refuses the 16-bit tile as an optimized GMEM store: ``mosaic.Ops.store``; where v's head dim is
q's, a final o leaves through the q slot and one TMA store instead: ``fwd_kernel.write``).
"""

import sys
import types
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import needs_interpret
from hopper_feature_cases import Case, _lower
from ringcheck import Problem, check_ring, mosaic_modules

from ringattention import blockwise, implementations
from ringattention.kernels.hopper import pallas_hopper as ph

BITWISE_CASES = {  # forward_step's kernel with o in float32 and in bfloat16 (d64: bfloat16 o
    # through the q slot and a TMA store; MLA, v's head dim not q's: register stores)
    "d64-softcap-ids": Case(dim=64, softcap=20.0, segments=True, sq=128, sk=256),
    "mla-bidirectional": Case(dim=192, dv=128, segments=True, bidirectional=True, sq=128, sk=200),
}


@needs_interpret
@pytest.mark.parametrize("name", list(BITWISE_CASES))
def test_kernel_writes_the_final_dtype_bitwise(name):
    case = BITWISE_CASES[name]
    q, k, v, q_pos, k_pos, q_seg, k_seg = case.inputs(seed=3)
    step = lambda **kw: ph.forward_step(  # noqa: E731
        q, k, v, q_pos, k_pos, q_seg, k_seg, interpret=True, **case.keywords(), **kw
    )
    o32, lse32 = step()
    o16, lse16 = step(out_dtype=jnp.bfloat16)
    assert o32.dtype == jnp.float32 and o16.dtype == jnp.bfloat16 and o16.shape == o32.shape
    assert np.array_equal(np.asarray(o16), np.asarray(o32.astype(jnp.bfloat16)))
    assert np.array_equal(np.asarray(lse16), np.asarray(lse32))
    assert float(jnp.abs(o32).max()) > 0.1  # not an empty step


def test_out_dtype_is_validated():
    q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((128,), jnp.int32)
    step = lambda **kw: jax.eval_shape(  # noqa: E731
        lambda q, p: ph.forward_step(q, q, q, p, p, None, None, causal=True, softmax_scale=0.1, **kw), q, pos
    )
    with pytest.raises(ValueError, match=r"out_dtype=float16 must be float32 or q's dtype"):
        step(out_dtype=jnp.float16)
    assert step(out_dtype=jnp.bfloat16)[0].dtype == jnp.bfloat16
    assert step(out_dtype=None)[0].dtype == step(out_dtype=jnp.float32)[0].dtype == jnp.float32


@pytest.fixture
def recording():
    """A step implementation "recording" (the XLA step that honours ``out_dtype``) whose
    forward_step records the keywords of each call."""
    calls = []

    def forward_step(*args, out_dtype=None, **kw):
        calls.append(out_dtype)
        o, lse = blockwise.forward_step(*args, **kw)
        return (o if out_dtype is None else o.astype(out_dtype)), lse

    mod = types.ModuleType("_recording_step")
    mod.forward_step, mod.backward_step = forward_step, blockwise.backward_step
    impl = implementations.Implementation(
        "recording", mod.__name__, ("cpu",), features=frozenset(implementations.FEATURES), out_dtype=True
    )
    with (
        mock.patch.dict(sys.modules, {mod.__name__: mod}),
        mock.patch.dict(implementations._REGISTRY, {"recording": impl}),
    ):
        yield calls


@pytest.mark.parametrize(
    "pb, lone",
    [
        (Problem(n=1, dtype="bfloat16", segments=True), True),
        (Problem(n=1, dtype="bfloat16", ulysses=2, heads=4, kv_heads=2), True),
        (Problem(n=1, dtype="bfloat16", sinks=True), False),  # merged into a float32 o
        (Problem(n=2, dtype="bfloat16"), False),
        (Problem(n=4, layout="zigzag", dtype="bfloat16", segments=True), False),
    ],
    ids=["ring-1", "ulysses-2", "ring-1-sinks", "ring-2", "ring-4-zigzag"],
)
def test_ring_passes_out_dtype_to_a_lone_step_only(pb, lone, recording):
    check_ring(pb, implementation="recording")  # against the float64 reference, as before
    assert recording, "the recording step never ran"
    assert set(recording) == ({jnp.dtype(jnp.bfloat16)} if lone else {None}), recording


def test_implementations_without_it_get_no_out_dtype():
    """The keyword is never passed to an implementation that does not take it (they keep working):
    only pallas_hopper declares it."""
    takes = {name for name in implementations.names() if implementations.resolve(name).out_dtype}
    assert takes == {"pallas_hopper"}


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
def test_final_dtype_kernel_lowers_for_cuda(semantics):
    """MLA's forward (the widest o tile, 64 x 128 per warpgroup) with o in bfloat16: the same kernel
    as with float32 plus the conversions (one per vector of o's registers), nothing removed."""
    f32, n32 = _lower(dim=192, dv=128, semantics=semantics)
    b16, n16 = _lower(dim=192, dv=128, semantics=semantics, out_dtype=jnp.bfloat16)
    assert n16 == n32
    added, removed = b16 - f32, f32 - b16
    assert not removed, removed
    assert added["arith.truncf"] > 0 and set(added) <= {"arith.truncf", "builtin.unrealized_conversion_cast"}


TMA_STORE = "nvvm.cp.async.bulk.tensor.global.shared.cta"  # Mosaic GPU's SMEM -> GMEM TMA copy


@pytest.mark.parametrize(
    ("dim", "dv", "out_dtype", "staged"),
    [
        (128, None, jnp.bfloat16, True),
        (128, None, None, False),  # float32 o: twice the q slot's bytes, register stores
        (192, 128, jnp.bfloat16, False),  # MLA: o's tile is not the q slot's shape
    ],
)
def test_final_o_leaves_through_the_q_slot_and_a_tma_store(dim, dv, out_dtype, staged):
    """The forward's only SMEM -> GMEM TMA copy is a final o's (the kernel loads by TMA, and writes
    lse and float32 o from registers), awaited before the kernel ends."""
    q = jax.ShapeDtypeStruct((2, 512, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 512, 2, dim), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 512, 2, dv or dim), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((512,), jnp.int32)

    def fwd(q, k, v, p):
        return ph.forward_step(q, k, v, p, p, None, None, causal=True, softmax_scale=0.1, out_dtype=out_dtype)

    jax.clear_caches()
    with mosaic_modules() as texts:
        jax.jit(fwd).trace(q, k, v, pos).lower(lowering_platforms=("cuda",))
    [text] = texts
    assert (TMA_STORE in text) == staged
    assert ("nvvm.cp.async.bulk.wait_group" in text) == staged
