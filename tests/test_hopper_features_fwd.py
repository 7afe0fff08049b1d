"""The optional step features in the Hopper (Mosaic GPU) forward: soft-capping, a bidirectional
prefix, bidirectional segments and v's own head dim (``implementations.py``).

Interpret mode on CPU (Mosaic GPU's interpreter simulates one GPU: a ring of one device) against the
float32 step reference ``pallas_gpu.reference_forward_step`` (and through ``ring_attention`` the
float64 global reference), each feature alone and all together with a sliding window, segment ids
and GQA, at head dims 64, 128, 256 (soft-capping, Gemma 2) and 192 / 128 (MLA). The kernels are also
lowered for CUDA under both Mosaic GPU lowering semantics, and their operations counted: each
feature adds only its own operations (one multiply and one tanh per logit for the soft cap, a few
per query row for the prefix and bidirectional segments) and nothing when off (docs/kernels.md).
The backward of the features is not here (branch hopper-bwd).
"""

import collections
import dataclasses
import functools
import re
import types
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import needs_interpret
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import BF16_RTOL, Problem, check_ring, mosaic_modules, rel_err

import ringattention as ra
from ringattention import implementations
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import fwd_loops as hfl
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg

LSE_ATOL = 1e-4  # natural-log units: lse is computed in float32 from exact half-precision products
# tanh.approx.f32 (what jnp.tanh lowers to on the device with approx_math): relative error at most
# 2^-10.987 (PTX ISA); interpret mode computes the exact tanh
TANH_APPROX_RTOL = 2.0**-10.987
FEATURE_EFFECT = 5 * BF16_RTOL  # a case's features each move o by at least this (else untested)


def _segments(rng, batch: int, n: int, bidirectional: bool):
    """Sorted ids 0..3 per row; ``bidirectional``: odd ids negative (-1, -3: bidirectional)."""
    seg = np.sort(rng.integers(0, 4, (batch, n)), axis=1)
    return np.where(seg % 2 == 1, -seg, seg) if bidirectional else seg


@dataclasses.dataclass(frozen=True)
class Case:
    dim: int
    dv: int | None = None  # v's head dim (None: dim)
    causal: bool = True
    softcap: float | None = None
    prefix: tuple[int, ...] | None = None  # per batch row
    bidirectional: bool = False
    segments: bool = False
    window: int | None = None
    heads: int = 2
    kv_heads: int = 1
    sq: int = 72
    sk: int = 200
    where: str = "overlap"  # the queries' positions: after, overlapping or before the keys'
    batch: int = 1
    unseen: bool = False  # some queries in a segment no key has (they see nothing)
    logit_scale: float = 1.0
    bs: ph.BlockSizes | None = None

    def inputs(self, seed: int):
        rng = np.random.default_rng(seed)
        f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
        dv = self.dv or self.dim
        q = f(self.batch, self.sq, self.heads, self.dim)
        if self.logit_scale != 1.0:
            q = (q.astype(jnp.float32) * self.logit_scale).astype(jnp.bfloat16)
        k = f(self.batch, self.sk, self.kv_heads, self.dim)
        v = f(self.batch, self.sk, self.kv_heads, dv)
        offset = {"after": self.sk, "overlap": self.sk // 2, "before": -self.sq}[self.where]
        q_pos = jnp.arange(self.sq, dtype=jnp.int32) + offset
        k_pos = jnp.arange(self.sk, dtype=jnp.int32)
        q_seg = k_seg = None
        if self.segments:  # documents of the global sequence, as the ring deals them
            first = min(offset, 0)
            seg = _segments(rng, self.batch, max(offset + self.sq, self.sk) - first, self.bidirectional)
            q_seg, k_seg = seg[:, np.asarray(q_pos) - first], seg[:, np.asarray(k_pos) - first]
            if self.unseen:  # rows 5..12 (causal and bidirectional) in ids no key has
                q_seg[:, 5:9], q_seg[:, 9:13] = 9, -9
            q_seg, k_seg = jnp.asarray(q_seg, jnp.int32), jnp.asarray(k_seg, jnp.int32)
        return q, k, v, q_pos, k_pos, q_seg, k_seg

    def keywords(self) -> dict:
        kw = dict(
            causal=self.causal,
            softmax_scale=self.dim**-0.5,
            window=self.window,
            softcap=self.softcap,
            bidirectional=self.bidirectional,
        )
        if self.prefix is not None:
            kw["prefix"] = jnp.asarray(self.prefix, jnp.int32)
        return kw


def _check_forward(case: Case, seed: int = 0, lse_atol: float = LSE_ATOL):
    """forward_step in interpret mode against the float32 reference; returns the reference lse."""
    q, k, v, q_pos, k_pos, q_seg, k_seg = case.inputs(seed)
    kw = case.keywords()
    o, lse = ph.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=case.bs, interpret=True, **kw)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    assert o.dtype == lse.dtype == jnp.float32
    assert o.shape == ro.shape == (*q.shape[:3], v.shape[3]) and lse.shape == rlse.shape
    o, lse, rlse = np.asarray(o), np.asarray(lse), np.asarray(rlse)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    unseen = np.isneginf(rlse)  # [B, H, Sq]
    np.testing.assert_array_equal(np.isneginf(lse), unseen)
    assert np.all(o.transpose(0, 2, 1, 3)[unseen] == 0.0)  # rows that see nothing: exactly 0
    assert np.abs(lse[~unseen] - rlse[~unseen]).max() <= lse_atol
    assert rel_err(o, ro) <= BF16_RTOL
    return rlse


PINGPONG3 = ph.BlockSizes(schedule="pingpong3")

FEATURE_CASES = {
    # soft-capping alone: head dim 64 (one 256-key block: masked), logits up to ~4x the cap
    "softcap-d64": Case(64, softcap=3.0, segments=True, logit_scale=4.0),
    # head dim 128 without a causal mask: the overlapped loop (its softmax in on_s), a window's
    # masked far edge then a fully visible block
    "softcap-d128-overlap": Case(
        128, causal=False, softcap=5.0, window=200, segments=True, sq=128, sk=256, logit_scale=3.0
    ),
    # Gemma 2's head dim 256 (64-key blocks): fully visible and diagonal blocks, GQA
    "softcap-d256": Case(256, softcap=50.0, heads=2, sq=72, sk=130, logit_scale=40.0),
    # a prefix per batch row (0: plain causal; 250: keys after the queries): 64-key blocks, so
    # some run fully visible by the prefix, one is partial at its end, then the causal diagonal
    "prefix-d64": Case(64, prefix=(0, 250), batch=2, sq=128, sk=320, bs=ph.BlockSizes(block_k=64, stages=3)),
    "bidirectional-d128": Case(128, bidirectional=True, segments=True, heads=4, kv_heads=2, sq=128, sk=256),
    # MLA: q/k head dim 192, v 128, the defaults (128-key blocks)
    "mla": Case(192, dv=128, segments=True, heads=4, kv_heads=2, sq=72, sk=300),
    "mla-overlap": Case(192, dv=128, causal=False, sq=128, sk=256),
    # v's head dim padded apart: 200 -> 256 against q/k's 64
    "dv200": Case(64, dv=200, sq=64, sk=130, bs=ph.BlockSizes(block_k=64)),
    # everything together, with rows that see nothing (ids no key has, bidirectional or not)
    "all-d64": Case(
        64,
        softcap=4.0,
        prefix=(0, 150),
        bidirectional=True,
        segments=True,
        window=120,
        heads=2,
        kv_heads=1,
        sq=128,
        sk=256,
        batch=2,
        unseen=True,
        logit_scale=2.0,
        bs=ph.BlockSizes(block_k=64, stages=2),
    ),
    # three compute warpgroups (192-row CTAs): 320 rows, so the last CTA starts at row 128 and
    # its first warpgroup's rows (the CTA before wrote them) are computed but not written
    "softcap-pingpong3": Case(
        128,
        softcap=5.0,
        segments=True,
        heads=4,
        kv_heads=2,
        sq=320,
        sk=256,
        logit_scale=3.0,
        bs=PINGPONG3,
    ),
    "all-mla": Case(
        192,
        dv=128,
        softcap=20.0,
        prefix=(40, 250),
        bidirectional=True,
        segments=True,
        window=150,
        heads=2,
        kv_heads=1,
        sq=128,
        sk=256,
        batch=2,
        unseen=True,
        logit_scale=8.0,
    ),
}


# covered by all-mla (causal MLA), the lowering of dv-64-256 and test_three_warpgroups_match_two_bitwise
SLOW_CASES = ("mla", "dv200", "softcap-pingpong3")


@needs_interpret
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in FEATURE_CASES]
)
def test_forward_features_match_reference(name):
    case = FEATURE_CASES[name]
    rlse = _check_forward(case, seed=len(name))
    if case.unseen:  # the case has rows that see nothing, and rows that see something
        assert np.isneginf(rlse).any() and np.isfinite(rlse).any()
    q, k, v, *rest = case.inputs(len(name))
    want, _ = pg.reference_forward_step(q, k, v, *rest, **case.keywords())
    for feature, off in (("softcap", None), ("prefix", None), ("bidirectional", False)):
        if getattr(case, feature) not in (None, False):  # the case tests it: it moves o
            without = dataclasses.replace(case, **{feature: off}).keywords()
            assert rel_err(pg.reference_forward_step(q, k, v, *rest, **without)[0], want) >= FEATURE_EFFECT, (
                feature
            )


@needs_interpret
@pytest.mark.parametrize(
    "case",
    [
        # on .venv's jax (once): the legs run three warpgroups through the default forward
        pytest.param(
            Case(128, softcap=30.0, segments=True, sq=256, sk=256, logit_scale=20.0), marks=pytest.mark.once
        ),
        # every feature at once on 200 rows (padded to 256: the last CTA overlaps the first)
        pytest.param(dataclasses.replace(FEATURE_CASES["all-d64"], sq=200), marks=pytest.mark.slow),
    ],
    ids=["softcap-d128", "all-d64"],
)
def test_three_warpgroups_match_two_bitwise(case):
    """``schedule="pingpong3"`` (three compute warpgroups, 192-row CTAs, the last one overlapping
    the one before it) computes every row as the ping-pong of two does: the same key blocks in the
    same order, blocks hidden from a row adding exactly nothing, so o and lse are the same bits."""
    q, k, v, q_pos, k_pos, q_seg, k_seg = case.inputs(7)
    two = case.bs or ph.BlockSizes()
    three = dataclasses.replace(two, schedule="pingpong3")
    assert ph.geometry(case.sq, case.sk, case.dim, three).wgs == 3
    outs = [
        ph.forward_step(
            q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=bs, interpret=True, **case.keywords()
        )
        for bs in (two, three)
    ]
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_interpret
@pytest.mark.parametrize("softcap", [pytest.param(None, marks=pytest.mark.slow), 30.0])
def test_logits_times_100_do_not_overflow(softcap):
    """Logits scaled by 100 (q x 100): with and without the soft cap (the cap saturates the
    tanh), with a prefix and bidirectional segments; finite, and as the reference."""
    _check_forward(
        Case(
            64,
            softcap=softcap,
            prefix=(100,),
            bidirectional=True,
            segments=True,
            sq=72,
            sk=200,
            logit_scale=100.0,
        ),
        seed=3,
    )


@needs_interpret
def test_softcap_logits_times_100_in_blocks_no_mask_touches():
    """Soft-capped logits x 100 in the loop without a mask (head dim 128, causal, a whole 128-row
    query tile after two 128-key blocks; a part tile's padding rows would mask them). The row
    maximum there must be the capped logits' (the raw one, ~100x the cap, would flush every
    probability to zero; a variant that capped the raw maximum once per row was timed and lost:
    docs/kernels.md)."""
    _check_forward(Case(128, softcap=30.0, sq=128, sk=256, where="after", logit_scale=100.0), seed=5)


@needs_interpret
@pytest.mark.parametrize(
    "sign",
    ["alternating", pytest.param("up", marks=pytest.mark.slow), pytest.param("down", marks=pytest.mark.slow)],
)
def test_softcap_within_tolerance_with_approximate_tanh(sign, monkeypatch):
    """The device computes the cap's tanh as ``tanh.approx.f32`` (relative error <= 2^-10.987);
    interpret mode's tanh is exact. Here every tanh is off by that bound (in alternating signs, or
    all up or all down, the systematic worst case), at Gemma 2's cap of 50 with logits near it:
    o stays within the bfloat16 tolerance, and lse within ``C * 2^-10.987`` more than
    ``LSE_ATOL`` (each capped logit ``C * t`` moves by at most ``C * |t| * 2^-10.987``)."""
    exact = hfl.capped

    def perturbed(cfg, s):
        t = exact(cfg, s)
        if cfg.softcap is None:
            return t
        if sign == "alternating":  # +, -, +, ... along the keys
            flip = jax.lax.broadcasted_iota(jnp.int32, t.shape, 1) % 2 * 2 - 1
        else:
            flip = 1 if sign == "up" else -1
        return t * (1.0 + flip * TANH_APPROX_RTOL)

    monkeypatch.setattr(hfl, "capped", perturbed)
    cap = 50.0
    _check_forward(
        Case(128, softcap=cap, segments=True, sq=72, sk=200, logit_scale=40.0),
        seed=4,
        lse_atol=LSE_ATOL + cap * TANH_APPROX_RTOL,
    )


def _ring_problem(**fields):
    base = dict(
        n=1,
        layout="zigzag",
        causal=True,
        segments=True,
        batch=2,
        shard=128,
        heads=4,
        kv_heads=2,
        head_dim=64,
        dtype="bfloat16",
    )
    return Problem(**{**base, **fields})


@needs_interpret
@pytest.mark.parametrize(
    "pb",
    [
        _ring_problem(softcap=10.0, prefix=True, bidirectional=True, window=100, logit_scale=4.0),
        # each feature alone: on .venv's jax only (the matrix's jax run them all together, above)
        pytest.param(_ring_problem(softcap=10.0, logit_scale=4.0), marks=pytest.mark.once),
        pytest.param(_ring_problem(prefix=True), marks=pytest.mark.once),
        pytest.param(_ring_problem(bidirectional=True), marks=pytest.mark.once),
        _ring_problem(head_dim=192, v_head_dim=128),
        pytest.param(
            _ring_problem(
                head_dim=192,
                v_head_dim=128,
                softcap=20.0,
                prefix=True,
                bidirectional=True,
                window=100,
                logit_scale=4.0,
            ),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            _ring_problem(head_dim=256, softcap=20.0, window=100, logit_scale=4.0), marks=pytest.mark.slow
        ),
    ],
    ids=[
        "all-window",
        "softcap",
        "prefix",
        "bidirectional",
        "mla",
        "mla-all-window",
        "gemma2-256-softcap-window",
    ],
)
def test_ring_of_one_matches_float64(pb, registered):
    """``ring_attention`` on a ring of one device against the float64 global reference, forward
    and gradients: the Mosaic GPU forward and the default Mosaic backward of each feature."""
    check_ring(pb, implementation="pallas_hopper", interpret=True)


@pytest.fixture
def registered():
    """pallas_hopper claims every optional feature (implementations.py)."""
    assert implementations.resolve("pallas_hopper").features == frozenset(implementations.FEATURES)


# ---- pure-JAX parts: always run ----------------------------------------------------------------


def test_feature_keywords_are_validated():
    q = jax.ShapeDtypeStruct((2, 128, 2, 64), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((128,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 128), jnp.int32)
    step = functools.partial(ph.forward_step, softmax_scale=0.125, interpret=True)

    def refused(match, v=q, causal=True, s=None, **kw):
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(functools.partial(step, causal=causal, **kw), q, q, v, pos, pos, s, s)

    for cap in (0.0, -1.0, True, float("nan")):
        refused(r"pallas_hopper: softcap=", softcap=cap)
    refused(r"pallas_hopper: prefix needs causal=True", causal=False, prefix=jnp.zeros(2, jnp.int32))
    refused(r"pallas_hopper: prefix.shape=\(3,\) must be \[2\]", prefix=jnp.zeros(3, jnp.int32))
    refused(r"pallas_hopper: bidirectional=True needs causal=True and segment ids", bidirectional=True)
    refused(r"pallas_hopper: bidirectional=True needs causal", causal=False, s=seg, bidirectional=True)
    refused(r"bad shapes", v=jax.ShapeDtypeStruct((2, 128, 2, 320), jnp.bfloat16))  # Dv > 256
    refused(r"bad shapes", v=jax.ShapeDtypeStruct((2, 128, 1, 128), jnp.bfloat16))
    mla = jax.ShapeDtypeStruct((2, 128, 2, 192), jnp.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"block_k=128, stages=3, schedule='pingpong' \(2 query tiles\) at head dim 192, v head dim 128",
    ):
        jax.eval_shape(
            functools.partial(step, causal=True, block_sizes=ph.BlockSizes(stages=3)),
            mla,
            mla,
            jax.ShapeDtypeStruct((2, 128, 2, 128), jnp.bfloat16),
            pos,
            pos,
            None,
            None,
        )


def test_mla_defaults_fit_shared_memory():
    """MLA's (192 / 128) forward takes head dim 128's tiles (untuned), which fit, with two compute
    warpgroups (three 192-wide q tiles do not fit: ``test_shared_memory_budget_is_checked``), and
    its backward is the fused kernel in 2 stages (3 do not fit); equal head dims keep their
    defaults; other pairs take the larger head dim's row."""
    for causal in (True, False):
        bs = ph.default_block_sizes(192, causal, v_head_dim=128)
        base = ph.default_block_sizes(128, causal)
        assert (bs.block_k, bs.stages, bs.registers) == (base.block_k, base.stages, base.registers)
        assert bs.schedule == ("pingpong" if causal else base.schedule)
        assert (bs.backward, bs.bwd_stages) == ("fused", 2)  # cta_dq_bwd's three dq tiles
        assert hcb.smem_bytes(192, jnp.bfloat16, 2, 128) <= ph.SMEM_LIMIT - 4096
        assert hcb.smem_bytes(192, jnp.bfloat16, 3, 128) > ph.SMEM_LIMIT - 4096  # why 2 stages
        assert ph.default_block_sizes(128, causal, v_head_dim=128) == base
        assert ph.default_block_sizes(64, causal, v_head_dim=200) == ph.default_block_sizes(256, causal)
    geo = ph.geometry(128, 256, 192, bs, 128)
    assert (geo.d_pad, geo.v_pad, geo.bk) == (192, 128, 128)
    assert ph.geometry(128, 256, 64, bs, 40).v_pad == 64


def _mosaic_kernels(fn, *args, semantics: str = "default"):
    """[(operation counts, number of custom-call operands)] of the Mosaic GPU kernels of ``fn``
    lowered for CUDA; the counts include each inline assembly's instruction as ``asm:<name>``."""
    params = plgpu.CompilerParams
    if semantics == "warpgroup":
        params = functools.partial(plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    jax.clear_caches()  # the kernels' jitted wrappers would reuse the other semantics' lowering
    with mosaic_modules() as texts, mock.patch.object(plgpu, "CompilerParams", params):
        hlo = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"stablehlo.custom_call @mosaic_gpu\w*\(([^)]*)\)", hlo)
    assert len(texts) == len(calls) >= 1, (len(texts), len(calls))
    kernels = []
    for text, call in zip(texts, calls, strict=True):
        ops = collections.Counter(re.findall(r"= ([a-z_]+\.[a-z_.]+)", text))
        ops.update(
            "asm:" + m.split()[0]
            for m in re.findall(r'llvm.inline_asm (?:has_side_effects )?"([^"]*)"', text)
        )
        kernels.append((ops, len(call.split(","))))
    return kernels


def _lower(*, dim=128, dv=None, causal=True, segments=False, prefix=False, semantics="default", **kw):
    q = jax.ShapeDtypeStruct((2, 512, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 512, 2, dim), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 512, 2, dv or dim), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((512,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 512), jnp.int32) if segments else None
    pf = jax.ShapeDtypeStruct((2,), jnp.int32) if prefix else None

    def fwd(q, k, v, p, s, pf):
        return ph.forward_step(q, k, v, p, p, s, s, prefix=pf, causal=causal, softmax_scale=dim**-0.5, **kw)

    [kernel] = _mosaic_kernels(fwd, q, k, v, pos, seg, pf, semantics=semantics)
    return kernel


LOWER_CASES = {  # each feature, and all of them; jax 0.10's lane and jax >= 0.11's warpgroup semantics
    "softcap-d128": dict(softcap=30.0),
    "softcap-d256-window": dict(dim=256, softcap=50.0, window=100, segments=True),
    "softcap-overlap": dict(
        causal=False, softcap=30.0, block_sizes=ph.BlockSizes(schedule="overlap", registers=240)
    ),
    "prefix-d64": dict(dim=64, prefix=True),
    "bidirectional": dict(segments=True, bidirectional=True),
    "mla": dict(dim=192, dv=128),
    "mla-overlap": dict(dim=192, dv=128, causal=False),
    "dv-64-256": dict(dim=64, dv=256, causal=False, segments=True),
    "all-mla": dict(
        dim=192, dv=128, softcap=20.0, prefix=True, bidirectional=True, segments=True, window=100
    ),
    "all-pingpong3": dict(
        softcap=20.0, prefix=True, bidirectional=True, segments=True, window=100, block_sizes=PINGPONG3
    ),
}


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
@pytest.mark.parametrize("name", list(LOWER_CASES))
def test_feature_kernels_lower_for_cuda(name, semantics):
    """One Mosaic GPU kernel per forward; the soft cap's tanh is ``tanh.approx.f32`` (one per
    logit); a prefix is one more operand."""
    kw = LOWER_CASES[name]
    ops, operands = _lower(semantics=semantics, **kw)
    want = 6 + 2 * (kw.get("causal", True) or "window" in kw) + 2 * kw.get("segments", False)
    assert operands == want + ("window" in kw) + kw.get("prefix", False)
    assert (ops["asm:tanh.approx.f32"] > 0) == ("softcap" in kw)
    assert "math.tanh" not in ops


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
def test_features_add_only_their_own_operations(semantics):
    """Against the plain kernel (head dim 128, causal: two key-block loops of [64, 128] logits per
    warpgroup, 64 per thread each): the soft cap adds one multiply (vectors of two) and one
    ``tanh.approx.f32`` per logit and nothing else per logit; a prefix adds one scalar load and a
    few operations per query row; bidirectional segments a few per query row (the causal mask
    stays one compare per logit). None removes anything: the feature-off kernels are the plain
    ones (their MLIR identical to before the features, diffed by hand: docs/kernels.md)."""
    plain, _ = _lower(semantics=semantics)
    plain_ids, _ = _lower(semantics=semantics, segments=True)
    per_thread = 2 * 64 * 128 // 128  # logits per compute thread over the two loops
    assert plain["asm:tanh.approx.f32"] == 0
    for kw, base in (
        (dict(softcap=30.0), plain),
        (dict(prefix=True), plain),
        (dict(segments=True, bidirectional=True), plain_ids),
    ):
        ops, _ = _lower(semantics=semantics, **kw)
        added = ops - base
        assert not base - ops, (kw, base - ops)
        if "softcap" in kw:
            assert added["asm:tanh.approx.f32"] == per_thread
            assert added["arith.mulf"] == per_thread // 2
            assert all(n <= per_thread for n in added.values()), added
        else:  # per query row, not per logit
            assert all(n <= 5 for op, n in added.items() if op.startswith("arith.")), (kw, added)
            assert added["memref.load"] == kw.get("prefix", False)


def test_kernels_lower_without_load_deprecations():
    """``plgpu.load``'s index argument: required by jax 0.10, deprecated by 0.11 (one warning per
    load: 212 in one ``make test-gpu``), gone in 0.12. The kernels pass it only where it is
    required, so lowering the loads of positions and ids warns on no jax."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*index separately", category=DeprecationWarning)
        ops, operands = _lower(segments=True)
    assert operands == 10 and ops["asm:ex2.approx.ftz.f32"] > 0


def _h200(mesh=None):
    return types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")


def test_features_under_check_vma_lower_the_same_kernels(registered):
    """A user's shard_map over ("dp", "sp") on 2 x 2 H200s, the ring forward with every feature
    (MLA head dims, the soft cap, a prefix sharded over "dp", so varying, bidirectional segments)
    lowered for CUDA: under check_vma=True the same Mosaic GPU kernel as under False but for the
    folded ``+ 0`` of each bound read (``mosaic.bound``: lo, mid, hi and the prefix)."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "sp"))
    sd = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
    args = (
        sd(2, 512, 4, 192),
        sd(2, 512, 2, 192),
        sd(2, 512, 2, 128),
        sd(2, 512, dt=jnp.int32),
        sd(2, dt=jnp.int32),
    )

    def ring(check_vma):
        def local(q, k, v, seg, prefix):
            return ra.ring_attention(
                q,
                k,
                v,
                "sp",
                causal=True,
                segment_ids=seg,
                logits_soft_cap=30.0,
                prefix_length=prefix,
                bidirectional_segments=True,
                implementation="auto",
            )

        return jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(P("dp", "sp"),) * 4 + (P("dp"),),
            out_specs=P("dp", "sp"),
            check_vma=check_vma,
        )

    with mock.patch.object(implementations, "mesh_device", _h200):
        assert (
            implementations.resolve("auto", needs=frozenset(implementations.FEATURES)).name == "pallas_hopper"
        )
        checked, unchecked = (_mosaic_kernels(ring(vma), *args) for vma in (True, False))
    assert len(checked) == len(unchecked) >= 1
    for (a, _), (b, _) in zip(checked, unchecked, strict=True):
        extra = a - b
        assert not b - a and set(extra) <= {"arith.addi", "arith.constant"}, (extra, b - a)
        assert extra["arith.addi"] <= 4
        assert a["asm:tanh.approx.f32"] > 0
