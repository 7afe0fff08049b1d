"""Layouts (reordering, positions) and block classification of masks."""

import jax.numpy as jnp
import numpy as np
import pytest

from ringattention import layouts, masks


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("n", (1, 2, 3, 8))
def test_layout_roundtrip_and_positions(layout, n):
    L = 4 * n
    x = jnp.arange(2 * L).reshape(2, L) * 10
    y = layouts.to_layout(x, layout, n)
    np.testing.assert_array_equal(layouts.from_layout(y, layout, n), x)
    pos = layouts.positions(L, layout, n)
    np.testing.assert_array_equal(y, x[:, pos])
    assert sorted(pos.tolist()) == list(range(L))
    shard = L // n
    for r in range(n):
        np.testing.assert_array_equal(
            layouts.shard_positions(layout, shard, n, r), pos[r * shard : (r + 1) * shard]
        )
        assert np.all(np.diff(pos[r * shard : (r + 1) * shard]) > 0)


def test_layout_definitions():
    # N = 2, L = 8: the definitions, written out.
    np.testing.assert_array_equal(layouts.positions(8, "striped", 2), [0, 2, 4, 6, 1, 3, 5, 7])
    np.testing.assert_array_equal(layouts.positions(8, "zigzag", 2), [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(layouts.positions(8, "contiguous", 2), np.arange(8))


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_a_ring_of_one_is_natural_order_for_any_length(layout):
    for length in (1, 7, 10):
        np.testing.assert_array_equal(layouts.permutation(length, layout, 1), np.arange(length))
        np.testing.assert_array_equal(layouts.shard_positions(layout, length, 1, 0), np.arange(length))
    assert layouts.parts(layout, 1) == 1
    assert layouts.parts(layout, 4) == (8 if layout == "zigzag" else 4)


def test_layout_errors():
    with pytest.raises(ValueError, match="layout="):
        layouts.positions(8, "spiral", 2)
    with pytest.raises(ValueError, match="seq_len=6 .* layout='striped'"):
        layouts.positions(6, "zigzag", 2)
    with pytest.raises(ValueError, match="seq_len=7"):
        layouts.to_layout(jnp.zeros((1, 7)), "striped", 2)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seg", (False, True))
def test_block_table_matches_elementwise_mask(causal, seg):
    rng = np.random.default_rng(0)
    q_pos = jnp.asarray(np.sort(rng.choice(100, 16, replace=False)), jnp.int32)
    k_pos = jnp.asarray(np.sort(rng.choice(100, 24, replace=False)), jnp.int32)
    q_seg = jnp.asarray(np.sort(rng.integers(0, 3, (2, 16)), -1), jnp.int32) if seg else None
    k_seg = jnp.asarray(np.sort(rng.integers(0, 3, (2, 24)), -1), jnp.int32) if seg else None
    vis = np.asarray(masks.visible(q_pos, k_pos, q_seg, k_seg, causal))
    table = np.asarray(masks.block_table(q_pos, k_pos, q_seg, k_seg, causal, 4, 8))
    blocks = vis.reshape(vis.shape[0], 4, 4, 3, 8)
    any_, all_ = blocks.any((2, 4)), blocks.all((2, 4))
    np.testing.assert_array_equal(table == masks.SKIP, ~any_)
    np.testing.assert_array_equal(table == masks.FULL, all_)


def test_causal_work_balance():
    # Per-device work at N=8: zigzag and striped balance it, contiguous does not.
    work = {lay: layouts.causal_work(lay, 8, 64, 8) for lay in layouts.LAYOUTS}
    totals = {lay: w.sum(1) for lay, w in work.items()}
    assert totals["contiguous"].max() >= 4 * totals["contiguous"].min()
    assert totals["zigzag"].max() == totals["zigzag"].min()
    assert totals["striped"].max() <= 1.2 * totals["striped"].min()
    # all layouts do the same total work (the causal triangle at block granularity, up to the
    # diagonal blocks which striped cannot skip)
    assert work["contiguous"].sum() <= work["zigzag"].sum() <= work["striped"].sum()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("prefix,bidirectional", [(True, False), (False, True), (True, True)])
def test_block_table_with_prefix_and_bidirectional_segments(layout, prefix, bidirectional):
    """FULL blocks are fully visible, SKIP blocks fully hidden, under the relaxed causal masks."""
    B, S, n, bq, bk = 3, 32, 4, 4, 8
    perm = layouts.permutation(S * n, layout, n).reshape(n, S)
    q_pos, k_pos = jnp.asarray(perm[1]), jnp.asarray(perm[2])  # keys mostly after queries
    seg = (np.arange(S * n)[None] + 7 * np.arange(B)[:, None]) // 20  # [B, L] documents of 20
    seg = np.where(seg % 2 == 1, -seg, seg) if bidirectional else seg  # odd segments bidirectional
    q_seg, k_seg = jnp.asarray(seg[:, perm[1]]), jnp.asarray(seg[:, perm[2]])
    pre = jnp.asarray([0, 70, 128]) if prefix else None
    vis = masks.visible(q_pos, k_pos, q_seg, k_seg, True, None, pre, bidirectional)  # [B, S, S]
    table = masks.block_table(q_pos, k_pos, q_seg, k_seg, True, bq, bk, None, pre, bidirectional)
    blocks = np.asarray(vis).reshape(B, S // bq, bq, S // bk, bk)
    any_, all_ = blocks.any((2, 4)), blocks.all((2, 4))
    t = np.asarray(table)
    assert np.all(any_[t == masks.SKIP] == 0) and np.all(all_[t == masks.FULL])
    assert (t != masks.PARTIAL).any()  # some blocks are skipped or run unmasked
    # a prefix row sees keys after the query inside its prefix; a bidirectional segment likewise
    after = np.asarray(k_pos)[None, None, :] > np.asarray(q_pos)[None, :, None]
    assert np.asarray(vis)[np.broadcast_to(after, vis.shape)].any()
