"""The optional step features in the Hopper (Mosaic GPU) forward: soft-capping, a bidirectional
prefix, bidirectional segments and v's own head dim (``implementations.py``), in interpret mode.

Interpret mode on CPU (Mosaic GPU's interpreter simulates one GPU: a ring of one device) against the
float32 step reference ``pallas_gpu.reference_forward_step`` (and through ``ring_attention`` the
float64 global reference), each feature alone and all together with a sliding window, segment ids
and GQA, at head dims 64, 128, 256 (soft-capping, Gemma 2) and 192 / 128 (MLA). The kernels lowered
for CUDA, with each feature's operations counted: test_hopper_features_fwd_lowering.py; what the
two share: hopper_feature_cases.py. The backward of the features: test_hopper_features_bwd.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import LSE_ATOL, needs_interpret
from hopper_feature_cases import PINGPONG3, Case, _check_forward
from ringcheck import BF16_RTOL, Problem, check_ring, rel_err

from ringattention.kernels.hopper import fwd_loops as hfl
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg

# tanh.approx.f32 (what jnp.tanh lowers to on the device with approx_math): relative error at most
# 2^-10.987 (PTX ISA); interpret mode computes the exact tanh
TANH_APPROX_RTOL = 2.0**-10.987
FEATURE_EFFECT = 5 * BF16_RTOL  # a case's features each move o by at least this (else untested)

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
