"""The tokenizers a run can choose (``data.tokenizer``), in TensorFlow ops, and their builder.

=================  ============================================================================
``wordpiece``      :class:`deep_nmt_tf.data.vocab.Tokenizer`: the package's pre-tokenisation,
                   then tensorflow-text's ``FastWordpieceTokenizer``; ``data.vocab`` is a
                   vocabulary file (one token per line), learned from the word counts with
                   sentencepiece's BPE trainer (or tensorflow-text's learner:
                   ``data.tokenizer.wordpiece.learner``).
``sentencepiece``  :class:`SentencePieceTokenizer`: tensorflow-text's
                   ``SentencepieceTokenizer`` on a ``.model`` file (``data.vocab``), learned
                   with the ``sentencepiece`` package (:func:`deep_nmt_tf.data.spm.
                   learn_sentencepiece`) or an existing one used as it is.
=================  ============================================================================

Both have the same interface: ``tokenize(text)`` (string ``[B]`` -> ragged int32 ids ``[B,
(n)]``, no ``<s>``/``</s>``), ``detokenize(ids)`` (ids -> string ``[B]``; ``<pad>``/``<s>``
dropped, nothing after the first ``</s>``), ``vocab_size``, ``lowercase`` and ``kind``; both are
``tf.Module`` s whose ops run in ``tf.data`` pipelines and inside exported SavedModels (string
in, string out; load with ``import tensorflow_text`` first).  :func:`build_tokenizer` builds
the one a config names; :func:`learn_tokenizer` learns its file from a corpus.

A run directory without ``data.tokenizer`` in its ``config.yaml`` (written before the key
existed) is a WordPiece run.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import tensorflow as tf

from deep_nmt_tf import compat
from deep_nmt_tf.data import spm
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.data.vocab import Tokenizer, TokenizerBase, build_vocab, text_ids

__all__ = ["KINDS", "SentencePieceTokenizer", "build_tokenizer", "learn_tokenizer"]

#: The tokenizer types (``data.tokenizer.type``).
KINDS = ("wordpiece", "sentencepiece")


class SentencePieceTokenizer(TokenizerBase):
    """Text <-> ids with a SentencePiece model, entirely in TensorFlow ops.

    The model's ids are mapped onto the package's (reserved ids 0-3 first:
    :class:`deep_nmt_tf.data.spm.SentencePieceModel`).  The text is normalised as the model
    says (sentencepiece's own normalisation rules), after lower-casing with ``lowercase``.
    ``detokenize(tokenize(x))`` gives the model's normalised form of ``x``; an unknown piece
    reads as sentencepiece's `` ⁇ ``.

    Example:
        >>> tok = SentencePieceTokenizer("sentencepiece.model")            # doctest: +SKIP
        >>> tok.detokenize(tok.tokenize(tf.constant(["Hello, world."])))   # doctest: +SKIP
        <tf.Tensor: shape=(1,), dtype=string, numpy=array([b'Hello, world.'], dtype=object)>

    Args:
      model: the ``.model`` file.
      lowercase: lower-case input text (``data.lowercase``; the setting the model was learned
        with).
      name: module name.

    Raises:
      DataError: no such file, or not a SentencePiece model.
    """

    #: ``data.tokenizer.type`` of this tokenizer.
    kind = "sentencepiece"

    def __init__(self, model: str, lowercase: bool = False, name: Optional[str] = None):
        super().__init__(name=name)
        self._model = spm.SentencePieceModel(os.fspath(model), lowercase)
        self._vocab_size = self._model.vocab_size
        self._lowercase = bool(lowercase)
        self._identity = self._model.identity
        # (tensorflow-text's own resource would vanish with tf.random.set_seed: compat.)
        self._sentencepiece = compat.sentencepiece_tokenizer(self._model.proto)
        if not self._identity:
            self._to_ours = tf.constant(self._model.to_ours)
            self._to_model = tf.constant(self._model.to_model)

    @property
    def model(self) -> spm.SentencePieceModel:
        """The model and its id map (plain Python)."""
        return self._model

    def tokenize(self, text):
        """String ``[B]`` (or a scalar) to int32 ids ``RaggedTensor`` ``[B, (pieces)]`` (1-D
        for a scalar), without BOS/EOS."""
        text = tf.convert_to_tensor(text, tf.string)
        if self._lowercase:
            text = tf.strings.lower(text, encoding="utf-8")
        ids = self._sentencepiece.tokenize(text)
        if self._identity:
            return ids
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(lambda v: tf.gather(self._to_ours, v), ids)
        return tf.gather(self._to_ours, ids)

    def detokenize(self, ids):
        """Ids ``[B, T]`` (dense or ragged; or 1-D) to text ``[B]`` (or a scalar), with the
        rules of :func:`deep_nmt_tf.data.vocab.text_ids` (``<pad>``, ``<s>`` and everything
        from the first ``</s>`` dropped, ids outside the vocabulary read as ``[UNK]``)."""
        ids, single = text_ids(ids, self._vocab_size)
        if not self._identity:
            ids = tf.ragged.map_flat_values(lambda v: tf.gather(self._to_model, v), ids)
        text = self._sentencepiece.detokenize(ids)
        return text[0] if single else text


def build_tokenizer(config, vocab_path: Optional[str] = None):
    """The tokenizer a config names (``data.tokenizer.type``, ``data.lowercase``).

    Args:
      config: a :class:`deep_nmt_tf.config.Config`.
      vocab_path: the tokenizer's file (default ``data.vocab``; a run directory's is
        :meth:`deep_nmt_tf.run_dir.RunDir.vocab_path`).

    Returns:
      A :class:`~deep_nmt_tf.data.vocab.Tokenizer` or a :class:`SentencePieceTokenizer`.

    Raises:
      DataError: no file given (empty ``data.vocab``), or the file is invalid.
    """
    path = vocab_path or config.data.vocab
    if not path:
        raise DataError("data.vocab is empty: run deep_nmt_tf.data.pipeline.prepare_data "
                        "(which learns the tokenizer's file into the run directory) or set "
                        "data.vocab")
    if config.data.tokenizer.type == "sentencepiece":
        return SentencePieceTokenizer(path, lowercase=config.data.lowercase)
    return Tokenizer(path, lowercase=config.data.lowercase)


def learn_tokenizer(data, paths: Sequence[str], output_path: str) -> None:
    """Learns the file of ``data.tokenizer`` from text files into ``output_path``.

    WordPiece: :func:`deep_nmt_tf.data.vocab.build_vocab` with ``data.tokenizer.wordpiece.
    learner``; SentencePiece: :func:`deep_nmt_tf.data.spm.learn_sentencepiece` with ``data.
    tokenizer.sentencepiece``'s options.  Both learn from an evenly spread sample of at most
    ``data.vocab_sample_size`` lines of all files together, ``data.vocab_size`` entries.

    Args:
      data: the config's :class:`~deep_nmt_tf.config.DataConfig`.
      paths: training text files (every corpus's source and target: a shared vocabulary).
      output_path: the file to write.
    """
    options = data.tokenizer.get()
    if data.tokenizer.type == "sentencepiece":
        spm.learn_sentencepiece(paths, output_path, data.vocab_size, options.model_type,
                                data.lowercase, data.vocab_sample_size,
                                options.character_coverage)
    else:
        build_vocab(paths, output_path, data.vocab_size, data.lowercase,
                    max_sentences=data.vocab_sample_size, min_count=data.vocab_min_count,
                    learner=options.learner)
