"""Translation with TensorFlow: in-graph tokenisation + compiled search, and model directories.

:class:`TranslationModule` is a ``tf.Module`` that holds a model, its :class:`Tokenizer` and the
decoding parameters, and defines the ``tf.function`` s that both the in-process
:class:`Translator` and the exported SavedModel (:mod:`deep_nmt_tf.export.saved_model`) run:

* ``translate_text(text)``: ``[B]`` UTF-8 strings -> best translations, scores and n-best lists
  (tokenisation and detokenisation in the graph, tensorflow-text);
* ``translate_text_with_options(text, beam_size, length_penalty)``: the same with the beam
  size and length penalty as inputs (best hypothesis only);
* ``translate_ids(source_ids)``: ``[B, S]`` token ids -> ids, lengths and scores.

Source preparation (all entry points): ids outside ``[0, vocab)`` become ``[UNK]``;
``<pad>``/``<s>``/``</s>`` are dropped; the tokens are truncated to
``decoding.max_input_length - 1`` and ``</s>`` is appended (so the encoder never sees more than
``max_input_length`` tokens, like ``data.max_source_length`` in training); rows are padded with
``<pad>`` to a width rounded up to a multiple of ``pad_to_multiple`` (fewer distinct shapes to
compile).  Empty and whitespace-only inputs become ``[</s>]`` and get a (possibly empty)
translation; the output length is at most ``a * max_input_length + b`` (+ padding slack).

The search runs in a ``tf.function`` compiled with XLA (``jit_compile=True``): the decode loop
has static shapes and XLA fuses it, updates the caches in place and removes the per-op overhead
(``docs/SERVING.md``, BENCHMARKS.md).  Each new input shape (batch size, padded width) is
compiled once.  ``jit_compile=None`` (the default) chooses with :func:`default_jit_compile`: XLA,
except for a bfloat16 model on a machine without GPU or TPU, where XLA's CPU backend runs
bfloat16 matmuls at about the float32 rate, half of what the plain graph's oneDNN kernels reach
(BENCHMARKS.md, "Decoding"), so the plain graph decodes faster.

:class:`Translator` adds what a command-line tool needs on top: loading a run directory
(config, vocabulary and latest or given checkpoint, through :class:`deep_nmt_tf.run_dir.RunDir`;
a vocabulary other than the one the run was trained with is refused, naming both files),
batching by length and restoring the input order, n-best lists, results in chunks as they are
produced (:meth:`Translator.translate_chunks`) and progress.  With a ``search_cache``
(:mod:`deep_nmt_tf.export.search_cache`; the tools' ``--compilation_cache``) it runs searches
traced by an earlier process, and builds the Keras model only when it has to trace one.
Invalid search options (a beam below 1, an ``n_best`` above the beam, a length penalty that is
negative, NaN or infinite) are a ``ValueError``, never clamped; the ``translate_with_options``
signature fails the same way (``InvalidArgumentError`` naming the input).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat
from deep_nmt_tf.checkpointing import restore_model_weights
from deep_nmt_tf.config import Config, DecodingConfig
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from deep_nmt_tf.data.tokenizers import build_tokenizer
from deep_nmt_tf.decoding.search import beam_search, search
from deep_nmt_tf.run_dir import RunDir

__all__ = [
    "TranslationModule",
    "Translator",
    "Hypothesis",
    "build_tokenizer",
    "default_jit_compile",
    "prepare_source",
]


def default_jit_compile(compute_dtype) -> bool:
    """Whether to compile the search with XLA when the caller does not say (``jit_compile=None``).

    True, except for a ``bfloat16`` compute dtype when TensorFlow sees no GPU and no TPU: on a
    CPU, XLA computes bfloat16 matmuls at about its float32 rate, while the plain graph's oneDNN
    kernels use the CPU's bfloat16 instructions (1.8-1.9x on AVX-512 BF16, BENCHMARKS.md).
    """
    if str(getattr(compute_dtype, "name", compute_dtype)) != "bfloat16":
        return True
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def _resolve_jit_compile(jit_compile: Optional[bool], compute_dtype) -> bool:
    return bool(jit_compile) if jit_compile is not None else default_jit_compile(compute_dtype)

#: Largest beam accepted by the ``beam_size`` input of ``translate_text_with_options``.
MAX_BEAM_SIZE = 64


class Hypothesis(NamedTuple):
    """One translation: detokenised ``text``, length-penalised ``score``, token ``ids``."""
    text: str
    score: float
    ids: Tuple[int, ...]


def prepare_source(tokens: tf.RaggedTensor, vocab_size: int, max_input_length: int,
                   pad_to_multiple: int) -> tf.Tensor:
    """Ragged token ids ``[B, (n)]`` -> ``[B, S]`` int32 encoder input (module docstring)."""
    tokens = tf.cast(tokens, tf.int32)
    tokens = tf.ragged.map_flat_values(
        lambda x: tf.where((x >= 0) & (x < vocab_size), x, UNK_ID), tokens)
    keep = tf.ragged.map_flat_values(
        lambda x: (x != PAD_ID) & (x != BOS_ID) & (x != EOS_ID), tokens)
    tokens = tf.ragged.boolean_mask(tokens, keep)
    tokens = tokens[:, : max(1, int(max_input_length)) - 1]
    batch = tokens.nrows(out_type=tf.int64)
    eos = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([batch, 1]), EOS_ID))
    source = tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)
    width = tf.shape(source)[1]
    m = max(1, int(pad_to_multiple))
    padded = (width + m - 1) // m * m
    return tf.pad(source, [[0, 0], [0, padded - width]], constant_values=PAD_ID)


# ---------------------------------------------------------------------------------------------
# The tf.Module: in-graph source preparation, search and detokenisation
# ---------------------------------------------------------------------------------------------


class _Untracked:
    """Holds an object without making it a dependency of a ``tf.Module``."""

    def __init__(self, obj):
        self.obj = obj


class TranslationModule(tf.Module):
    """Tokenizer + model + search as ``tf.function`` s (module docstring).

    Args:
      model: a built model with the decoding interface (``docs/DESIGN.md``).
      tokenizer: the data package's ``Tokenizer`` (a ``tf.Module``; ``tokenize`` /
        ``detokenize`` in the graph).
      decoding: :class:`~deep_nmt_tf.config.DecodingConfig` (beam size, length penalty,
        n-best, max length ``a``/``b``, ``max_input_length``) baked into the functions.
      jit_compile: compile the search with XLA (None: :func:`default_jit_compile` of the
        model's compute dtype).
      pad_to_multiple: pad source widths up to a multiple of this.
      min_length: generated tokens before ``</s>`` is allowed (benchmarks use a fixed length).
    """

    def __init__(self, model, tokenizer, decoding: DecodingConfig,
                 jit_compile: Optional[bool] = None, pad_to_multiple: int = 8,
                 min_length: int = 0, name: Optional[str] = None):
        super().__init__(name=name)
        # The Keras model is held untracked, and its variables are tracked as the plain
        # tf.Variables the functions capture.  (Tracking the Keras model exports each Keras
        # variable as a second copy that the session-based loaders of TF Serving and
        # saved_model_cli restore instead of the captured one: "Could not find variable".)
        self._untracked = _Untracked(model)
        self.model_variables = [compat.tf_variable(v) for v in model.variables]
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.jit_compile = _resolve_jit_compile(jit_compile, model.dtype_policy.compute_dtype)
        self.pad_to_multiple = max(1, int(pad_to_multiple))
        self.min_length = int(min_length)
        self.vocab_size = int(model.vocab_size)
        self.n_best = max(1, min(int(decoding.n_best), int(decoding.beam_size)))
        d = decoding
        self._search_common = dict(max_length_a=float(d.max_length_a),
                                   max_length_b=int(d.max_length_b), min_length=self.min_length)

        # The compiled cores.  Static beam size and n-best (from the config); the length
        # penalty is an input so that changing it does not retrace.
        self._search_fn = tf.function(self._search, jit_compile=self.jit_compile,
                                      autograph=False, reduce_retracing=True)
        self._search_dynamic_beam_fn = tf.function(self._search_dynamic_beam,
                                                   jit_compile=self.jit_compile,
                                                   autograph=False, reduce_retracing=True)
        text = tf.TensorSpec([None], tf.string, name="text")
        ids = tf.TensorSpec([None, None], tf.int32, name="source_ids")
        self.translate_text = tf.function(self._translate_text, input_signature=[text],
                                          autograph=False)
        self.translate_text_with_options = tf.function(
            self._translate_text_with_options, autograph=False,
            input_signature=[text, tf.TensorSpec([], tf.int32, name="beam_size"),
                             tf.TensorSpec([], tf.float32, name="length_penalty")])
        self.translate_ids = tf.function(self._translate_ids, input_signature=[ids],
                                         autograph=False)
        self.tokenize = tf.function(lambda t: self.tokenizer.tokenize(t),
                                    input_signature=[text], autograph=False)
        self.detokenize = tf.function(lambda i: self.tokenizer.detokenize(i),
                                      input_signature=[tf.TensorSpec([None, None], tf.int32)],
                                      autograph=False)

    @property
    def model(self):
        """The Keras model (not tracked by this module; see ``model_variables``)."""
        return self._untracked.obj

    # -- source preparation -------------------------------------------------------------
    def prepare_source(self, tokens: tf.RaggedTensor) -> tf.Tensor:
        """Ragged token ids ``[B, (n)]`` -> ``[B, S]`` int32 encoder input (module docstring)."""
        return prepare_source(tokens, self.vocab_size, self.decoding.max_input_length,
                              self.pad_to_multiple)

    def _ids_to_ragged(self, source_ids):
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        return tf.RaggedTensor.from_tensor(source_ids, padding=PAD_ID)

    # -- search -------------------------------------------------------------------------
    def _search(self, source_ids, length_penalty):
        d = self.decoding
        return search(self.model, source_ids, beam_size=int(d.beam_size),
                      length_penalty=length_penalty, n_best=self.n_best, **self._search_common)

    def _search_dynamic_beam(self, source_ids, beam_size, length_penalty):
        return beam_search(self.model, source_ids, beam_size=beam_size,
                           length_penalty=length_penalty, n_best=1, **self._search_common)

    def search_ids(self, source_ids, length_penalty=None):
        """Compiled search on prepared source ids (config beam size and n-best)."""
        if length_penalty is None:
            length_penalty = self.decoding.length_penalty
        return self._search_fn(source_ids, tf.constant(length_penalty, tf.float32))

    def _detokenize_nbest(self, ids):
        """``[B, N, L]`` ids -> ``[B, N]`` strings."""
        shape = tf.shape(ids)
        flat = tf.reshape(ids, [shape[0] * shape[1], shape[2]])
        text = self.tokenizer.detokenize(flat)
        return tf.reshape(text, shape[:2])

    # -- signatures ---------------------------------------------------------------------
    def _translate_text(self, text):
        source_ids = self.prepare_source(self.tokenizer.tokenize(text))
        out = self.search_ids(source_ids)
        nbest = self._detokenize_nbest(out["ids"])
        return {"translations": nbest[:, 0], "scores": out["scores"][:, 0],
                "nbest_translations": nbest, "nbest_scores": out["scores"]}

    def _translate_text_with_options(self, text, beam_size, length_penalty):
        beam_size = tf.cast(beam_size, tf.int32)
        length_penalty = tf.cast(length_penalty, tf.float32)
        checks = [
            tf.debugging.assert_greater_equal(beam_size, 1, message="beam_size must be >= 1"),
            tf.debugging.assert_less_equal(beam_size, MAX_BEAM_SIZE,
                                           message=f"beam_size must be <= {MAX_BEAM_SIZE}"),
            tf.debugging.assert_all_finite(length_penalty,
                                           "length_penalty must be a finite number"),
            tf.debugging.assert_greater_equal(length_penalty, 0.0,
                                              message="length_penalty must be >= 0")]
        with tf.control_dependencies(checks):
            source_ids = self.prepare_source(self.tokenizer.tokenize(text))
        out = self._search_dynamic_beam_fn(source_ids, beam_size, length_penalty)
        text_out = self._detokenize_nbest(out["ids"])
        return {"translations": text_out[:, 0], "scores": out["scores"][:, 0]}

    def _translate_ids(self, source_ids):
        prepared = self.prepare_source(self._ids_to_ragged(source_ids))
        out = self.search_ids(prepared)
        return {"ids": out["ids"], "lengths": out["lengths"], "scores": out["scores"],
                "log_probs": out["log_probs"]}


# ---------------------------------------------------------------------------------------------
# Host-side translator
# ---------------------------------------------------------------------------------------------


class Translator:
    """Translates lists of sentences with a model, in length-sorted batches.

    Build it from a model directory (:meth:`from_model_dir`) or from objects.

    Args:
      model: a built model, or a function that builds one (called when a search has to be
        traced: with a ``search_cache`` that holds the searches, never).
      tokenizer: the data package's ``Tokenizer``.
      config: the model's :class:`~deep_nmt_tf.config.Config` (its ``decoding`` section holds
        the defaults of :meth:`translate`).
      jit_compile: compile the search with XLA (None: :func:`default_jit_compile`).
      pad_to_multiple: see :class:`TranslationModule`.
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
                 pad_to_multiple: int = 8, min_length: int = 0,
                 precision: Optional[str] = None, search_cache=None):
        self._model, self._build_model = (None, model) if callable(model) and not hasattr(
            model, "variables") else (model, None)
        if precision is None:
            if self._model is None:
                raise ValueError("Translator: precision is required with a model function")
            precision = str(self._model.dtype_policy.compute_dtype)
        self.precision = precision
        self.tokenizer = tokenizer
        self.config = config
        self.jit_compile = _resolve_jit_compile(jit_compile, precision)
        self.pad_to_multiple = pad_to_multiple
        self.min_length = min_length
        self.search_cache = search_cache
        self.checkpoint_path: Optional[str] = None
        self._modules: Dict[Tuple[int, int], TranslationModule] = {}
        self._cached_variables: Dict[str, Dict[int, tf.Variable]] = {}
        self._search_keys: Dict[Tuple, str] = {}
        self._saved_keys = set()

    @property
    def model(self):
        """The Keras model (built, and the checkpoint restored, on first use)."""
        if self._model is None:
            self._model = self._build_model()
            if self.checkpoint_path is not None:
                restore_model_weights(self._model, self.checkpoint_path)
        return self._model

    @property
    def module(self) -> TranslationModule:
        """The :class:`TranslationModule` of the config's beam size and n-best."""
        return self.module_for(self.config.decoding.beam_size, self.config.decoding.n_best)

    @classmethod
    def from_model_dir(cls, model_dir: str, checkpoint: Optional[str] = None,
                       overrides: Sequence[str] = (), jit_compile: Optional[bool] = None,
                       pad_to_multiple: int = 8, precision: str = "float32",
                       search_cache: Optional[str] = None) -> "Translator":
        """Loads ``config.yaml``, the vocabulary and a checkpoint (default: the latest).

        Args:
          model_dir: a model directory (trainer output or average_checkpoints output).
          checkpoint: a checkpoint prefix (``MODEL_DIR/ckpt-1000``); default the newest one
            that can be read (newer damaged ones are skipped with a WARNING).
          overrides: config overrides (``decoding.beam_size=8`` ...).
          jit_compile, pad_to_multiple: see :class:`TranslationModule`.
          precision: ``float32``, ``bfloat16`` or ``float16``: the dtype of the weights and
            the activations (:data:`~deep_nmt_tf.models.seq2seq.INFERENCE_POLICIES`; the
            float32 checkpoint is rounded when it is loaded; softmax, LayerNorm statistics and
            the scores stay float32).
          search_cache: a directory of traced searches
            (:class:`~deep_nmt_tf.export.search_cache.SearchCache`).  With it the model is
            built only when a search has to be traced, so a checkpoint that does not fit the
            model is reported by the first translation instead of here.

        Raises:
          ConfigError: the vocabulary is not the one the run was trained with (naming both).
          FileNotFoundError: no ``config.yaml``, no (such) checkpoint.
          CheckpointError: the checkpoint is damaged or of another model.
        """
        from deep_nmt_tf.checkpointing import resolve_checkpoint
        from deep_nmt_tf.export.search_cache import SearchCache
        from deep_nmt_tf.models import build_model
        from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

        if precision not in INFERENCE_POLICIES:
            raise ValueError(f"precision must be one of {', '.join(INFERENCE_POLICIES)}, got "
                             f"{precision!r}")
        run_dir = RunDir(model_dir)
        config = run_dir.load_config(overrides)
        vocab = run_dir.vocab_path(config)
        run_dir.check_vocab(vocab, run_dir.config_path)
        tokenizer = build_tokenizer(config, vocab)
        policy = INFERENCE_POLICIES[precision]
        latest = checkpoint is None
        if latest:
            checkpoint = run_dir.latest_checkpoint()  # (the newest readable one)
            if checkpoint is None:
                raise FileNotFoundError(f"no checkpoint in {model_dir}")
        if search_cache is None or checkpoint.endswith(".weights.h5"):
            translator = cls(build_model(config, dtype=policy), tokenizer, config,
                             jit_compile=jit_compile, pad_to_multiple=pad_to_multiple)
            translator.restore(checkpoint)
            return translator
        translator = cls(lambda: build_model(config, dtype=policy), tokenizer, config,
                         jit_compile=jit_compile, pad_to_multiple=pad_to_multiple,
                         precision=precision, search_cache=SearchCache(search_cache))
        # Without the model's restore, a given checkpoint is checked here (missing, damaged).
        translator.restore(checkpoint if latest else resolve_checkpoint(checkpoint))
        return translator

    def restore(self, checkpoint_path: str):
        """Loads the model variables of another checkpoint (compiled functions are kept)."""
        if self._model is not None:
            restore_model_weights(self._model, checkpoint_path)
        self.checkpoint_path = checkpoint_path
        self._cached_variables.clear()
        logging.info("Restored model weights from %s", checkpoint_path)

    def module_for(self, beam_size: int, n_best: int) -> TranslationModule:
        """The (cached) module for a beam size and n-best (other parameters from the config)."""
        beam_size = int(beam_size)
        n_best = max(1, min(int(n_best), beam_size))  # (checked by search_options)
        # A module returning more hypotheses serves too (the caller keeps the first n_best).
        for (k, n), module in self._modules.items():
            if k == beam_size and n >= n_best:
                return module
        key = (beam_size, n_best)
        if key not in self._modules:
            decoding = dataclasses.replace(self.config.decoding, beam_size=beam_size,
                                           n_best=n_best)
            self._modules[key] = TranslationModule(
                self.model, self.tokenizer, decoding, jit_compile=self.jit_compile,
                pad_to_multiple=self.pad_to_multiple, min_length=self.min_length)
        return self._modules[key]

    def search_ids(self, source_ids, length_penalty: float, beam_size: int,
                   n_best: int) -> Dict[str, tf.Tensor]:
        """The search on prepared source ids: from the search cache when it holds it (the model
        is then never built), else traced (and added to the cache)."""
        cache, key = self.search_cache, None
        if cache is not None:
            key = self._search_key(int(beam_size), int(n_best), tuple(source_ids.shape))
            cached = cache.load(key)
            variables = self._checkpoint_variables(cached) if cached is not None else None
            if variables is not None:
                return cached(source_ids, length_penalty, variables)
        module = self.module_for(beam_size, n_best)
        out = module.search_ids(source_ids, length_penalty)
        if key is not None and key not in self._saved_keys:
            function = module._search_fn.get_concrete_function(
                source_ids, tf.constant(length_penalty, tf.float32))
            cache.save(key, function, module.model_variables)
            self._saved_keys.add(key)  # (Saved once per process, whatever the outcome.)
        return out

    def _search_key(self, beam_size: int, n_best: int, shape) -> str:
        """:func:`~deep_nmt_tf.export.search_cache.search_key` of a search (memoised: the
        config's digest is the same for every batch of a width)."""
        from deep_nmt_tf.export.search_cache import search_key

        memo = (beam_size, n_best, shape)
        if memo not in self._search_keys:
            decoding = dataclasses.replace(self.config.decoding, beam_size=beam_size,
                                           n_best=max(1, min(n_best, beam_size)))
            self._search_keys[memo] = search_key(self.config.model, decoding, self.precision,
                                                 self.jit_compile, self.min_length, shape)
        return self._search_keys[memo]

    def _prepare_rows(self, rows: List[List[int]]) -> tf.Tensor:
        """:func:`prepare_source` of token-id lists, on the host (no eager ragged ops)."""
        vocab, keep = self.config.model.vocab_size, max(1, self.config.decoding.max_input_length)
        rows = [[t if 0 <= t < vocab else UNK_ID for t in row] for row in rows]
        rows = [[t for t in row if t not in (PAD_ID, BOS_ID, EOS_ID)][:keep - 1] + [EOS_ID]
                for row in rows]
        m = max(1, int(self.pad_to_multiple))
        width = (max(len(row) for row in rows) + m - 1) // m * m
        out = np.full((len(rows), width), PAD_ID, np.int32)
        for r, row in enumerate(rows):
            out[r, :len(row)] = row
        return tf.constant(out)

    def _checkpoint_variables(self, cached):
        """The variables ``cached`` reads: the built model's, else read from the checkpoint
        (``None`` when the checkpoint does not hold them as recorded)."""
        if self._model is not None:
            return self.module.model_variables
        variables = self._cached_variables.setdefault(self.checkpoint_path, {})
        missing = [i for i in cached.captures if i not in variables]
        if missing:
            try:
                read = cached.read_variables(self.checkpoint_path)
            except (tf.errors.OpError, ValueError, KeyError) as e:
                logging.warning("Search cache: %s: %s; building the model", self.checkpoint_path, e)
                read = None
            if read is None:
                return None
            variables.update(read)
        return variables

    # -- batch entry points (the exported functions) -------------------------------------
    def translate_batch(self, text: Sequence[str]) -> Dict[str, np.ndarray]:
        """One batch through ``translate_text`` (exactly what the SavedModel's
        ``serving_default`` runs); returns numpy arrays."""
        out = self.module.translate_text(tf.constant(list(text), tf.string))
        return {k: v.numpy() for k, v in out.items()}

    # -- host-side batching -------------------------------------------------------------
    def tokenize(self, sentences: Sequence[str], chunk_size: int = 1024) -> List[List[int]]:
        """Token ids of each sentence (no ``</s>``)."""
        out: List[List[int]] = []
        for i in range(0, len(sentences), chunk_size):
            ragged = self.tokenizer.tokenize(tf.constant(list(sentences[i:i + chunk_size]),
                                                         tf.string))
            out.extend(row.tolist() for row in ragged.numpy())
        return out

    def search_options(self, beam_size: Optional[int] = None,
                       length_penalty: Optional[float] = None, n_best: Optional[int] = None,
                       batch_size: Optional[int] = None) -> Tuple[int, float, int, int]:
        """The search options, defaults from ``config.decoding``, checked.

        An ``n_best`` given explicitly must not exceed the beam; the config's ``n_best`` is
        capped at a smaller beam given here.

        Raises:
          ValueError: a beam or batch size below 1, an ``n_best`` below 1 or above the beam, a
            length penalty that is negative or not finite.
        """
        d = self.config.decoding
        beam = d.beam_size if beam_size is None else int(beam_size)
        batch = d.batch_size if batch_size is None else int(batch_size)
        alpha = d.length_penalty if length_penalty is None else float(length_penalty)
        best = min(d.n_best, beam) if n_best is None else int(n_best)
        for name, value in (("beam_size", beam), ("batch_size", batch), ("n_best", best)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if best > beam:
            raise ValueError(f"n_best={best} exceeds the beam size {beam}: a beam search "
                             "keeps at most beam_size hypotheses (raise the beam size)")
        if not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"length_penalty must be a finite number >= 0, got {alpha}")
        return beam, alpha, best, batch

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
        beam_size, alpha, n_best, batch_size = self.search_options(
            beam_size, length_penalty, n_best, batch_size)
        sentences = list(sentences)
        tokens = self.tokenize(sentences)
        order = sorted(range(len(tokens)), key=lambda i: (len(tokens[i]), i))
        results: List[Optional[List[Hypothesis]]] = [None] * len(tokens)
        done = 0
        for start in range(0, len(order), batch_size):
            index = order[start:start + batch_size]
            source_ids = self._prepare_rows([tokens[i] for i in index])
            out = self.search_ids(source_ids, alpha, beam_size, n_best)
            ids = out["ids"].numpy()[:, :n_best]
            scores = out["scores"].numpy()[:, :n_best]
            lengths = out["lengths"].numpy()[:, :n_best]
            flat = ids.reshape(-1, ids.shape[-1])
            texts = self.tokenizer.detokenize(tf.constant(flat, tf.int32)).numpy()
            texts = texts.reshape(ids.shape[:2])
            for row, i in enumerate(index):
                results[i] = [Hypothesis(texts[row, k].decode("utf-8"), float(scores[row, k]),
                                         tuple(int(t) for t in ids[row, k, :lengths[row, k]]))
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
        batch = self.search_options(**options)[3]
        chunk_size = chunk_size or 16 * batch
        for start in range(0, len(sentences), chunk_size):
            def chunk_progress(done, total, start=start):
                if progress is not None:
                    progress(start + done, len(sentences))

            yield self.translate(sentences[start:start + chunk_size], progress=chunk_progress,
                                 **options)

