"""The optional step features in the Hopper (Mosaic GPU) forward, pure JAX (always run): the
feature keywords' checks, MLA's default tiles, and the kernels lowered for CUDA under both Mosaic GPU
lowering semantics with their operations counted: each feature adds only its own operations (one
multiply and one tanh per logit for the soft cap, a few per query row for the prefix and
bidirectional segments) and nothing when off (docs/kernels.md), the same under ``check_vma``.

The features in interpret mode: test_hopper_features_fwd.py; what the two share:
hopper_feature_cases.py.
"""

import functools
import types
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_feature_cases import PINGPONG3, _lower, _mosaic_kernels
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ringattention as ra
from ringattention import implementations
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import pallas_hopper as ph


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
    warpgroups (three 192-wide q tiles do not fit: ``test_shared_memory_budget_is_checked``), in
    the ping-pong with a causal mask and FA3's overlap without one, and
    its backward is the fused kernel in 2 stages (3 do not fit); equal head dims keep their
    defaults; other pairs take the larger head dim's row."""
    for causal in (True, False):
        bs = ph.default_block_sizes(192, causal, v_head_dim=128)
        base = ph.default_block_sizes(128, causal)
        assert (bs.block_k, bs.stages, bs.registers) == (base.block_k, base.stages, base.registers)
        assert bs.schedule == ("pingpong" if causal else "overlap")  # head dim 128's need three
        assert (bs.backward, bs.bwd_stages) == ("fused", 2)  # cta_dq_bwd's three dq tiles
        assert hcb.smem_bytes(192, jnp.bfloat16, 2, 128) <= ph.SMEM_LIMIT - 4096
        assert hcb.smem_bytes(192, jnp.bfloat16, 3, 128) > ph.SMEM_LIMIT - 4096  # why 2 stages
        assert ph.default_block_sizes(128, causal, v_head_dim=128) == base
        assert ph.default_block_sizes(64, causal, v_head_dim=200) == ph.default_block_sizes(256, causal)
    geo = ph.geometry(128, 256, 192, bs, 128)
    assert (geo.d_pad, geo.v_pad, geo.bk) == (192, 128, 128)
    assert ph.geometry(128, 256, 64, bs, 40).v_pad == 64


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
