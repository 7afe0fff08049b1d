"""Documents -> tokens -> packed fixed-length sequences in ring layout, with a resumable position.

Packing follows the document-masking recipe of long-context training (Large World Model, Liu et al.
2024): documents are concatenated into rows of ``seq_len`` next-token pairs, each document a segment
with its own ids and positions, so attention (given ``segment_ids``) never crosses documents.

Row ``j`` of every global batch comes from its own *stream* ``j``: documents ``j, j+B, j+2B,
...`` of a seeded permutation of the split, reshuffled every epoch. A host builds only the rows its
devices hold, so it tokenizes only its streams' documents, and batches are identical for any number
of hosts.
The position of stream ``j`` is three integers (epoch, document cursor, token offset): the
``[B, 3]`` array of them is saved with the checkpoint, sharded like the batch.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from models.tokenizer import Tokenizer

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"  # package data: installed with train
FIELDS = ("input_ids", "targets", "positions", "segment_ids", "loss_mask")
STATE_WIDTH = 3  # epoch, cursor, offset


def default_paths() -> list[str]:
    """The public-domain corpus shipped in ``train/corpus``."""
    paths = sorted(str(p) for p in CORPUS.glob("*.jsonl"))
    if not paths:
        raise FileNotFoundError(f"the embedded corpus is missing: no *.jsonl in {CORPUS}")
    return paths


def _format_of(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path.lower()
    for ext in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(ext)
    return "jsonl" if name.endswith((".jsonl", ".json")) else "text"


def split_text(text: str, max_chars: int) -> list[str]:
    """The documents of a text file: its blank-line-separated paragraphs, gathered in order into
    documents of at most ``max_chars`` characters (joined by a blank line); a longer paragraph is
    cut into pieces of ``max_chars``. ``max_chars`` 0: the whole text is one document."""
    if max_chars < 0:
        raise ValueError(f"{max_chars=} must be >= 0")
    if max_chars == 0:
        return [text]
    docs, current = [], ""
    for para in re.split(r"\n[ \t\r\f\v]*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        if current and len(current) + 2 + len(para) <= max_chars:
            current = f"{current}\n\n{para}"
            continue
        if current:
            docs.append(current)
        pieces = [para[i : i + max_chars] for i in range(0, len(para), max_chars)]
        docs += pieces[:-1]
        current = pieces[-1]
    return [*docs, current] if current else docs


def read_documents(
    paths: Sequence[str], fmt: str = "auto", text_key: str = "text", text_doc_chars: int = 0
) -> list[str]:
    """Non-empty documents of text files (``split_text`` into documents of up to
    ``text_doc_chars`` characters; 0: one per file) or JSONL files (one per line), in order."""
    import fsspec

    files = []
    for path in paths:
        found = fsspec.open_files(path, mode="rt", compression="infer", encoding="utf-8")
        found = [f for f in found if f.fs.isfile(f.path)]
        if not found:
            raise ValueError(f"data.paths entry {path!r} matches no file")
        files += found
    if not files:
        raise ValueError(f"data.paths={list(paths)!r} lists no file")
    docs: list[str] = []
    for f in files:
        try:
            with f as handle:
                docs += _read_file(handle, f.path, _format_of(f.path, fmt), text_key, text_doc_chars)
        except UnicodeDecodeError as e:
            raise ValueError(
                f"data file {f.path!r} is not UTF-8 text (byte "
                f"0x{e.object[e.start]:02x}: {e.reason}); data files must be UTF-8"
            ) from None
        except (OSError, EOFError) as e:  # unreadable, or a damaged compressed file
            raise ValueError(f"data file {f.path!r} cannot be read: {e}") from None
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"no non-empty documents in data.paths={list(paths)!r}")
    return docs


def _read_file(handle, path: str, kind: str, text_key: str, text_doc_chars: int) -> list[str]:
    """The documents of one open file: pieces of its text, or one per JSONL line."""
    if kind == "text":
        return split_text(handle.read(), text_doc_chars)
    docs = []
    for n, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON: {e}") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
            raise ValueError(f"{path}:{n} has no string field data.text_key={text_key!r}")
        docs.append(record[text_key])
    return docs


def split(num_docs: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation of document indices cut into (train, eval)."""
    perm = np.random.default_rng([seed, 0x5EED]).permutation(num_docs)
    n_eval = int(np.ceil(eval_fraction * num_docs)) if eval_fraction > 0 else 0
    if n_eval >= num_docs:
        raise ValueError(f"data.eval_fraction={eval_fraction} leaves no training documents out of {num_docs}")
    return perm[: num_docs - n_eval], perm[num_docs - n_eval :]


class Packer:
    """Packs the documents of streams ``rows`` (of ``num_streams``) into rows of ``seq_len`` pairs.

    ``wrap`` starts a new epoch when a stream runs out (training); otherwise the rest of the row is
    padding with ``loss_mask`` 0 (evaluation).
    """

    def __init__(
        self,
        documents: Sequence[str],
        doc_ids: np.ndarray,
        tokenizer: Tokenizer,
        *,
        num_streams: int,
        rows: Sequence[int],
        seq_len: int,
        seed: int,
        wrap: bool,
        append_eos: bool = True,
    ):
        if seq_len < 1 or num_streams < 1:
            raise ValueError(f"{seq_len=} and {num_streams=} must be >= 1")
        bad = [r for r in rows if not 0 <= r < num_streams]
        if bad:
            raise ValueError(f"rows {bad} are outside [0, {num_streams=})")
        if wrap and len(doc_ids) < num_streams:
            raise ValueError(
                f"{len(doc_ids)} training documents cannot feed {num_streams} "
                "sequences per batch (data.batch_size); add data or lower it"
            )
        self.documents, self.tokenizer = documents, tokenizer
        self.num_streams, self.rows, self.seq_len = num_streams, list(rows), seq_len
        self.seed, self.wrap, self.append_eos = seed, wrap, append_eos
        self.stream_docs = {j: np.asarray(doc_ids[j::num_streams]) for j in self.rows}
        self.state = {j: np.zeros(STATE_WIDTH, np.int64) for j in self.rows}
        self._cache: dict[int, np.ndarray] = {}

    def _order(self, j: int, epoch: int) -> np.ndarray:
        docs = self.stream_docs[j]
        return np.random.default_rng([self.seed, j, epoch]).permutation(docs)

    def _tokens(self, doc: int) -> np.ndarray:
        if doc not in self._cache:
            ids = self.tokenizer.encode(self.documents[doc])
            if self.append_eos and self.tokenizer.eos_id is not None:
                ids = [*ids, self.tokenizer.eos_id]
            self._cache[doc] = np.asarray(ids, np.int32)
        return self._cache[doc]

    def _row(self, j: int) -> dict[str, np.ndarray]:
        L = self.seq_len
        out = {k: np.zeros(L, np.int32) for k in FIELDS}
        epoch, cursor, offset = (int(x) for x in self.state[j])
        filled, seg, since_wrap = 0, 0, None  # tokens since a wrap in this call
        while filled < L:
            order = self._order(j, epoch)
            if cursor >= len(order):
                if not self.wrap:
                    break
                if since_wrap == 0:
                    raise ValueError(f"stream {j} has no document of >= 2 tokens")
                epoch, cursor, offset, since_wrap = epoch + 1, 0, 0, 0
                continue
            toks = self._tokens(int(order[cursor]))
            k = min(len(toks) - 1 - offset, L - filled)
            if k > 0:
                seg += 1
                sl = slice(filled, filled + k)
                out["input_ids"][sl] = toks[offset : offset + k]
                out["targets"][sl] = toks[offset + 1 : offset + k + 1]
                out["positions"][sl] = np.arange(offset, offset + k)
                out["segment_ids"][sl] = seg
                out["loss_mask"][sl] = 1
                filled, offset = filled + k, offset + k
                since_wrap = None if since_wrap is None else since_wrap + k
            if offset >= len(toks) - 1:
                cursor, offset = cursor + 1, 0
        out["segment_ids"][filled:] = seg + 1  # padding: a segment of its own, ids stay increasing
        self.state[j] = np.array([epoch, cursor, offset], np.int64)
        return out

    def next_rows(self) -> dict[str, np.ndarray]:
        """One row per stream in ``rows``, natural order. Each field int32 [len(rows), seq_len]."""
        rows = [self._row(j) for j in self.rows]
        return {k: np.stack([r[k] for r in rows]) for k in FIELDS}

    def get_state(self) -> np.ndarray:
        """Positions of this packer's streams, int64 [len(rows), 3]."""
        return np.stack([self.state[j] for j in self.rows])

    def set_state(self, state: np.ndarray) -> None:
        state = np.asarray(state)
        if state.shape != (len(self.rows), STATE_WIDTH):
            raise ValueError(f"data state must be [{len(self.rows)}, {STATE_WIDTH}]; got {state.shape=}")
        if (state < 0).any():
            raise ValueError(f"data state has negative entries: {state.tolist()}")
        for j, s in zip(self.rows, state, strict=True):
            self.state[j] = s.astype(np.int64)


def to_ring_layout(batch: dict[str, np.ndarray], layout: str, ring_size: int) -> dict:
    """Reorders every [..., seq] field into ``layout`` order (positions travel with tokens)."""
    from ringattention import layouts

    out = {}
    for k, v in batch.items():
        perm = layouts.permutation(v.shape[-1], layout, ring_size)
        out[k] = np.take(v, perm, axis=-1)
    return out
