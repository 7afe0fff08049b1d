"""Packed documents do not see each other: checked through the model's ring attention."""

from __future__ import annotations

import numpy as np
import pytest

from models.tokenizer import ByteTokenizer
from tests.ringcheck import F32_RTOL
from train import data

DOCS = [
    "In the beginning God created",
    "And the earth was without form, and void;",
    "Let there be light: and there was light.",
]
SEQ = 128


@pytest.fixture(scope="module")
def model():
    import jax

    from models import llama
    from models.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(fsdp=2, sp=4))
    cfg = llama.get_config("debug", layout="zigzag", attention="xla", q_chunk=8, kv_chunk=8)
    return cfg, mesh, llama.init_params(cfg, jax.random.key(0), mesh)


def _logits(model, rows):
    from models import llama

    cfg, mesh, params = model
    ids = np.stack([rows["input_ids"]] * 2)  # batch divisible by fsdp
    out = llama.forward(
        cfg,
        params,
        ids,
        positions=np.stack([rows["positions"]] * 2),
        segment_ids=np.stack([rows["segment_ids"]] * 2),
        mesh=mesh,
    )
    return np.asarray(out[0])  # [seq, vocab]


def test_no_attention_across_documents(model):
    packer = data.Packer(
        DOCS, np.arange(3), ByteTokenizer(), num_streams=1, rows=[0], seq_len=SEQ, seed=0, wrap=False
    )
    row = {k: v[0] for k, v in packer.next_rows().items()}
    packed = _logits(model, row)
    segments = np.unique(row["segment_ids"][row["loss_mask"] == 1])
    assert len(segments) == len(DOCS)
    for s in segments:
        m = row["segment_ids"] == s
        n = int(m.sum())
        alone = {k: np.zeros(SEQ, np.int32) for k in data.FIELDS}
        for k in ("input_ids", "positions"):
            alone[k][:n] = row[k][m]
        alone["segment_ids"][:n] = 1
        alone["segment_ids"][n:] = 2
        np.testing.assert_allclose(packed[m], _logits(model, alone)[:n], rtol=F32_RTOL, atol=F32_RTOL)


def test_without_segment_ids_documents_would_mix(model):
    # The control: the same packed row with one segment changes the later documents' logits.
    packer = data.Packer(
        DOCS, np.arange(3), ByteTokenizer(), num_streams=1, rows=[0], seq_len=SEQ, seed=0, wrap=False
    )
    row = {k: v[0] for k, v in packer.next_rows().items()}
    merged = dict(row, segment_ids=np.ones(SEQ, np.int32))
    later = row["segment_ids"] == row["segment_ids"][row["loss_mask"] == 1].max()
    assert not np.allclose(
        _logits(model, row)[later], _logits(model, merged)[later], rtol=F32_RTOL, atol=F32_RTOL
    )
