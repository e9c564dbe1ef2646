"""SentencePiece models without TensorFlow: learning, the id layout, and text <-> ids in Python.

The sentencepiece library also learns the package's WordPiece vocabularies
(:func:`learn_wordpiece`: its BPE trainer on the word counts, converted to ``##`` pieces).

A SentencePiece model (a ``.model`` file: Kudo and Richardson 2018) is learned with the
``sentencepiece`` package (:func:`learn_sentencepiece`, from the same bounded, evenly spread
sample of the training lines as a WordPiece vocabulary) or taken as it is from elsewhere
(fairseq, Marian, OpenNMT ... recipes).  The package's ids keep their fixed meaning
(:mod:`deep_nmt_tf.constants`: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``[UNK]`` 3), so a model
whose control pieces sit elsewhere (sentencepiece's default: ``<unk>`` 0, ``<s>`` 1, ``</s>``
2, no padding) is read through a fixed id map (:class:`SentencePieceModel`): its unknown,
padding, begin and end pieces take ids 3, 0, 1 and 2, and every other piece, in the model's
order, the ids from 4 on.  A model learned here has that layout already (the map is the
identity).

:class:`SentencePieceModel` also encodes and decodes in plain Python, exactly as the in-graph
:class:`deep_nmt_tf.data.tokenizers.SentencePieceTokenizer` does (both run the sentencepiece
library on the same model; ``tests/test_data_tokenizers.py`` compares them), so the Keras route
(:mod:`deep_nmt_tf.data.token_ids`) can print and score translations on a machine without
TensorFlow.
"""

from __future__ import annotations

import io
import os
import tempfile
from typing import Iterable, List, Mapping, Optional, Sequence

import numpy as np
from absl import logging

from deep_nmt_tf.constants import (BOS_ID, BOS_TOKEN, EOS_ID, EOS_TOKEN, PAD_ID, PAD_TOKEN,
                                   RESERVED_TOKENS, UNK_ID, UNK_TOKEN, text_ids)
from deep_nmt_tf.data.text_io import DataError, sample_text

__all__ = ["MODEL_TYPES", "SentencePieceModel", "learn_sentencepiece", "learn_wordpiece"]

#: The model types :func:`learn_sentencepiece` learns (``data.tokenizer.sentencepiece``).
MODEL_TYPES = ("unigram", "bpe")


def _processor(path: str):
    import sentencepiece

    if not os.path.exists(path):
        raise DataError(f"{path}: SentencePiece model not found")
    with open(path, "rb") as f:
        proto = f.read()
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as e:
        raise DataError(f"{path}: not a SentencePiece model ({e})") from None
    return processor, proto


class SentencePieceModel:
    """A ``.model`` file with the package's id layout (module docstring).

    Args:
      path: the SentencePiece model file.
      lowercase: lower-case text before encoding (``data.lowercase``; Python's ``str.lower``).

    Attributes:
      proto: the model's bytes (what tensorflow-text's ``SentencepieceTokenizer`` reads).
      to_ours: int32 ``[pieces]``: the package's id of each of the model's ids.
      to_model: int32 ``[vocab_size]``: the model's id of each of the package's ids (its
        unknown piece for a reserved id the model lacks).
      identity: the two id spaces are the same (no map needed).
      pieces: the package's tokens by id (the reserved tokens first, then the model's pieces).

    Raises:
      DataError: no such file, or not a SentencePiece model (naming the file).
    """

    def __init__(self, path: str, lowercase: bool = False):
        self.path = os.fspath(path)
        self.lowercase = bool(lowercase)
        self.processor, self.proto = _processor(self.path)
        sp = self.processor
        size = sp.get_piece_size()
        reserved = {sp.unk_id(): UNK_ID, sp.pad_id(): PAD_ID, sp.bos_id(): BOS_ID,
                    sp.eos_id(): EOS_ID}
        reserved.pop(-1, None)
        to_ours = np.zeros([size], np.int32)
        pieces = list(RESERVED_TOKENS)
        for i in range(size):
            if i in reserved:
                to_ours[i] = reserved[i]
            else:
                to_ours[i] = len(pieces)
                pieces.append(sp.id_to_piece(i))
        to_model = np.full([len(pieces)], sp.unk_id(), np.int32)
        to_model[to_ours] = np.arange(size, dtype=np.int32)
        self.to_ours, self.to_model, self.pieces = to_ours, to_model, pieces
        self.identity = size == len(pieces) and bool((to_ours == np.arange(size)).all())

    @property
    def vocab_size(self) -> int:
        """Number of the package's ids (the reserved ids and every other piece)."""
        return len(self.pieces)

    def encode(self, lines: Sequence[str]) -> List[List[int]]:
        """The package's ids of each line (no ``</s>``/``<s>``)."""
        lines = [line.lower() for line in lines] if self.lowercase else list(lines)
        return [self.to_ours[row].tolist() if row else []
                for row in self.processor.encode(lines, out_type=int)]

    def decode(self, ids: Iterable[int]) -> str:
        """One sentence's ids -> text: ``<pad>`` and ``<s>`` are dropped, and everything from
        the first ``</s>`` on; ids outside the vocabulary read as ``[UNK]``."""
        return self.processor.decode(
            [int(self.to_model[i]) for i in text_ids(ids, len(self.pieces))])


def learn_sentencepiece(paths: Sequence[str], output_path: str, vocab_size: int,
                        model_type: str = "unigram", lowercase: bool = False,
                        max_sentences: Optional[int] = None,
                        character_coverage: float = 1.0) -> SentencePieceModel:
    """Learns a SentencePiece model with the package's id layout and writes it atomically.

    Args:
      paths: training text files (source and target for a shared model).
      output_path: the ``.model`` file to write (its directory is created).
      vocab_size: pieces wanted, the reserved ones included (a soft limit: a small corpus
        gives fewer, with a WARNING).
      model_type: ``unigram`` or ``bpe``.
      lowercase: learn on lower-cased text (the tokenizer lower-cases too).
      max_sentences: learn from an evenly spread sample of at most this many non-blank lines
        of all files together (``data.vocab_sample_size``; 0 or None: all).
      character_coverage: share of the sample's characters the model covers.

    Returns:
      The model written.

    Raises:
      DataError: unreadable files, invalid UTF-8, no text at all.
      ValueError: an unknown ``model_type``.
    """
    import sentencepiece

    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown SentencePiece model type {model_type!r} (known: "
                         f"{', '.join(MODEL_TYPES)})")
    lines = [line.lower() if lowercase else line for line in sample_text(paths, max_sentences)]
    if not lines:
        raise DataError(f"cannot learn a SentencePiece model: no text in {', '.join(paths)}")
    logging.info("Learning a SentencePiece %s model of about %d pieces from %d lines of %s",
                 model_type, vocab_size, len(lines), ", ".join(paths))
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type=model_type,
        vocab_size=int(vocab_size), character_coverage=float(character_coverage),
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID, pad_piece=PAD_TOKEN,
        bos_piece=BOS_TOKEN, eos_piece=EOS_TOKEN, unk_piece=UNK_TOKEN,
        input_sentence_size=0, hard_vocab_limit=False, num_threads=os.cpu_count() or 1,
        minloglevel=2)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    tmp = f"{output_path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(model.getvalue())
    os.replace(tmp, output_path)
    learned = SentencePieceModel(output_path, lowercase)
    logging.info("Wrote a SentencePiece model of %d pieces to %s", learned.vocab_size,
                 output_path)
    if learned.vocab_size < 0.9 * vocab_size:
        logging.warning("The SentencePiece model has %d pieces, fewer than the %d asked for: "
                        "the sample has no more (data.vocab_size)", learned.vocab_size,
                        vocab_size)
    return learned


_WORD_START = "\u2581"  # sentencepiece's mark of a piece that starts a word
_SUFFIX = "##"  # deep_nmt_tf.data.vocab.SUFFIX_INDICATOR


def _bpe_pieces(counts: Mapping[str, int], size: int, params: Mapping) -> List[str]:
    import sentencepiece

    with tempfile.TemporaryDirectory() as directory:
        words = os.path.join(directory, "words.tsv")
        with open(words, "w", encoding="utf-8") as f:
            f.writelines(f"{word}\t{count}\n" for word, count in counts.items())
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(**{
            "input": words, "input_format": "tsv", "model_writer": model, "model_type": "bpe",
            "vocab_size": max(int(size), 2), "character_coverage": 1.0,
            "normalization_rule_name": "identity", "add_dummy_prefix": True,
            "remove_extra_whitespaces": False, "split_by_unicode_script": False,
            "split_by_number": False, "hard_vocab_limit": False, "unk_id": 0, "bos_id": -1,
            "eos_id": -1, "pad_id": -1, "num_threads": os.cpu_count() or 1, "minloglevel": 2,
            **dict(params)})
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))]


def learn_wordpiece(counts: Mapping[str, int], vocab_size: int, min_count: int = 1,
                    **params) -> List[str]:
    """A WordPiece vocabulary from word counts with sentencepiece's BPE trainer (C++, every
    core, deterministic): the reserved tokens, every character seen as a word-initial and a
    ``##`` piece, then the BPE pieces in merge order, a piece that starts a word as it is and
    one inside a word with the ``##`` prefix (what ``FastWordpieceTokenizer`` reads).

    Args:
      counts: word -> count (:func:`deep_nmt_tf.data.vocab.count_words`; no whitespace).
      vocab_size: the entries wanted, the reserved ones included (fewer when the words have
        no more merges; more when the characters alone exceed it).
      min_count: pieces are learned from the words seen at least this often (the characters
        of every word are kept).
      **params: more options of ``sentencepiece.SentencePieceTrainer.train``.

    Returns:
      The tokens, ``RESERVED_TOKENS`` first.
    """
    alphabet = sorted({c for word in counts for c in word})
    tokens = list(RESERVED_TOKENS)
    seen = set(tokens)

    def add(token):
        if token and token != _SUFFIX and token not in seen:
            seen.add(token)
            tokens.append(token)

    for prefix in ("", _SUFFIX):
        for c in alphabet:
            add(prefix + c)
    frequent = {w: c for w, c in counts.items() if c >= min_count}
    pieces: List[str] = []
    wanted = vocab_size - len(tokens)
    if frequent and wanted > 0:
        # The model's pieces repeat the characters (and a few word-initial ones): ask for a
        # margin more and keep the first ones, in merge order.
        pieces = _bpe_pieces(frequent, wanted + len(alphabet) + wanted // 20 + 16, params)
    for piece in pieces:
        if len(tokens) >= vocab_size:
            break
        add(piece[1:] if piece.startswith(_WORD_START) else _SUFFIX + piece)
    return tokens
