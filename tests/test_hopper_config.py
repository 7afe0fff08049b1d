"""What the Pallas Mosaic GPU (Hopper) step decides before any kernel runs: pure JAX, always run.

The geometry (CTA rows, padding to CTA and key blocks, three warpgroups) and the padding's masks;
``BlockSizes`` validation and the default backward per head dim and mask (the backward modules
replaced by fakes that record their calls); bad inputs and shared-memory budgets refused before
tracing; registration, and not picked on CPU.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ringattention import implementations
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.hopper import split_bwd as hsb
from ringattention.kernels.triton import pallas_gpu as pg


def test_geometry_pads_to_cta_and_key_blocks():
    bs = ph.BlockSizes(block_k=128)
    geo = ph.geometry(200, 300, 80, bs)
    assert (geo.cta_rows, geo.sq_pad, geo.bk, geo.sk_pad, geo.d_pad) == (128, 256, 128, 384, 128)
    short = ph.geometry(40, 70, 64, bs)  # a short shard takes one key block of its padded length
    assert (short.sq_pad, short.bk, short.sk_pad, short.d_pad) == (128, 128, 128, 64)
    assert ph.geometry(40, 50, 64, bs).bk == 64


def test_geometry_of_three_warpgroups():
    """``schedule="pingpong3"``: 192-row CTAs over a shard padded to 64 rows only (the last CTA
    overlaps the one before it), or two warpgroups where the shard is shorter than 192 rows."""
    bs = ph.BlockSizes(schedule="pingpong3")
    geo = ph.geometry(32768, 32768, 128, bs)
    assert (geo.wgs, geo.cta_rows, geo.sq_pad, geo.nq) == (3, 192, 32768, 171)
    geo = ph.geometry(200, 300, 128, bs)
    assert (geo.wgs, geo.sq_pad, geo.nq) == (3, 256, 2)
    assert (ph.geometry(130, 300, 128, bs).wgs, ph.geometry(130, 300, 128, bs).sq_pad) == (3, 192)
    assert (ph.geometry(100, 300, 128, bs).wgs, ph.geometry(100, 300, 128, bs).sq_pad) == (2, 128)
    q_pos = jnp.arange(256, dtype=jnp.int32)
    rows, _ = ph._cta_queries(geo, q_pos, None)  # the second CTA holds rows 64..255
    np.testing.assert_array_equal(np.asarray(rows), np.r_[0:192, 64:256])


def test_padding_hides_padded_keys_and_queries():
    geo = ph.geometry(70, 90, 64, ph.BlockSizes())
    x = jnp.ones((1, 70, 2, 64), jnp.bfloat16)
    kx = jnp.ones((1, 90, 1, 64), jnp.bfloat16)
    pos_q, pos_k = jnp.arange(70, dtype=jnp.int32), jnp.arange(90, dtype=jnp.int32)
    q, k, v, q_pos, k_pos, q_seg, k_seg = ph._pad(geo, x, kx, kx, pos_q, pos_k, None, None)
    assert q.shape == (1, geo.sq_pad, 2, 64) and k.shape == (1, geo.sk_pad, 1, 64)
    assert np.all(np.diff(np.asarray(q_pos)) >= 0) and np.all(np.diff(np.asarray(k_pos)) >= 0)
    vis = np.asarray(q_seg)[0, :, None] == np.asarray(k_seg)[0, None, :]  # [Sq_pad, Sk_pad]
    assert not vis[:, 90:].any() and not vis[70:, :].any() and vis[:70, :90].all()


def test_block_sizes_are_validated():
    with pytest.raises(ValueError, match="block_k"):
        ph.BlockSizes(block_k=96)
    with pytest.raises(ValueError, match="stages"):
        ph.BlockSizes(stages=1)
    with pytest.raises(ValueError, match="bwd_stages"):
        ph.BlockSizes(bwd_stages=0)
    with pytest.raises(ValueError, match="bwd_block_k"):
        ph.BlockSizes(bwd_block_k=96)
    with pytest.raises(ValueError, match="backward"):
        ph.BlockSizes(backward="cuda")
    with pytest.raises(TypeError, match="triton"):
        ph.BlockSizes(triton=ph.BlockSizes())
    with pytest.raises(ValueError, match="schedule"):
        ph.BlockSizes(schedule="ping-pong")
    with pytest.raises(ValueError, match="registers"):
        ph.BlockSizes(registers=224)
    with pytest.raises(TypeError, match="split_group"):
        ph.BlockSizes(split_group="true")
    assert ph.default_block_sizes(64) != ph.default_block_sizes(128)
    assert all(
        ph.default_block_sizes(d, c).split_group is None for d in (64, 128, 256) for c in (True, False)
    )  # decided per call from the shapes


def test_default_backward_by_head_dim(backward_used):
    """The default backward, checked by the kernel each head dim's default calls: fused with one
    dq tile per CTA up to 128 (the alternating kernel at 64 and below, the column split at
    65-128: ``cta_dq_bwd`` both), the deterministic head-dim-split pair above 128."""
    for d, name in ((40, "cta"), (64, "cta"), (96, "cta"), (128, "cta"), (256, "split")):
        q = jax.ShapeDtypeStruct((1, 256, 4, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, 64, 2, d), jnp.bfloat16)
        ints = [jax.ShapeDtypeStruct(shape, jnp.int32) for shape in ((256,), (64,))]
        lse = jax.ShapeDtypeStruct((1, 4, 256), jnp.float32)
        backward_used.clear()
        jax.eval_shape(
            functools.partial(ph.backward_step, causal=True, softmax_scale=0.1, interpret=True),
            q,
            k,
            k,
            q,
            lse,
            lse,
            *ints,
            None,
            None,
        )
        assert backward_used == [name], d
    assert ph.deterministic_block_sizes(None, 64).backward == "mosaic"


def test_default_backward_follows_the_mask(backward_used):
    """``backward_step`` without block sizes takes the defaults of its head dim *and mask*: at head
    dim 64 the causal backward runs with 240 registers, the unmasked one with 232."""
    q = jax.ShapeDtypeStruct((1, 256, 4, 64), jnp.bfloat16)
    ints = jax.ShapeDtypeStruct((256,), jnp.int32)
    lse = jax.ShapeDtypeStruct((1, 4, 256), jnp.float32)
    for causal in (True, False):
        jax.eval_shape(
            functools.partial(ph.backward_step, causal=causal, softmax_scale=0.1, interpret=True),
            q,
            q,
            q,
            q,
            lse,
            lse,
            ints,
            ints,
            None,
            None,
        )
    assert backward_used == ["cta", "cta"]
    assert backward_used.block_sizes == [ph.default_block_sizes(64, True), ph.default_block_sizes(64, False)]
    assert [bs.registers for bs in backward_used.block_sizes] == [240, 232]


def test_fused_backward_above_head_dim_128_is_refused(backward_used):
    """``BlockSizes(backward="fused")`` above head dim 128 is a ValueError naming the head dim and
    "mosaic" (the backward there), raised before any kernel is traced, whatever the dtype; at 128
    it runs the fused kernel."""
    for d, dtype in ((129, jnp.bfloat16), (256, jnp.float16), (256, jnp.float32), (128, jnp.bfloat16)):
        q = jax.ShapeDtypeStruct((1, 128, 4, d), dtype)
        k = jax.ShapeDtypeStruct((1, 128, 2, d), dtype)
        pos = jax.ShapeDtypeStruct((128,), jnp.int32)
        lse = jax.ShapeDtypeStruct((1, 4, 128), jnp.float32)
        step = functools.partial(
            ph.backward_step,
            causal=True,
            softmax_scale=0.1,
            interpret=True,
            block_sizes=ph.BlockSizes(backward="fused"),
        )
        if d == 128:
            jax.eval_shape(step, q, k, k, q, lse, lse, pos, pos, None, None)
            continue
        with pytest.raises(ValueError, match=f"head dim {d} is above 128.*'mosaic'"):
            jax.eval_shape(step, q, k, k, q, lse, lse, pos, pos, None, None)
    assert backward_used == ["cta"]


class _Calls(list):
    """The names of the backward modules called, and (``block_sizes``) the BlockSizes each got."""

    block_sizes: list


@pytest.fixture
def backward_used(monkeypatch):
    """Records which Mosaic backward module ``pallas_hopper.backward_step`` calls and with which
    block sizes (without running it: each returns zeros of the contract's shapes)."""
    calls = _Calls()
    calls.block_sizes = []

    def fake(name):
        def backward(q, k, *args, bs, **kw):
            calls.append(name)
            calls.block_sizes.append(bs)
            return (
                jnp.zeros(q.shape, jnp.float32),
                jnp.zeros(k.shape, jnp.float32),
                jnp.zeros(k.shape, jnp.float32),
            )

        return backward

    for name, module in (("mosaic", hb), ("cta", hcb), ("split", hsb)):
        monkeypatch.setattr(module, "backward", fake(name))
    return calls


def test_bad_inputs_are_rejected_before_tracing():
    q = jnp.zeros((1, 64, 4, 64), jnp.bfloat16)
    k = jnp.zeros((1, 64, 3, 64), jnp.bfloat16)
    pos = jnp.arange(64, dtype=jnp.int32)
    kw = dict(causal=True, softmax_scale=1.0)
    with pytest.raises(ValueError, match="shapes"):
        ph.forward_step(q, k, k, pos, pos, None, None, **kw)
    k = jnp.zeros((1, 64, 2, 64), jnp.float16)
    with pytest.raises(TypeError, match="dtype"):
        ph.forward_step(q, k, k, pos, pos, None, None, **kw)
    with pytest.raises(TypeError, match="block_sizes"):
        ph.forward_step(q, q[:, :, :2], q[:, :, :2], pos, pos, None, None, block_sizes=pg.BlockSizes(), **kw)
    with pytest.raises(ValueError, match="softmax_scale"):
        ph.forward_step(q, q[:, :, :2], q[:, :, :2], pos, pos, None, None, causal=True, softmax_scale=-0.5)


def test_shared_memory_budget_is_checked():
    q = jnp.zeros((1, 128, 2, 256), jnp.bfloat16)
    pos = jnp.arange(128, dtype=jnp.int32)
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    kw = dict(causal=True, softmax_scale=1.0)

    def refused(match, fn, x, kw=kw, **more):
        """``fn`` on q = k = v = do = ``x`` (lse and delta zero) raises ``match``."""
        with pytest.raises(ValueError, match=match):
            fn(x, x, x, x, lse, lse, pos, pos, None, None, **kw, **more)

    with pytest.raises(ValueError, match="shared memory"):
        ph.forward_step(q, q, q, pos, pos, None, None, block_sizes=ph.BlockSizes(block_k=128, stages=3), **kw)
    # MLA's 192-wide q tiles: three (schedule="pingpong3") do not fit beside 2 stages of k and v
    x, v128, p192 = (
        jnp.zeros((1, 192, 2, 192), q.dtype),
        jnp.zeros((1, 192, 2, 128), q.dtype),
        jnp.arange(192),
    )
    with pytest.raises(ValueError, match=r"schedule='pingpong3' \(3 query tiles\)"):
        ph.forward_step(
            x, x, v128, p192, p192, None, None, block_sizes=ph.BlockSizes(schedule="pingpong3"), **kw
        )
    # the head-dim-split pair: 2 stages at most
    refused("shared memory", ph.backward_step, q, block_sizes=ph.BlockSizes(backward="mosaic", bwd_stages=3))
    q = q[..., :128]  # the fused backward: 3 stages fit
    refused("shared memory", ph.backward_step, q, block_sizes=ph.BlockSizes(backward="fused", bwd_stages=4))
    width = lambda d: jnp.zeros(q.shape[:3] + (d,), q.dtype)  # noqa: E731
    step = dict(causal=True, softmax_scale=0.1, interpret=True)
    fused = lambda **bs: dict(bs=ph.BlockSizes(backward="fused", **bs), **step)  # noqa: E731
    # q/k and v of one head dim: v above 128 does not fit beside dk; q/k 256 not at all
    refused("must pad to at most 128", hcb.backward, width(192), kw=fused())
    with pytest.raises(ValueError, match="must pad to 64, 128 or 192"):
        hcb.backward(width(256), width(256), q, q, lse, lse, pos, pos, None, None, **fused())
    # MLA's 192 / 128: 2 stages fit, 3 do not
    mla = (width(192), width(192), q, q, lse, lse, pos, pos, None, None)
    with pytest.raises(ValueError, match="shared memory"):
        hcb.backward(*mla, **fused(bwd_stages=3))
    assert hcb.smem_bytes(192, q.dtype, 2, 128) <= ph.SMEM_LIMIT - 4096


def test_registered_and_not_picked_on_cpu():
    assert "pallas_hopper" in implementations.names()
    impl = implementations.resolve("pallas_hopper")
    assert impl.platforms == ("gpu",)
    if jax.default_backend() == "cpu":
        assert not ph.available()
        assert implementations.resolve("auto").name != "pallas_hopper"
