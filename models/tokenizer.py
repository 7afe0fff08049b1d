"""Tokenizers: UTF-8 bytes (default), Hugging Face ``tokenizers``, SentencePiece.

All three share ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size`` and ``eos_id``
(None when the tokenizer has no end-of-sequence token). Files are read through fsspec when it is
installed (any URL), else from local paths. Used by ``models.generate`` and by training (``train``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|eot_id|>")


def _read(path: str, binary: bool):
    try:
        import fsspec
    except ImportError:  # the model extra alone: local files only
        fsspec = None
    mode = "rb" if binary else "rt"
    kw = {} if binary else {"encoding": "utf-8"}
    opener = fsspec.open if fsspec is not None else open
    with opener(path, mode, **kw) as f:
        return f.read()


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255; no special tokens (documents are separated by segment ids)."""

    vocab_size = 256
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers`` JSON file (``tokenizer.json``)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_str(_read(path, binary=False))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(name) for name in EOS_NAMES]
        self.eos_id = next((i for i in ids if i is not None), None)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


class SentencePieceTokenizer:
    """A SentencePiece ``.model`` file."""

    def __init__(self, path: str):
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_proto=_read(path, binary=True))
        self.vocab_size = self._sp.get_piece_size()
        eos = self._sp.eos_id()
        self.eos_id = eos if eos >= 0 else None

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


def get_tokenizer(kind: str, path: str = "") -> Tokenizer:
    """``kind`` is "byte", "hf" or "sentencepiece" (the latter two read ``path``)."""
    if kind == "byte":
        return ByteTokenizer()
    if not path:
        raise ValueError(f"tokenizer {kind=} needs a tokenizer file path; got {path=}")
    if kind == "hf":
        return HFTokenizer(path)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path)
    raise ValueError(f"tokenizer {kind=}; choose one of ('byte', 'hf', 'sentencepiece')")
