"""Translation in process: a run directory loaded, sentences batched on the host.

:func:`load_run` loads what inference starts from (the in-process :class:`Translator` and the
SavedModel export, :func:`deep_nmt_tf.export.export_model_dir`, alike): the saved config with
overrides, the vocabulary (refused, naming both files, when it is not the one the run was
trained with), the in-graph tokenizer and the checkpoint the run directory's store resolves
(:meth:`deep_nmt_tf.checkpoints.CheckpointStore.resolve`: the latest that can be read, a given
one, or a run directory's latest; ``ckpt-N`` and ``fit``'s ``.weights.h5`` alike).

:class:`Translator` adds what a command-line tool needs: batching by length and restoring the
input order, n-best lists, results in chunks as they are produced
(:meth:`Translator.translate_chunks`) and progress.  The search options of a call are one
:class:`~deep_nmt_tf.decoding.SearchOptions` (defaults from ``config.decoding``; invalid ones, a
beam below 1, an ``n_best`` above the beam, a length penalty that is negative, NaN or infinite,
are a ``ValueError``, never clamped).  Every batch goes through the export module's
pre-processing (:func:`deep_nmt_tf.export.module.prepare_source`, the one source preparation)
and compiled search (:class:`~deep_nmt_tf.export.module.TranslationModule`,
:mod:`deep_nmt_tf.inference.searches`); with a ``search_cache``
(:mod:`deep_nmt_tf.export.search_cache`; the tools' ``--compilation_cache``) it runs searches
traced by an earlier process, and builds the Keras model only when it has to trace one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from deep_nmt_tf.checkpoints import TF_CHECKPOINT, CheckpointStore, format_of
from deep_nmt_tf.config import Config
from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.data.tokenizers import build_tokenizer
from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.export.module import TranslationModule, prepare_source, resolve_jit_compile
from deep_nmt_tf.inference.searches import Searches
from deep_nmt_tf.run_dir import RunDir

__all__ = ["Translator", "Hypothesis", "LoadedRun", "load_run", "build_tokenizer",
           "length_batches"]


class Hypothesis(NamedTuple):
    """One translation: detokenised ``text``, length-penalised ``score``, token ``ids``."""
    text: str
    score: float
    ids: Tuple[int, ...]


@dataclasses.dataclass
class LoadedRun:
    """A run directory ready for inference (:func:`load_run`).

    Attributes:
      config: the saved config with the overrides applied.
      tokenizer: the in-graph ``Tokenizer`` of the run's vocabulary.
      checkpoint: the checkpoint to load; ``resolved``: checked already (a given ``ckpt-N``
        is checked when it is loaded).
      store: the run directory's checkpoint store.
      precision: the inference precision (``float32``, ``bfloat16``, ``float16``).
    """

    config: Config
    tokenizer: object
    checkpoint: str
    resolved: bool
    store: CheckpointStore
    precision: str

    def build_model(self, restore: bool = True):
        """The model in the inference precision, with the checkpoint's weights (``restore``;
        a checkpoint of another model is refused naming the first variable that differs)."""
        from deep_nmt_tf.models import build_model
        from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

        model = build_model(self.config, dtype=INFERENCE_POLICIES[self.precision])
        if restore:
            format_of(self.checkpoint).restore_model(model, self.checkpoint)
        return model


def load_run(model_dir: str, checkpoint: Optional[str] = None, overrides: Sequence[str] = (),
             precision: str = "float32") -> LoadedRun:
    """Config, vocabulary, tokenizer and checkpoint of a run directory (module docstring).

    Args:
      model_dir: a run directory (``deep-nmt-train``, ``deep-nmt-fit`` or averaging output).
      checkpoint: a checkpoint (``ckpt-N`` or ``ckpt-N.weights.h5``) or a run directory (its
        latest); default the run's latest that can be read (newer damaged ones are skipped
        with a WARNING).
      overrides: config overrides (``decoding.beam_size=8`` ...).
      precision: ``float32``, ``bfloat16`` or ``float16``
        (:data:`~deep_nmt_tf.models.seq2seq.INFERENCE_POLICIES`: the float32 checkpoint is
        rounded when it is loaded; softmax, LayerNorm statistics and the scores stay float32).

    Raises:
      ConfigError: the vocabulary is not the one the run was trained with (naming both).
      FileNotFoundError: no ``config.yaml``, no (such) checkpoint.
      CheckpointError: the checkpoint is damaged.
      ValueError: an unknown precision.
    """
    from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

    if precision not in INFERENCE_POLICIES:
        raise ValueError(f"precision must be one of {', '.join(INFERENCE_POLICIES)}, got "
                         f"{precision!r}")
    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    vocab = run_dir.vocab_path(config)
    run_dir.check_vocab(vocab, run_dir.config_path)
    store = CheckpointStore(run_dir)
    resolved = checkpoint is None or os.path.isdir(checkpoint)
    if resolved:  # the newest readable one (of this run, or of the directory named)
        checkpoint = store.resolve(checkpoint)
    return LoadedRun(config, build_tokenizer(config, vocab), checkpoint, resolved, store,
                     precision)


@functools.lru_cache(maxsize=8)
def _source_preparation(vocab_size: int, max_input_length: int, pad_to_multiple: int):
    """:func:`~deep_nmt_tf.export.module.prepare_source` compiled for rows of token ids packed
    into a ``[B, W]`` int32 array, right-padded with ``<pad>`` (as the ``translate_ids``
    signature takes them; traced once per setting): the host batches with the export module's
    own pre-processing."""
    def prepare(packed):
        tokens = tf.RaggedTensor.from_tensor(packed, padding=PAD_ID)
        return prepare_source(tokens, vocab_size, max_input_length, pad_to_multiple)

    return tf.function(prepare, input_signature=[tf.TensorSpec([None, None], tf.int32)],
                       autograph=False)


def length_batches(lengths: Sequence[int], batch_size: int) -> List[List[int]]:
    """The indices of inputs of these ``lengths`` in batches of at most ``batch_size``, shortest
    first (ties in input order): a batch pads to its longest input and its search runs until
    its longest translation ends, so similar lengths together waste the least.  Put the results
    of ``batch`` back in input order with ``results[i] = out[row]`` for ``row, i in
    enumerate(batch)``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def _pack(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Token-id rows as one ``[B, W]`` int32 array right-padded with ``<pad>`` (at least one
    column)."""
    packed = np.full((len(rows), max([len(r) for r in rows] + [1])), PAD_ID, np.int32)
    for i, row in enumerate(rows):
        packed[i, :len(row)] = row
    return packed


class Translator:
    """Translates lists of sentences with a model, in length-sorted batches.

    Build it from a model directory (:meth:`from_model_dir`) or from objects.

    Args:
      model: a built model, or a function that builds one (called when a search has to be
        traced: with a ``search_cache`` that holds the searches, never).
      tokenizer: the data package's ``Tokenizer``.
      config: the model's :class:`~deep_nmt_tf.config.Config` (its ``decoding`` section holds
        the defaults of :meth:`translate`).
      jit_compile: compile the search with XLA (None: :func:`~deep_nmt_tf.export.module.
        default_jit_compile`).
      pad_to_multiple: see :class:`~deep_nmt_tf.export.module.TranslationModule`.
      precision: the model's inference precision (``float32``, ``bfloat16``, ``float16``;
        default: a built model's compute dtype); required with a model function.
      search_cache: a :class:`~deep_nmt_tf.export.search_cache.SearchCache`: searches traced
        by an earlier process are run from it (with the checkpoint's variables, without the
        Keras model), and new traces are added to it.

    Example:
      >>> tr = Translator.from_model_dir("runs/demo")                   # doctest: +SKIP
      >>> tr.translate(["Ta broku glimo vasu."])[0][0].text               # doctest: +SKIP
    """

    def __init__(self, model, tokenizer, config: Config, jit_compile: Optional[bool] = None,
                 pad_to_multiple: int = 8, precision: Optional[str] = None, search_cache=None):
        self._model, self._build_model = (None, model) if callable(model) and not hasattr(
            model, "variables") else (model, None)
        if precision is None:
            if self._model is None:
                raise ValueError("Translator: precision is required with a model function")
            precision = str(self._model.dtype_policy.compute_dtype)
        self.precision = precision
        self.tokenizer = tokenizer
        self.config = config
        self.jit_compile = resolve_jit_compile(jit_compile, precision)
        self.pad_to_multiple = pad_to_multiple
        self.search_cache = search_cache
        self.checkpoint_path: Optional[str] = None
        #: The search options of :attr:`module` (``config.decoding``).
        self.options = SearchOptions.from_config(config.decoding)
        self.searches = Searches(lambda: self.model, lambda: self._model is not None,
                                 tokenizer, config, precision, self.jit_compile,
                                 pad_to_multiple, search_cache, lambda: self.checkpoint_path)

    @property
    def model(self):
        """The Keras model (built, and the checkpoint restored, on first use)."""
        if self._model is None:
            self._model = self._build_model()
            if self.checkpoint_path is not None:
                format_of(self.checkpoint_path).restore_model(self._model, self.checkpoint_path)
        return self._model

    @property
    def module(self) -> TranslationModule:
        """The export module of the config's search options (what ``deep-nmt-export``
        writes)."""
        return self.searches.module(self.options)

    @classmethod
    def from_model_dir(cls, model_dir: str, checkpoint: Optional[str] = None,
                       overrides: Sequence[str] = (), jit_compile: Optional[bool] = None,
                       pad_to_multiple: int = 8, precision: str = "float32",
                       search_cache: Optional[str] = None) -> "Translator":
        """Loads ``config.yaml``, the vocabulary and a checkpoint (:func:`load_run`).

        Args:
          model_dir, checkpoint, overrides, precision: see :func:`load_run`.
          jit_compile, pad_to_multiple: see :class:`~deep_nmt_tf.export.module.
            TranslationModule`.
          search_cache: a directory of traced searches
            (:class:`~deep_nmt_tf.export.search_cache.SearchCache`).  With it the model is
            built only when a search has to be traced, so a checkpoint that does not fit the
            model is reported by the first translation instead of here.

        Raises:
          ConfigError, FileNotFoundError, CheckpointError, ValueError: see :func:`load_run`
            (CheckpointError also for a checkpoint of another model).
        """
        from deep_nmt_tf.export.search_cache import SearchCache

        run = load_run(model_dir, checkpoint, overrides, precision)
        common = dict(jit_compile=jit_compile, pad_to_multiple=pad_to_multiple)
        if search_cache is None or format_of(run.checkpoint).kind != TF_CHECKPOINT:
            translator = cls(run.build_model(restore=False), run.tokenizer, run.config,
                             **common)
            translator.restore(run.checkpoint)
            return translator
        translator = cls(lambda: run.build_model(restore=False), run.tokenizer, run.config,
                         precision=precision, search_cache=SearchCache(search_cache), **common)
        # Without the model's restore, a given checkpoint is checked here (missing, damaged).
        translator.restore(run.checkpoint if run.resolved else run.store.resolve(run.checkpoint))
        return translator

    def restore(self, checkpoint_path: str):
        """Loads the model variables of another checkpoint (compiled functions are kept)."""
        if self._model is not None:
            format_of(checkpoint_path).restore_model(self._model, checkpoint_path)
        self.checkpoint_path = checkpoint_path
        self.searches.checkpoint_changed()
        logging.info("Restored model weights from %s", checkpoint_path)

    # -- batch entry points (the exported functions) -------------------------------------
    def translate_batch(self, text: Sequence[str]) -> Dict[str, np.ndarray]:
        """One batch through ``translate_text`` (exactly what the SavedModel's
        ``serving_default`` runs); returns numpy arrays."""
        out = self.module.translate_text(tf.constant(list(text), tf.string))
        return {k: v.numpy() for k, v in out.items()}

    # -- host-side batching -------------------------------------------------------------
    def _tokenize(self, sentences: Sequence[str], chunk_size: int = 1024) -> List[np.ndarray]:
        """Token ids of each sentence (no ``</s>``), one int32 array each."""
        out: List[np.ndarray] = []
        for i in range(0, len(sentences), chunk_size):
            ragged = self.tokenizer.tokenize(tf.constant(list(sentences[i:i + chunk_size]),
                                                         tf.string))
            values = ragged.flat_values.numpy().astype(np.int32)
            splits = ragged.row_splits.numpy()
            out.extend(values[a:b] for a, b in zip(splits[:-1], splits[1:]))
        return out

    def tokenize(self, sentences: Sequence[str], chunk_size: int = 1024) -> List[List[int]]:
        """Token ids of each sentence (no ``</s>``)."""
        return [row.tolist() for row in self._tokenize(sentences, chunk_size)]

    def _prepare_rows(self, rows: Sequence) -> tf.Tensor:
        """The export module's source preparation of token-id rows, without the model."""
        prepare = _source_preparation(self.config.model.vocab_size,
                                      self.config.decoding.max_input_length,
                                      max(1, int(self.pad_to_multiple)))
        return prepare(tf.constant(_pack([np.asarray(r, np.int32) for r in rows])))

    def search_options(self, beam_size: Optional[int] = None,
                       length_penalty: Optional[float] = None, n_best: Optional[int] = None,
                       batch_size: Optional[int] = None) -> Tuple[SearchOptions, int]:
        """The search options of a call (defaults from ``config.decoding``:
        :meth:`~deep_nmt_tf.decoding.SearchOptions.from_config`) and the batch size.

        Raises:
          ValueError: a beam or batch size below 1, an ``n_best`` below 1 or above the beam, a
            length penalty that is negative or not finite.
        """
        batch = self.config.decoding.batch_size if batch_size is None else int(batch_size)
        if batch < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch}")
        return SearchOptions.from_config(self.config.decoding, beam_size, n_best,
                                         length_penalty), batch

    def translate(self, sentences: Sequence[str], beam_size: Optional[int] = None,
                  length_penalty: Optional[float] = None, n_best: Optional[int] = None,
                  batch_size: Optional[int] = None,
                  progress: Optional[Callable[[int, int], None]] = None
                  ) -> List[List[Hypothesis]]:
        """Translates sentences; returns, in input order, each sentence's n-best list.

        Sentences are tokenised, sorted by length and decoded ``batch_size`` at a time; the
        results are put back in input order.

        Args:
          sentences: source sentences (str).
          beam_size, length_penalty, n_best, batch_size: default ``config.decoding``
            (:meth:`search_options`).
          progress: called as ``progress(done, total)`` after each batch.

        Raises:
          ValueError: invalid search options (:meth:`search_options`).
        """
        options, batch_size = self.search_options(beam_size, length_penalty, n_best,
                                                  batch_size)
        n_best = options.n_best
        sentences = list(sentences)
        tokens = self._tokenize(sentences)
        results: List[Optional[List[Hypothesis]]] = [None] * len(tokens)
        done = 0
        for index in length_batches([len(t) for t in tokens], batch_size):
            source_ids = self._prepare_rows([tokens[i] for i in index])
            out = self.searches.run(source_ids, options)
            ids = out["ids"].numpy()[:, :n_best]
            scores = out["scores"].numpy()[:, :n_best]
            out_lengths = out["lengths"].numpy()[:, :n_best]
            flat = ids.reshape(-1, ids.shape[-1])
            texts = self.tokenizer.detokenize(tf.constant(flat, tf.int32)).numpy()
            texts = texts.reshape(ids.shape[:2])
            for row, i in enumerate(index):
                results[i] = [Hypothesis(texts[row, k].decode("utf-8"), float(scores[row, k]),
                                         tuple(int(t) for t in ids[row, k, :out_lengths[row, k]]))
                              for k in range(ids.shape[1])]
            done += len(index)
            if progress is not None:
                progress(done, len(tokens))
        return results  # type: ignore[return-value]

    def translate_chunks(self, sentences: Sequence[str], chunk_size: Optional[int] = None,
                         progress: Optional[Callable[[int, int], None]] = None,
                         **options) -> Iterator[List[List[Hypothesis]]]:
        """:meth:`translate` in consecutive chunks of the input, each yielded (in input order)
        as soon as it is decoded, so a caller can write results as they are produced.

        Args:
          sentences: source sentences.
          chunk_size: sentences per chunk (default 16 batches; sorting by length happens
            within a chunk).
          progress: ``progress(done, total)`` over all the sentences.
          options: ``beam_size``, ``length_penalty``, ``n_best``, ``batch_size``.
        """
        sentences = list(sentences)
        batch = self.search_options(**options)[1]
        chunk_size = chunk_size or 16 * batch
        for start in range(0, len(sentences), chunk_size):
            def chunk_progress(done, total, start=start):
                if progress is not None:
                    progress(start + done, len(sentences))

            yield self.translate(sentences[start:start + chunk_size], progress=chunk_progress,
                                 **options)
