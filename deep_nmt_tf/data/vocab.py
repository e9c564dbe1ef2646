"""Shared WordPiece vocabulary and the in-graph :class:`Tokenizer` (tensorflow-text).

The vocabulary is learned (:func:`learn_vocab`) from the counts of the words of step 1 below,
by sentencepiece's BPE trainer (the default: about a second after counting, deterministic;
:func:`deep_nmt_tf.data.spm.learn_wordpiece`) or by tensorflow-text's Python learner
(``data.tokenizer.wordpiece.learner: tensorflow_text``, the learner of earlier versions:
minutes); both give the format ``FastWordpieceTokenizer`` reads.

Text goes through three steps, all TensorFlow ops, so they run in ``tf.data`` pipelines and in
``tf.function`` s exported to a SavedModel (load it with ``import tensorflow_text`` first):

1. **Pre-tokenisation** (:func:`pretokenize`): Unicode NFC normalisation, removal of invisible
   characters (byte-order marks, zero-width spaces and joiners, soft hyphens, direction marks,
   variation selectors and the other default-ignorable code points, control characters that
   are not whitespace: :data:`INVISIBLE_CHAR`), optional lower-casing, then every punctuation
   or symbol character becomes a word of its own, except when it sits between two
   letters/digits (``don't``, ``well-known``, ``3.5`` and ``U.S`` stay single words);
   finally the text is split on whitespace (as Python's ``str.isspace`` defines it).
2. **WordPiece** (``tensorflow_text.FastWordpieceTokenizer``) splits each word into pieces;
   continuation pieces carry the ``##`` prefix.
3. **Detokenisation** (:meth:`Tokenizer.detokenize`) drops ``<pad>``/``<s>``/``</s>`` (and
   everything after the first ``</s>``), glues ``##`` pieces onto the previous piece, joins words
   with single spaces and re-attaches punctuation: no space before ``. , ! ? ; : % ) ] } … ” ’``,
   none after ``( [ { ¿ ¡ “ ‘ $ £ € ¥``, and ASCII double quotes pair up around their content.

The round trip ``detokenize(tokenize(x)) == x`` is exact for *normalised* text: single spaces,
no leading/trailing whitespace, NFC, lower-case if ``lowercase``, no out-of-vocabulary
characters, punctuation written as the rules in step 3 put it (``Hello, world (really)!``).
With ``reattach_punctuation=False`` it is exact for text whose punctuation is already split
off by spaces instead (``Hello , world ( really ) !``).

The vocabulary file has one token per line; lines 1-4 are the reserved tokens of
:mod:`deep_nmt_tf.constants` (ids 0-3).  Pre-tokenisation splits ``<``, ``/``, ``>``, ``[`` and
``]`` off, so no input text can produce the ids of ``<pad>``, ``<s>`` or ``</s>``.
"""

from __future__ import annotations

import collections
import itertools
import os
from typing import List, Mapping, Optional, Sequence, Union

import tensorflow as tf
import tensorflow_text as tf_text
from absl import logging
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner_lib

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS, UNK_ID, UNK_TOKEN
from deep_nmt_tf.data.spm import learn_wordpiece
from deep_nmt_tf.data.text_io import DataError, read_lines, sample_text

__all__ = [
    "SUFFIX_INDICATOR",
    "WHITESPACE_CHAR",
    "INVISIBLE_CHAR",
    "pretokenize",
    "reattach_punctuation",
    "count_words",
    "learn_vocab",
    "write_vocab",
    "build_vocab",
    "load_vocab",
    "vocab_size",
    "text_ids",
    "TokenizerBase",
    "Tokenizer",
]

SUFFIX_INDICATOR = "##"

# Private-use character that marks the split points around punctuation during pre-tokenisation;
# removed from the input first, so it cannot clash with real text.
_MARK = "\ue000"
# RE2 class of the characters for which Python's str.isspace() is true.
WHITESPACE_CHAR = r"[\s\v\x{1c}-\x{1f}\x{85}\p{Z}]"
# RE2 class of the characters removed before tokenisation (so they never reach the vocabulary):
# Unicode's Default_Ignorable_Code_Point (BOM U+FEFF, zero-width space/joiners U+200B-U+200D,
# direction marks and embeddings, soft hyphen, variation selectors, Hangul fillers, tags ...)
# and the C0/C1 control characters that are not whitespace.
INVISIBLE_CHAR = (r"[\x{0}-\x{8}\x{e}-\x{1b}\x{7f}-\x{84}\x{86}-\x{9f}\x{ad}\x{34f}\x{61c}"
                  r"\x{115f}\x{1160}\x{17b4}\x{17b5}\x{180b}-\x{180f}\x{200b}-\x{200f}"
                  r"\x{202a}-\x{202e}\x{2060}-\x{206f}\x{3164}\x{fe00}-\x{fe0f}\x{feff}"
                  r"\x{ffa0}\x{fff0}-\x{fff8}\x{1bca0}-\x{1bca3}\x{1d173}-\x{1d17a}"
                  r"\x{e0000}-\x{e0fff}]")
_WORD_CHAR = r"[\pL\pN\pM]"
_PUNCT_CHAR = r"[\pP\pS]"
_CLOSERS = r"[.,!?;:%)\]}…”’]"
_OPENERS = r"[(\[{¿¡“‘$£€¥]"
_COUNT_BATCH = 4096


# ---------------------------------------------------------------------------------------------
# Text transformations (graph ops)
# ---------------------------------------------------------------------------------------------


def pretokenize(text, lowercase: bool = False):
    """Splits text into words and punctuation (see the module docstring).

    Args:
      text: string ``Tensor`` of any shape ``[...]`` (typically ``[B]`` or a scalar).
      lowercase: lower-case (Unicode-aware) before splitting.

    Returns:
      String ``RaggedTensor`` ``[..., (words)]`` (a dense 1-D ``Tensor`` for a scalar input).
    """
    text = tf_text.normalize_utf8(tf.convert_to_tensor(text, tf.string), "NFC")
    text = tf.strings.regex_replace(text, INVISIBLE_CHAR, "")
    if lowercase:
        text = tf.strings.lower(text, encoding="utf-8")
    # Every whitespace character (as Python's str.isspace() defines it) and the mark become an
    # ASCII space, so words never contain whitespace.  (tensorflow_text.WhitespaceTokenizer is
    # avoided: in tensorflow-text 2.21 it leaves bytes of multi-byte spaces such as U+3000 in
    # the words.)
    text = tf.strings.regex_replace(text, f"[{_MARK}]|{WHITESPACE_CHAR}", " ")
    text = tf.strings.regex_replace(text, f"({_PUNCT_CHAR})", f"{_MARK}\\1{_MARK}")
    # Re-join punctuation between two word characters.  Matches cannot overlap, so a second
    # pass handles chains with one-character gaps such as "a-b-c".
    sandwiched = f"({_WORD_CHAR}){_MARK}({_PUNCT_CHAR}){_MARK}({_WORD_CHAR})"
    for _ in range(2):
        text = tf.strings.regex_replace(text, sandwiched, r"\1\2\3")
    text = tf.strings.regex_replace(text, _MARK, " ")
    return tf.strings.split(text)  # On ASCII whitespace; no empty words.


def reattach_punctuation(text):
    """Removes the spaces detokenisation leaves around punctuation (module docstring, step 3).

    Args:
      text: string ``Tensor`` of words joined by single spaces.

    Returns:
      String ``Tensor`` of the same shape.
    """
    text = tf.strings.regex_replace(text, f" ({_CLOSERS})", r"\1")
    text = tf.strings.regex_replace(text, f"({_OPENERS}) ", r"\1")
    return tf.strings.regex_replace(text, r'" ([^"]*?) "', r'"\1"')


# ---------------------------------------------------------------------------------------------
# Vocabulary learning and files
# ---------------------------------------------------------------------------------------------


def count_words(paths: Sequence[str], lowercase: bool = False,
                max_sentences: Optional[int] = None) -> collections.Counter:
    """Counts pre-tokenised words (:func:`pretokenize`) in text files, streaming.

    Args:
      paths: UTF-8 text files, one sentence per line.
      lowercase: lower-case first (as the tokenizer will).
      max_sentences: count the words of at most this many lines of all files together,
        spread evenly over them (:func:`sample_lines`; 0 or None: every line).  Every line
        is still read (and checked to be UTF-8).

    Returns:
      ``Counter`` mapping word (str) to count.

    Raises:
      DataError: a file is missing or has invalid UTF-8 (names file and line).
    """
    split = tf.function(lambda lines: pretokenize(lines, lowercase).flat_values,
                        input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    counts: collections.Counter = collections.Counter()
    lines = sample_text(paths, max_sentences)
    while True:
        batch = list(itertools.islice(lines, _COUNT_BATCH))
        if not batch:
            break
        counts.update(split(tf.constant(batch)).numpy().tolist())
    return collections.Counter({word.decode("utf-8"): n for word, n in counts.items()})


#: The WordPiece learners (``data.tokenizer.wordpiece.learner``).
LEARNERS = ("sentencepiece", "tensorflow_text")


def learn_vocab(paths: Sequence[str], vocab_size: int, lowercase: bool = False,
                learn_params: Optional[Mapping] = None,
                max_sentences: Optional[int] = None, min_count: int = 10,
                learner: str = "sentencepiece") -> List[str]:
    """Learns a WordPiece vocabulary from the words of :func:`count_words`.

    Args:
      paths: training text files (source and target for a shared vocabulary).
      vocab_size: target size, reserved tokens included.  A small corpus gives fewer tokens.
        Every character seen gets a word-initial and a ``##`` token (tensorflow-text: up to
        its ``max_unique_chars``), which can push the size above ``vocab_size`` for scripts
        with very many characters.
      lowercase: learn on lower-cased text (must match the tokenizer's setting).
      learn_params: extra keyword arguments of the learner: sentencepiece's trainer
        (``max_sentencepiece_length`` ...) or tensorflow-text's
        ``wordpiece_tokenizer_learner_lib.learn`` (``num_iterations``, ``max_input_tokens``
        ...).
      max_sentences: learn from an evenly spread sample of at most this many lines
        (:func:`count_words`; 0 or None: all).
      min_count: the least count of a word (sentencepiece: pieces are learned from the words
        seen this often; every character counts) or a piece (tensorflow-text's
        ``lower_thresh``) that the learner keeps (``data.vocab_min_count``): it caps the
        vocabulary of a small corpus.
      learner: ``sentencepiece`` (:func:`deep_nmt_tf.data.spm.learn_wordpiece`: sentencepiece's
        BPE trainer on the word counts, about a second after counting, deterministic;
        BENCHMARKS.md) or ``tensorflow_text`` (tensorflow-text's Python learner, minutes: the
        learner of deep_nmt_tf 0.2 and before).

    Returns:
      The tokens, ``RESERVED_TOKENS`` first (ids 0-3).

    Raises:
      DataError: unreadable files, invalid UTF-8, or no words at all.
      ValueError: an unknown ``learner``.
    """
    if learner not in LEARNERS:
        raise ValueError(f"unknown WordPiece learner {learner!r} (known: {', '.join(LEARNERS)})")
    counts = count_words(paths, lowercase, max_sentences)
    if not counts:
        raise DataError(f"cannot learn a vocabulary: no words in {', '.join(paths)}")
    if learner == "sentencepiece":
        tokens = learn_wordpiece(counts, vocab_size, min_count, **dict(learn_params or {}))
    else:
        params = {"lower_thresh": int(min_count), **dict(learn_params or {})}
        tokens = learner_lib.learn(dict(counts), vocab_size, list(RESERVED_TOKENS), **params)
    if tuple(tokens[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:  # Guard against learner changes.
        raise AssertionError(f"vocabulary learner did not put {RESERVED_TOKENS} first")
    return list(tokens)


def write_vocab(tokens: Sequence[str], path: str):
    """Writes one token per line (UTF-8), atomically (temporary file + rename).

    Args:
      tokens: the vocabulary, reserved tokens first.
      path: output file; its directory is created if needed.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for token in tokens:
            f.write(token + "\n")
    os.replace(tmp, path)


def build_vocab(paths: Sequence[str], output_path: str, vocab_size: int,
                lowercase: bool = False, learn_params: Optional[Mapping] = None,
                max_sentences: Optional[int] = None, min_count: int = 10,
                learner: str = "sentencepiece") -> List[str]:
    """:func:`learn_vocab` + :func:`write_vocab`, with logging (a WARNING when the vocabulary
    falls short of ``vocab_size`` by more than 10%, naming ``min_count``).

    Args:
      paths: training text files.
      output_path: vocabulary file to write (overwritten).
      vocab_size: target size (see :func:`learn_vocab`).
      lowercase: learn on lower-cased text.
      learn_params: extra arguments for the learner.
      max_sentences: learn from at most this many lines (``data.vocab_sample_size``).
      min_count: see :func:`learn_vocab` (``data.vocab_min_count``).
      learner: ``sentencepiece`` or ``tensorflow_text`` (:func:`learn_vocab`;
        ``data.tokenizer.wordpiece.learner``).

    Returns:
      The tokens written.
    """
    logging.info("Learning a WordPiece vocabulary of about %d tokens from %s (%s learner)",
                 vocab_size, ", ".join(paths), learner)
    tokens = learn_vocab(paths, vocab_size, lowercase, learn_params, max_sentences, min_count,
                         learner)
    write_vocab(tokens, output_path)
    logging.info("Wrote %d tokens to %s", len(tokens), output_path)
    if len(tokens) < 0.9 * vocab_size:
        logging.warning("The vocabulary has %d tokens, fewer than the %d asked for: the corpus "
                        "has no more pieces seen at least %d times (data.vocab_min_count, "
                        "--min_count of deep-nmt-build-vocab: lower it for a larger vocabulary)",
                        len(tokens), vocab_size, min_count)
    return tokens


def load_vocab(path: str) -> List[str]:
    """Reads and validates a vocabulary file.

    Args:
      path: one token per line, the reserved tokens on lines 1-4.

    Returns:
      The tokens; token ``i`` has id ``i``.

    Raises:
      DataError: naming the file (and line): missing file, invalid UTF-8, reserved tokens not
        at ids 0-3, empty or whitespace-containing tokens, duplicates.
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: vocabulary file not found")
    tokens = list(read_lines(path))
    for i, expected in enumerate(RESERVED_TOKENS):
        found = tokens[i] if i < len(tokens) else "<end of file>"
        if found != expected:
            bom = (" (the file starts with a byte-order mark: save it as UTF-8 without one)"
                   if i == 0 and found.startswith("\ufeff") else "")
            raise DataError(f"{path}:{i + 1}: expected reserved token {expected!r} (id {i}), "
                            f"found {found!r}{bom}; a vocabulary must start with "
                            f"{', '.join(RESERVED_TOKENS)} on lines 1-4")
    first_line = {}
    for line_number, token in enumerate(tokens, start=1):
        if not token or token != token.strip() or len(token.split()) != 1:
            raise DataError(f"{path}:{line_number}: invalid token {token!r} (empty or contains "
                            f"whitespace)")
        if token in first_line:
            raise DataError(f"{path}:{line_number}: duplicate token {token!r} (first on line "
                            f"{first_line[token]})")
        first_line[token] = line_number
    return tokens


def vocab_size(path: str) -> int:
    """Number of tokens in a (validated) vocabulary file.

    Args:
      path: vocabulary file.
    """
    return len(load_vocab(path))


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


def text_ids(ids, vocab_size: int):
    """The ids that detokenisation turns into text (every tokenizer's rule).

    Args:
      ids: int ``Tensor`` ``[B, T]`` or ``RaggedTensor`` ``[B, (T)]`` (or 1-D for one
        sentence).
      vocab_size: ids at or above it (and negative ones) read as ``[UNK]``.

    Returns:
      ``(ragged int32 [B, (n)], single)``: ``<pad>`` and ``<s>`` dropped anywhere, and
      everything from the first ``</s>`` on; ``single``: the input was 1-D.
    """
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    single = ids.shape.rank == 1
    if single:
        ids = ids[tf.newaxis]
    ids = tf.where((ids >= 0) & (ids < vocab_size), ids, UNK_ID)
    after_eos = tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1) > 0
    keep = ~after_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
    return tf.ragged.boolean_mask(ids, keep), single


class TokenizerBase(tf.Module):
    """What every tokenizer of the package has (:mod:`deep_nmt_tf.data.tokenizers`):
    ``kind`` (its ``data.tokenizer.type``), ``vocab_size``, ``lowercase``, and the graph
    methods ``tokenize`` and ``detokenize``."""

    kind = ""

    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids are 0 .. vocab_size - 1)."""
        return self._vocab_size

    @property
    def lowercase(self) -> bool:
        """Whether input text is lower-cased."""
        return self._lowercase


class Tokenizer(TokenizerBase):
    """Text <-> WordPiece ids, entirely in TensorFlow ops (tf.data, tf.function, SavedModel).

    Example:
        >>> tok = Tokenizer("vocab.txt")                                  # doctest: +SKIP
        >>> ids = tok.tokenize(tf.constant(["Hello, world."]))            # doctest: +SKIP
        >>> tok.detokenize(ids)                                           # doctest: +SKIP
        <tf.Tensor: shape=(1,), dtype=string, numpy=array([b'Hello, world.'], dtype=object)>

    Args:
      vocab: a vocabulary file path, or the token list (reserved tokens first).
      lowercase: lower-case input text (use the setting the vocabulary was learned with).
      reattach_punctuation: detokenize re-attaches punctuation (module docstring, step 3);
        False leaves every token separated by one space.
      name: module name.
    """

    #: ``data.tokenizer.type`` of this tokenizer.
    kind = "wordpiece"

    def __init__(self, vocab: Union[str, os.PathLike, Sequence[str]], lowercase: bool = False,
                 reattach_punctuation: bool = True, name: Optional[str] = None):
        super().__init__(name=name)
        if isinstance(vocab, (str, os.PathLike)):
            tokens = load_vocab(os.fspath(vocab))
        else:
            tokens = list(vocab)
            if tuple(tokens[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
                raise DataError(f"vocabulary list must start with {RESERVED_TOKENS}, got "
                                f"{tokens[:len(RESERVED_TOKENS)]}")
        self._vocab_size = len(tokens)
        self._lowercase = bool(lowercase)
        self._reattach = bool(reattach_punctuation)
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=tokens, suffix_indicator=SUFFIX_INDICATOR, unknown_token=UNK_TOKEN,
            no_pretokenization=True, support_detokenization=True, token_out_type=tf.int32)

    @classmethod
    def from_config(cls, config) -> "Tokenizer":
        """The tokenizer of a (prepared) :class:`deep_nmt_tf.config.Config`.

        Args:
          config: config whose ``data.vocab`` is set (see ``pipeline.prepare_data``).

        Raises:
          DataError: ``data.vocab`` is empty or the file is invalid, or the config's
            tokenizer is not WordPiece (:func:`deep_nmt_tf.data.tokenizers.build_tokenizer`
            builds any).
        """
        if not config.data.vocab:
            raise DataError("data.vocab is empty: run deep_nmt_tf.data.pipeline.prepare_data "
                            "(which sets it to MODEL_DIR/vocab.txt) or set data.vocab")
        if config.data.tokenizer.type != cls.kind:
            raise DataError(f"data.tokenizer.type is {config.data.tokenizer.type!r}, not "
                            "wordpiece: build the tokenizer with deep_nmt_tf.data.tokenizers."
                            "build_tokenizer")
        return cls(config.data.vocab, lowercase=config.data.lowercase)

    def tokenize(self, text):
        """Text to WordPiece ids (no BOS/EOS added).

        Args:
          text: string ``Tensor`` ``[B]`` (or a scalar).

        Returns:
          int32 ``RaggedTensor`` ``[B, (pieces)]`` (a 1-D ``Tensor`` for a scalar input).
        """
        words = pretokenize(text, self._lowercase)
        return self._wordpiece.tokenize(words).merge_dims(-2, -1)

    def detokenize(self, ids):
        """WordPiece ids to text.

        Args:
          ids: int ``Tensor`` ``[B, T]`` or ``RaggedTensor`` ``[B, (T)]`` (or 1-D for one
            sentence).  ``<pad>`` and ``<s>`` are dropped anywhere, and everything from the
            first ``</s>`` on; ids outside the vocabulary read as ``[UNK]``.

        Returns:
          string ``Tensor`` ``[B]`` (a scalar for 1-D input).
        """
        ids, single = text_ids(ids, self._vocab_size)
        text = self._wordpiece.detokenize(ids)
        if self._reattach:
            text = reattach_punctuation(text)
        return text[0] if single else text
