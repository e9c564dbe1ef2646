"""Text in, text out with a converted CTranslate2 model and the run's own tokenizer.

CTranslate2 translates *tokens*: lists of the vocabulary's strings (``"Hel"``, ``"##lo"``,
``","``; ``"\u2581Hel"``, ``"lo"`` for SentencePiece), never text.  A model written by
:mod:`deep_nmt_tf.export.ctranslate2` carries the run's tokenizer file and ``deep_nmt.json``
(the tokenizer's ``kind``, ``file``, ``sha256`` and ``lowercase``, the decoding settings;
a directory whose record names no kind is WordPiece), so :class:`CTranslate2Translator`
tokenises exactly as training did, maps ids to token strings, lets CTranslate2 search, and
detokenises:

* WordPiece (``vocab.txt``): the in-graph :class:`~deep_nmt_tf.data.vocab.Tokenizer`
  (pre-tokenisation, then WordPiece; TensorFlow), and the plain-Python
  :class:`~deep_nmt_tf.data.token_ids.Detokenizer` back (``##`` pieces glued, punctuation
  re-attached).  By hand, the same is::

    import ctranslate2, tensorflow as tf
    from deep_nmt_tf.data.vocab import Tokenizer, load_vocab
    from deep_nmt_tf.data.token_ids import Detokenizer
    vocab = load_vocab("ct2_model/vocab.txt")
    tokenizer = Tokenizer(vocab, lowercase=False)              # the run's data.lowercase
    ids = tokenizer.tokenize(tf.constant(["Hello, world."])).to_list()
    tokens = [[vocab[i] for i in row] for row in ids]         # no </s>: the model adds it
    out = ctranslate2.Translator("ct2_model").translate_batch(
        tokens, beam_size=1, min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]])
    Detokenizer(vocab)([vocab.index(t) for t in out[0].hypotheses[0]])

* SentencePiece (``sentencepiece.model``): the ``sentencepiece`` package in plain Python, no
  TensorFlow (:class:`~deep_nmt_tf.data.spm.SentencePieceModel`, the same model and id map as
  the in-graph :class:`~deep_nmt_tf.data.tokenizers.SentencePieceTokenizer`): the text
  (lower-cased when ``lowercase`` is recorded) becomes pieces, a piece the model does not know
  becomes ``[UNK]``, and the output pieces are decoded by the model.  By hand::

    import ctranslate2, sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file="ct2_model/sentencepiece.model")
    unk = sp.id_to_piece(sp.unk_id())                          # [UNK] for a model learned here
    pieces = sp.encode(["Hello, world."], out_type=str)       # text.lower() if lowercase
    tokens = [["[UNK]" if sp.piece_to_id(p) == sp.unk_id() else p for p in row]
              for row in pieces]                              # no </s>: the model adds it
    out = ctranslate2.Translator("ct2_model").translate_batch(
        tokens, beam_size=1, min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]])
    sp.decode_pieces([unk if t == "[UNK]" else t for t in out[0].hypotheses[0]])

Source preparation and length limits follow :class:`~deep_nmt_tf.inference.Translator`:
``<pad>``/``<s>``/``</s>`` tokens are dropped, a source keeps at most
``decoding.max_input_length - 1`` tokens (the model appends ``</s>``), a translation at most
``floor(max_length_a * n + max_length_b)`` tokens (``n`` the source tokens; CTranslate2 is
called once per distinct limit), ``<pad>`` and ``<s>`` are never generated and ``</s>`` may be
generated from the first step.  Greedy search (``beam_size=1``) then gives our greedy search's
tokens, with one exception: a blank text (no tokens) gets an empty translation without
decoding (CTranslate2's rule), where ours decodes ``</s>`` alone.  Beam search is
CTranslate2's own, which is not ours: its ``length_penalty`` divides a hypothesis'
log-probability by ``length ** alpha`` (ours by GNMT's ``((5 + length) / 6) ** alpha``), it
may stop a sentence at another step (both keep finished hypotheses aside), and it renormalises
the softmax without ``<pad>``/``<s>`` (ours does not); see ``docs/SERVING.md``.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Dict, List, NamedTuple, Optional, Sequence

from deep_nmt_tf.config.rules import check_search_options
from deep_nmt_tf.constants import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_ID, UNK_TOKEN
from deep_nmt_tf.export.ctranslate2 import (METADATA_FILE, SENTENCEPIECE_FILE, TOKENIZER_KINDS,
                                            VOCAB_FILE, require_ctranslate2)

__all__ = ["CTranslate2Translator", "CT2Hypothesis"]

_DEFAULT_DECODING = {"beam_size": 4, "length_penalty": 0.6, "max_length_a": 1.5,
                     "max_length_b": 10, "n_best": 1, "max_input_length": 256,
                     "batch_size": 32}
_NEVER = [[PAD_TOKEN], [BOS_TOKEN]]  # Never generated (decoding/search.py bans them too).


class CT2Hypothesis(NamedTuple):
    """One translation: detokenised ``text``, CTranslate2's ``score``, the ``tokens``."""
    text: str
    score: float
    tokens: List[str]


class CTranslate2Translator:
    """Translates text with a model directory written by the CTranslate2 converter.

    Args:
      model_dir: the converted model (``deep-nmt-export --format=ctranslate2`` output).
      device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
      compute_type: CTranslate2's compute type (``"default"``: the weights' type;
        ``"int8"``, ``"int8_float32"``, ``"float16"``, ``"bfloat16"``, ...).
      inter_threads, intra_threads: CTranslate2's parallel translations and threads per
        translation (0: its default).
      tokenizer: an object with the :class:`~deep_nmt_tf.data.vocab.Tokenizer` interface
        (``tokenize(tf string tensor) -> ragged ids``); default: the model directory's
        tokenizer (module docstring) with its lower-casing setting.

    Raises:
      FileNotFoundError: no ``deep_nmt.json`` in ``model_dir``.
      ValueError: an unknown tokenizer kind, or a tokenizer file whose sha256 is not the one
        ``deep_nmt.json`` records (naming both).
      DataError: an invalid tokenizer file.

    Example:
      >>> t = CTranslate2Translator("runs/demo/ctranslate2")       # doctest: +SKIP
      >>> t.translate(["Ta kagugus ko paglagli."], beam_size=1)     # doctest: +SKIP
    """

    def __init__(self, model_dir: str, device: str = "cpu", compute_type: str = "default",
                 inter_threads: int = 1, intra_threads: int = 0, tokenizer=None):
        ctranslate2 = require_ctranslate2()

        meta_path = os.path.join(model_dir, METADATA_FILE)
        if not os.path.exists(meta_path):
            raise FileNotFoundError(f"{meta_path} not found: {model_dir} is not a model written "
                                    "by deep-nmt-export --format=ctranslate2")
        with open(meta_path, encoding="utf-8") as f:
            self.metadata: Dict = json.load(f)
        record = self.metadata.get("tokenizer") or {}
        #: ``wordpiece`` or ``sentencepiece`` (a record without a kind: ``wordpiece``).
        self.kind = record.get("kind") or "wordpiece"
        self.lowercase = bool(record.get("lowercase", False))
        self._sentencepiece = None
        self._load_tokenizer(model_dir, meta_path, record)
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        self.decoding = dict(_DEFAULT_DECODING, **self.metadata.get("decoding", {}))
        self.max_positions = int(self.metadata.get("max_positions", 0)) or None
        self._tokenizer = tokenizer
        self.translator = ctranslate2.Translator(model_dir, device=device,
                                                 compute_type=compute_type,
                                                 inter_threads=inter_threads,
                                                 intra_threads=intra_threads)

    def _load_tokenizer(self, model_dir: str, meta_path: str, record: Dict) -> None:
        """Sets ``vocab`` (the tokens by id) and the detokenizer of the recorded tokenizer."""
        from deep_nmt_tf.data.spm import SentencePieceModel
        from deep_nmt_tf.data.token_ids import Detokenizer
        from deep_nmt_tf.data.vocab import load_vocab
        from deep_nmt_tf.run_dir import file_sha256

        if self.kind not in TOKENIZER_KINDS:
            raise ValueError(f"{meta_path}: tokenizer.kind {self.kind!r} is unknown (known: "
                             f"{', '.join(TOKENIZER_KINDS)})")
        default = SENTENCEPIECE_FILE if self.kind == "sentencepiece" else VOCAB_FILE
        path = os.path.join(model_dir, record.get("file") or default)
        if record.get("sha256") and os.path.exists(path) \
                and file_sha256(path) != record["sha256"]:
            raise ValueError(f"{path} (sha256 {file_sha256(path)[:12]}...) is not the "
                             f"{self.kind} file the model was converted with (sha256 "
                             f"{record['sha256'][:12]}..., recorded in {meta_path})")
        if self.kind == "sentencepiece":
            self._sentencepiece = SentencePieceModel(path, self.lowercase)
            self.vocab = self._sentencepiece.pieces
            self._detokenizer = self._sentencepiece.decode
        else:
            self.vocab = load_vocab(path)
            self._detokenizer = Detokenizer(self.vocab)

    # -- tokens <-> text ------------------------------------------------------------------------
    @property
    def tokenizer(self):
        """The run's in-graph tokenizer (built on first use; imports TensorFlow)."""
        if self._tokenizer is None:
            if self._sentencepiece is not None:
                from deep_nmt_tf.data.tokenizers import SentencePieceTokenizer

                self._tokenizer = SentencePieceTokenizer(self._sentencepiece.path,
                                                         lowercase=self.lowercase)
            else:
                from deep_nmt_tf.data.vocab import Tokenizer

                self._tokenizer = Tokenizer(self.vocab, lowercase=self.lowercase)
        return self._tokenizer

    def tokenize(self, texts: Sequence[str]) -> List[List[str]]:
        """Texts -> the vocabulary's token strings (no ``</s>``).  SentencePiece runs (without
        a ``tokenizer`` given) tokenise in plain Python, without TensorFlow: the model's ids
        mapped to ours, so an unknown piece is ``[UNK]``."""
        if not texts:
            return []
        if self._sentencepiece is not None and self._tokenizer is None:
            ids = self._sentencepiece.encode(list(texts))
        else:
            import tensorflow as tf

            ids = self.tokenizer.tokenize(tf.constant(list(texts))).to_list()
        return [[self.vocab[i] for i in row] for row in ids]

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Token strings -> text (unknown strings read as ``[UNK]``)."""
        return self._detokenizer([self._ids.get(t, UNK_ID) for t in tokens])

    # -- translation ----------------------------------------------------------------------------
    def _source(self, tokens: Sequence[str]) -> List[str]:
        keep = [t if t in self._ids else UNK_TOKEN for t in tokens
                if t not in (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)]
        longest = int(self.decoding["max_input_length"])
        if self.max_positions is not None:
            longest = min(longest, self.max_positions)
        return keep[: max(1, longest) - 1]

    def _limit(self, source: Sequence[str], a: float, b: float) -> int:
        limit = int(math.floor(float(a) * len(source) + float(b)))
        if self.max_positions is not None:
            limit = min(limit, self.max_positions)
        return max(limit, 1)

    def translate_tokens(self, sources: Sequence[Sequence[str]], beam_size: Optional[int] = None,
                         length_penalty: Optional[float] = None, n_best: Optional[int] = None,
                         max_length_a: Optional[float] = None,
                         max_length_b: Optional[float] = None) -> List[List[CT2Hypothesis]]:
        """Translates token lists; ``n_best`` hypotheses per source, best first.

        Args:
          sources: token strings per sentence (module docstring: what is dropped/truncated).
          beam_size: 1 for greedy search (default: the run's ``decoding.beam_size``).
          length_penalty: CTranslate2's (``score / length ** alpha``, not GNMT's; default:
            the run's ``decoding.length_penalty`` value).
          n_best: hypotheses per sentence (at most ``beam_size``; default: the run's
            ``decoding.n_best``, capped at ``beam_size``).
          max_length_a, max_length_b: the output limit ``floor(a * n + b)`` (default: the
            run's).

        Returns:
          Per source, a list of :class:`CT2Hypothesis` (``score``: CTranslate2's, the
          log-probability divided by its length penalty).
        """
        d = self.decoding
        beam_size = int(d["beam_size"] if beam_size is None else beam_size)
        length_penalty = float(d["length_penalty"] if length_penalty is None
                               else length_penalty)
        # As Translator.search_options: the run's n_best is capped at a smaller beam given here.
        n_best = min(int(d["n_best"]), beam_size) if n_best is None else int(n_best)
        a = d["max_length_a"] if max_length_a is None else max_length_a
        b = d["max_length_b"] if max_length_b is None else max_length_b
        check_search_options(beam_size, n_best, length_penalty)  # a ValueError naming the option
        prepared = [self._source(s) for s in sources]
        groups = collections.defaultdict(list)
        for i, source in enumerate(prepared):
            groups[self._limit(source, a, b)].append(i)
        results: List[Optional[List[CT2Hypothesis]]] = [None] * len(prepared)
        for limit, indices in sorted(groups.items()):
            out = self.translator.translate_batch(
                [prepared[i] for i in indices], beam_size=beam_size,
                length_penalty=length_penalty, num_hypotheses=n_best, return_scores=True,
                max_input_length=0, max_decoding_length=limit, min_decoding_length=0,
                suppress_sequences=_NEVER, max_batch_size=int(d["batch_size"]))
            for i, result in zip(indices, out):
                results[i] = [CT2Hypothesis(self.detokenize(tokens), float(score), list(tokens))
                              for tokens, score in zip(result.hypotheses, result.scores)]
        return results

    def translate_hypotheses(self, texts: Sequence[str], **options) -> List[List[CT2Hypothesis]]:
        """Texts -> ``n_best`` :class:`CT2Hypothesis` per text (options: ``translate_tokens``)."""
        return self.translate_tokens(self.tokenize(texts), **options)

    def translate(self, texts: Sequence[str], **options) -> List[str]:
        """Texts -> best translations (options: :meth:`translate_tokens`)."""
        return [h[0].text for h in self.translate_hypotheses(texts, **options)]
