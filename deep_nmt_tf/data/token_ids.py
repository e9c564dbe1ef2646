"""Token-id files and detokenisation without TensorFlow.

A *token-id file* (``deep-nmt-preprocess``; :class:`TokenIds`) holds a parallel corpus after
tokenisation with a run's vocabulary, as numpy arrays in one ``.npz``:

=================================  ==============================================================
``source_tokens``, ``target_tokens``  the token ids of every line, concatenated (no ``</s>``
                                   or ``<s>``; ``uint16`` when the vocabulary has at most 65,536
                                   entries, else ``int32``)
``source_offsets``, ``target_offsets``  ``int64 [N + 1]``: line ``i`` is ``tokens[offsets[i]:
                                   offsets[i + 1]]``
``meta``                           a JSON string: ``format``, ``version``, ``vocab_size``,
                                   ``vocab_sha256``, ``tokenizer_type`` (``wordpiece`` or
                                   ``sentencepiece``), where the lines came from and, for
                                   several training corpora, ``corpora`` (each one's
                                   ``name``, ``weight`` and ``pairs``, in row order)
=================================  ==============================================================

Every line pair of the text files is kept, in file order (empty lines as empty rows), so row
``i`` is line ``i + 1`` of both files; the training batcher
(:class:`deep_nmt_tf.data.batching.TokenBatches`) drops empty and over-long pairs as the
``tf.data`` pipeline does.  A run directory keeps them as ``MODEL_DIR/data/<split>.npz``
(:meth:`deep_nmt_tf.run_dir.RunDir.token_file`).

:class:`Detokenizer` turns WordPiece ids back into text exactly as the in-graph
:meth:`deep_nmt_tf.data.vocab.Tokenizer.detokenize` does (``tests/test_data_batching.py``
compares them), in plain Python, so a machine with only JAX can print and score translations;
:class:`SentencePieceDetokenizer` does the same for a SentencePiece run with the
``sentencepiece`` package (:func:`make_detokenizer` picks the one of a tokenizer kind).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from deep_nmt_tf.constants import RESERVED_TOKENS, text_ids
from deep_nmt_tf.data.spm import SentencePieceModel
from deep_nmt_tf.data.text_io import DataError, read_lines

__all__ = ["TOKEN_FILE_FORMAT", "TOKEN_FILE_VERSION", "TokenIds", "Detokenizer",
           "SentencePieceDetokenizer", "make_detokenizer"]

TOKEN_FILE_FORMAT = "deep_nmt_tf.token_ids"
TOKEN_FILE_VERSION = 1
_SUFFIX_INDICATOR = "##"  # deep_nmt_tf.data.vocab.SUFFIX_INDICATOR
# The punctuation that detokenisation re-attaches: the classes of
# deep_nmt_tf.data.vocab.reattach_punctuation (a test checks that they agree).
CLOSERS = r"[.,!?;:%)\]}…”’]"
OPENERS = r"[(\[{¿¡“‘$£€¥]"


def _offsets(rows: Sequence[Sequence[int]]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(r) for r in rows], dtype=np.int64)])


def _flat(rows: Sequence[Sequence[int]], dtype) -> np.ndarray:
    if not rows:
        return np.zeros([0], dtype)
    return np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]).astype(dtype)


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """A tokenised parallel corpus (module docstring); ``len()`` is its number of line pairs.

    Attributes:
      source_tokens, source_offsets, target_tokens, target_offsets: the arrays of the file.
      vocab_size: entries of the vocabulary the ids belong to.
      vocab_sha256: sha256 of that vocabulary file ("" if unknown).
      info: other metadata (``split``, ``source``, ``target`` paths ...).
    """

    source_tokens: np.ndarray
    source_offsets: np.ndarray
    target_tokens: np.ndarray
    target_offsets: np.ndarray
    vocab_size: int
    vocab_sha256: str = ""
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_rows(cls, source_rows: Sequence[Sequence[int]],
                  target_rows: Sequence[Sequence[int]], vocab_size: int,
                  vocab_sha256: str = "", **info) -> "TokenIds":
        """From lists of id lists (one per line, no ``</s>``/``<s>``)."""
        if len(source_rows) != len(target_rows):
            raise ValueError(f"{len(source_rows)} source rows for {len(target_rows)} target rows")
        dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
        return cls(_flat(source_rows, dtype), _offsets(source_rows),
                   _flat(target_rows, dtype), _offsets(target_rows), int(vocab_size),
                   vocab_sha256, dict(info))

    def __len__(self) -> int:
        return len(self.source_offsets) - 1

    def source(self, i: int) -> np.ndarray:
        """The source ids of pair ``i`` (int32, no ``</s>``)."""
        return self.source_tokens[self.source_offsets[i]:self.source_offsets[i + 1]].astype(
            np.int32)

    def target(self, i: int) -> np.ndarray:
        """The target ids of pair ``i`` (int32, no ``<s>``/``</s>``)."""
        return self.target_tokens[self.target_offsets[i]:self.target_offsets[i + 1]].astype(
            np.int32)

    @property
    def source_lengths(self) -> np.ndarray:
        """Tokens per source line (without ``</s>``), int64 ``[N]``."""
        return np.diff(self.source_offsets)

    @property
    def target_lengths(self) -> np.ndarray:
        """Tokens per target line (without ``<s>``/``</s>``), int64 ``[N]``."""
        return np.diff(self.target_offsets)

    def save(self, path: str) -> str:
        """Writes the ``.npz`` atomically (temporary file + rename); returns ``path``."""
        if not path.endswith(".npz"):
            raise ValueError(f"{path}: a token-id file must end in .npz")
        meta = {"format": TOKEN_FILE_FORMAT, "version": TOKEN_FILE_VERSION,
                "vocab_size": self.vocab_size, "vocab_sha256": self.vocab_sha256,
                "num_pairs": len(self), **self.info}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path[:-4]}.tmp{os.getpid()}.npz"
        np.savez(tmp, source_tokens=self.source_tokens, source_offsets=self.source_offsets,
                 target_tokens=self.target_tokens, target_offsets=self.target_offsets,
                 meta=np.array(json.dumps(meta, sort_keys=True)))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str, vocab_sha256: Optional[str] = None) -> "TokenIds":
        """Reads a file written by :meth:`save`.

        Args:
          path: the ``.npz``.
          vocab_sha256: if given, the sha256 the file's vocabulary must have.

        Raises:
          DataError: a missing or foreign file, another format version, or another
            vocabulary (naming the file).
        """
        if not os.path.exists(path):
            raise DataError(f"{path}: token-id file not found (write it with "
                            "deep-nmt-preprocess)")
        try:
            with np.load(path, allow_pickle=False) as f:
                meta = json.loads(str(f["meta"]))
                arrays = {k: f[k] for k in ("source_tokens", "source_offsets", "target_tokens",
                                            "target_offsets")}
        except (KeyError, ValueError, OSError) as e:
            raise DataError(f"{path}: not a token-id file of deep-nmt-preprocess ({e})") from None
        if meta.get("format") != TOKEN_FILE_FORMAT:
            raise DataError(f"{path}: not a token-id file of deep-nmt-preprocess")
        if meta.get("version") != TOKEN_FILE_VERSION:
            raise DataError(f"{path}: token-id file version {meta.get('version')}, this "
                            f"version reads {TOKEN_FILE_VERSION}; run deep-nmt-preprocess again")
        if vocab_sha256 and meta.get("vocab_sha256") and meta["vocab_sha256"] != vocab_sha256:
            raise DataError(f"{path}: tokenised with another vocabulary (sha256 "
                            f"{meta['vocab_sha256'][:12]}... != {vocab_sha256[:12]}...); run "
                            "deep-nmt-preprocess again")
        info = {k: v for k, v in meta.items()
                if k not in ("format", "version", "vocab_size", "vocab_sha256", "num_pairs")}
        return cls(vocab_size=int(meta["vocab_size"]),
                   vocab_sha256=meta.get("vocab_sha256", ""), info=info, **arrays)


class Detokenizer:
    """WordPiece ids -> text in plain Python, as :meth:`Tokenizer.detokenize
    <deep_nmt_tf.data.vocab.Tokenizer.detokenize>` does it.

    ``<pad>`` and ``<s>`` are dropped, and everything from the first ``</s>`` on; ids outside
    the vocabulary read as ``[UNK]``; ``##`` pieces are glued to the piece before; with
    ``reattach_punctuation`` the spaces before closing and after opening punctuation go, and
    ASCII double quotes hug their content.

    Args:
      vocab: a vocabulary file (one token per line, the reserved tokens first) or the tokens.
      reattach_punctuation: as the ``Tokenizer`` argument of that name.

    Example:
      >>> Detokenizer(["<pad>", "<s>", "</s>", "[UNK]", "Hel", "##lo", ","])([4, 5, 6, 2, 4])
      'Hello,'
    """

    def __init__(self, vocab, reattach_punctuation: bool = True):
        tokens = list(read_lines(os.fspath(vocab))) if isinstance(vocab, (str, os.PathLike)) \
            else list(vocab)
        if tuple(tokens[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
            raise DataError(f"vocabulary must start with {RESERVED_TOKENS}, got "
                            f"{tokens[:len(RESERVED_TOKENS)]}")
        self.tokens = tokens
        self.reattach = bool(reattach_punctuation)

    def __call__(self, ids: Iterable[int]) -> str:
        """One sentence's ids (any int iterable) -> text."""
        pieces: List[str] = []
        for i in text_ids(ids, len(self.tokens)):
            token = self.tokens[i]
            if pieces and token.startswith(_SUFFIX_INDICATOR):
                pieces[-1] += token[len(_SUFFIX_INDICATOR):]
            else:  # A word, or a continuation piece with nothing before it (kept whole).
                pieces.append(token)
        text = " ".join(pieces)
        if self.reattach:
            text = re.sub(f" ({CLOSERS})", r"\1", text)
            text = re.sub(f"({OPENERS}) ", r"\1", text)
            text = re.sub(r'" ([^"]*?) "', r'"\1"', text)
        return text

    def batch(self, ids) -> List[str]:
        """Rows of a ``[B, T]`` array (or a list of id lists) -> ``B`` strings."""
        return [self(row) for row in ids]


class SentencePieceDetokenizer(Detokenizer):
    """SentencePiece ids -> text in plain Python (the ``sentencepiece`` package), as
    :meth:`SentencePieceTokenizer.detokenize <deep_nmt_tf.data.tokenizers.
    SentencePieceTokenizer.detokenize>` does it: ``<pad>`` and ``<s>`` dropped, nothing from
    the first ``</s>`` on, ids outside the vocabulary read as ``[UNK]``.

    Args:
      model: the ``.model`` file (the package's id map applied:
        :class:`~deep_nmt_tf.data.spm.SentencePieceModel`).
    """

    def __init__(self, model):
        self.model = SentencePieceModel(os.fspath(model))
        self.tokens = self.model.pieces
        self.reattach = False

    def __call__(self, ids: Iterable[int]) -> str:
        """One sentence's ids (any int iterable) -> text."""
        return self.model.decode(ids)


def make_detokenizer(path, kind: str = "wordpiece", reattach_punctuation: bool = True
                     ) -> Detokenizer:
    """The plain-Python detokenizer of a tokenizer file: :class:`Detokenizer` (``wordpiece``)
    or :class:`SentencePieceDetokenizer` (``sentencepiece``; ``data.tokenizer.type``)."""
    if kind == "sentencepiece":
        return SentencePieceDetokenizer(path)
    if kind != "wordpiece":
        raise ValueError(f"unknown tokenizer kind {kind!r} (wordpiece, sentencepiece)")
    return Detokenizer(path, reattach_punctuation)
