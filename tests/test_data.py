"""Data pipeline: reading, tokenizers, packing, deterministic shuffling, resumable positions."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from models.tokenizer import ByteTokenizer, get_tokenizer
from ringattention import layouts
from train import data

DOCS = [
    "alpha beta gamma",
    "the quick brown fox jumps",
    "x",
    "",
    "lorem ipsum dolor sit amet",
    "one two three four five six seven",
    "ab",
]


def _packer(docs, ids=None, *, streams=2, rows=None, seq=16, seed=0, wrap=True):
    ids = np.arange(len(docs)) if ids is None else ids
    rows = list(range(streams)) if rows is None else rows
    return data.Packer(
        docs, ids, ByteTokenizer(), num_streams=streams, rows=rows, seq_len=seq, seed=seed, wrap=wrap
    )


def test_embedded_corpus_is_there():
    docs = data.read_documents(data.default_paths())
    assert len(docs) > 100 and sum(len(d) for d in docs) > 200_000


def test_reads_text_jsonl_gzip_and_fsspec(tmp_path):
    (tmp_path / "a.txt").write_text("first document")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "second"}) + "\n\n" + json.dumps({"text": "third"}) + "\n")
    docs = data.read_documents([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl.gz")])
    assert docs == ["first document", "second", "third"]
    import fsspec

    with fsspec.open("memory://corpus/c.jsonl", "w") as f:
        f.write(json.dumps({"body": "in memory"}) + "\n")
    assert data.read_documents(["memory://corpus/*.jsonl"], text_key="body") == ["in memory"]


def test_bad_data_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no non-empty documents"):
        data.read_documents([str(empty)])
    with pytest.raises(ValueError, match="matches no file"):
        data.read_documents([str(tmp_path / "missing*.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 .*text_key"):
        data.read_documents([str(bad)])
    with pytest.raises(ValueError, match="cannot feed 8 sequences"):
        _packer(DOCS, streams=8)
    with pytest.raises(ValueError, match="no document of >= 2 tokens"):
        _packer(["x", "y"], streams=2).next_rows()


def test_packing_pairs_segments_positions():
    p = _packer(DOCS, streams=1, seq=24)
    tok = ByteTokenizer()
    for _ in range(6):
        r = {k: v[0] for k, v in p.next_rows().items()}
        seg = r["segment_ids"]
        assert (np.diff(seg) >= 0).all() and (r["loss_mask"] == 1).all()
        for s in np.unique(seg):
            m = seg == s
            pos = r["positions"][m]
            assert (np.diff(pos) == 1).all()  # one document, consecutive positions
            # targets are the next token of the same document
            assert (r["input_ids"][m][1:] == r["targets"][m][:-1]).all()
            text = tok.decode(r["input_ids"][m].tolist() + [int(r["targets"][m][-1])])
            assert any(text in d for d in DOCS)
            assert any(d[pos[0] :].startswith(text) for d in DOCS)


def test_eval_packing_pads_without_loss():
    p = _packer(DOCS[:2], streams=2, seq=40, wrap=False)
    r = p.next_rows()
    assert (r["loss_mask"][:, -1] == 0).all()  # documents are shorter than a row
    pad = r["loss_mask"] == 0
    assert (r["segment_ids"][pad] > r["segment_ids"][~pad].max()).all()
    assert (p.next_rows()["loss_mask"] == 0).all()  # exhausted: nothing left to score


def test_shuffle_is_deterministic_by_seed():
    a = [_packer(DOCS, seed=1).next_rows()["input_ids"] for _ in range(3)]
    b = [_packer(DOCS, seed=1).next_rows()["input_ids"] for _ in range(3)]
    np.testing.assert_array_equal(a, b)
    p0, p1 = _packer(DOCS, seed=0), _packer(DOCS, seed=5)
    seq0 = np.concatenate([p0.next_rows()["input_ids"] for _ in range(8)], axis=1)
    seq1 = np.concatenate([p1.next_rows()["input_ids"] for _ in range(8)], axis=1)
    assert not np.array_equal(seq0, seq1)


def test_split_is_disjoint_and_seeded():
    tr, ev = data.split(100, 0.1, seed=3)
    assert len(ev) == 10 and not set(tr) & set(ev) and len(set(tr) | set(ev)) == 100
    tr2, ev2 = data.split(100, 0.1, seed=3)
    np.testing.assert_array_equal(ev, ev2)
    with pytest.raises(ValueError, match="no training documents"):
        data.split(1, 0.5, seed=0)


def test_state_resumes_exactly_across_epochs():
    p = _packer(DOCS, streams=2, seq=16)
    for _ in range(5):
        p.next_rows()
    state = p.get_state()
    expected = [p.next_rows() for _ in range(6)]  # crosses epochs
    q = _packer(DOCS, streams=2, seq=16)
    q.set_state(state)
    for e in expected:
        got = q.next_rows()
        for k in data.FIELDS:
            np.testing.assert_array_equal(got[k], e[k])
    assert p.get_state()[:, 0].max() >= 1  # an epoch boundary was crossed
    with pytest.raises(ValueError, match="data state must be"):
        q.set_state(state[:1])


def test_rows_do_not_depend_on_which_host_builds_them():
    docs = [d for d in DOCS if len(d) > 1]
    full = _packer(docs, streams=4, seq=16)
    halves = [_packer(docs, streams=4, rows=[0, 1], seq=16), _packer(docs, streams=4, rows=[2, 3], seq=16)]
    for _ in range(4):
        whole = full.next_rows()
        parts = [h.next_rows() for h in halves]
        for k in data.FIELDS:
            np.testing.assert_array_equal(whole[k], np.concatenate([p[k] for p in parts]))


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_ring_layout_moves_positions_with_tokens(layout):
    r = _packer(DOCS, streams=2, seq=16).next_rows()
    out = data.to_ring_layout(r, layout, 4)
    perm = layouts.permutation(16, layout, 4)
    for k in data.FIELDS:
        np.testing.assert_array_equal(out[k], r[k][:, perm])


def test_hf_and_sentencepiece_tokenizers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    text = " ".join(DOCS) * 20
    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "</s>"]))
    hf.save(str(tmp_path / "tok.json"))
    tok = get_tokenizer("hf", str(tmp_path / "tok.json"))
    assert tok.eos_id == hf.token_to_id("</s>")
    ids = tok.encode("quick brown fox")
    assert tok.decode(ids).replace(" ", "") == "quickbrownfox"

    import sentencepiece as spm

    (tmp_path / "corpus.txt").write_text("\n".join(DOCS * 30))
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "corpus.txt"),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=40,
        model_type="bpe",
        minloglevel=2,
    )
    sp = get_tokenizer("sentencepiece", str(tmp_path / "sp.model"))
    assert sp.decode(sp.encode("quick brown fox")) == "quick brown fox"
    assert sp.eos_id is not None and sp.vocab_size == 40
    with pytest.raises(ValueError, match="needs a tokenizer file"):
        get_tokenizer("hf")


def test_undecodable_file_names_its_path(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait\n\n" * 3)
    with pytest.raises(ValueError, match=f"data file '{bad}' is not UTF-8 text \\(byte 0xe9"):
        data.read_documents([str(bad)])
    gz = tmp_path / "broken.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match=f"data file '{gz}' cannot be read"):
        data.read_documents([str(gz)])


def test_text_file_is_split_into_documents(tmp_path):
    paragraphs = [f"paragraph {i} " + "word " * (i % 7) for i in range(50)]
    text = "\n\n".join(paragraphs[:25]) + "\n \n\n" + "x" * 250 + "\n\n" + "\n\n".join(paragraphs[25:])
    docs = data.split_text(text, 100)
    assert all(len(d) <= 100 for d in docs) and len(docs) > 10
    # every paragraph is there, whole and in order, except the long one, cut into 100-char pieces
    parts = [p for d in docs for p in d.split("\n\n")]
    assert parts == [*paragraphs[:25], "x" * 100, "x" * 100, "x" * 50, *paragraphs[25:]]
    assert data.split_text(text, 0) == [text]
    # one large text file is a corpus: enough documents for a held-out split and 8 streams
    corpus = "\n\n".join(data.read_documents(data.default_paths()))
    (tmp_path / "one.txt").write_text(corpus)
    docs = data.read_documents([str(tmp_path / "one.txt")], text_doc_chars=8192)
    assert len(docs) > 40 and all(len(d) <= 8192 for d in docs)
    train_ids, eval_ids = data.split(len(docs), 0.05, 0)
    assert len(train_ids) >= 8 and len(eval_ids) >= 1
