"""The export module: pre-process -> search -> post-process as ``tf.function`` s (Model
Garden's export-module shape), run in process by the translator and saved for TF Serving.

:class:`TranslationModule` holds a model, its ``Tokenizer`` and the search options
(:class:`deep_nmt_tf.decoding.SearchOptions`) and defines:

* pre-processing: :meth:`~TranslationModule.preprocess_text` (``[B]`` UTF-8 strings -> encoder
  input) and :meth:`~TranslationModule.preprocess_ids` (ragged token ids -> encoder input),
  both through :func:`prepare_source`, **the** source preparation of the package (the
  in-process translator batches with it too);
* the search: :meth:`~TranslationModule.search_ids` (compiled, the options' beam size and
  ``n_best``; the length penalty an input, so that changing it does not retrace);
* post-processing: detokenisation of the n-best ids;
* the signatures: ``translate_text(text)`` (best translations, scores and n-best lists),
  ``translate_text_with_options(text, beam_size, length_penalty)`` (best hypothesis only) and
  ``translate_ids(source_ids)`` (ids, lengths and scores).

Source preparation: ids outside ``[0, vocab)`` become ``[UNK]``; ``<pad>``/``<s>``/``</s>`` are
dropped; the tokens are truncated to ``decoding.max_input_length - 1`` and ``</s>`` is appended
(so the encoder never sees more than ``max_input_length`` tokens, like
``data.max_source_length`` in training); rows are padded with ``<pad>`` to a width rounded up to
a multiple of ``pad_to_multiple`` (fewer distinct shapes to compile).  Empty and
whitespace-only inputs become ``[</s>]`` and get a (possibly empty) translation; the output
length is at most ``a * max_input_length + b`` (+ padding slack).

The search runs in a ``tf.function`` compiled with XLA (``jit_compile=True``): the decode loop
has static shapes and XLA fuses it, updates the caches in place and removes the per-op overhead
(``docs/SERVING.md``, BENCHMARKS.md).  Each new input shape (batch size, padded width) is
compiled once.  ``jit_compile=None`` (the default) chooses with :func:`default_jit_compile`: XLA,
except for a bfloat16 model on a machine without GPU or TPU, where XLA's CPU backend runs
bfloat16 matmuls at about the float32 rate, half of what the plain graph's oneDNN kernels reach
(BENCHMARKS.md, "Decoding"), so the plain graph decodes faster.  The
``translate_with_options`` signature refuses an option out of range in the graph
(``InvalidArgumentError`` naming the input; nothing is clamped).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from deep_nmt_tf import compat, hardware
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.decoding.search import beam_search

__all__ = ["TranslationModule", "default_jit_compile", "resolve_jit_compile", "prepare_source",
           "MAX_BEAM_SIZE"]

#: Largest beam accepted by the ``beam_size`` input of ``translate_text_with_options``.
MAX_BEAM_SIZE = 64


def default_jit_compile(compute_dtype) -> bool:
    """Whether to compile the search with XLA when the caller does not say (``jit_compile=None``):
    :func:`deep_nmt_tf.hardware.fastest_inference_settings` for this precision.

    True, except for a ``bfloat16`` compute dtype when TensorFlow sees no GPU and no TPU: on a
    CPU, XLA computes bfloat16 matmuls at about its float32 rate, while the plain graph's oneDNN
    kernels use the CPU's bfloat16 instructions (1.8-1.9x on AVX-512 BF16, BENCHMARKS.md).
    """
    precision = str(getattr(compute_dtype, "name", compute_dtype))
    return hardware.fastest_inference_settings(precision).jit_compile


def resolve_jit_compile(jit_compile: Optional[bool], compute_dtype) -> bool:
    """``jit_compile``, or :func:`default_jit_compile` of the compute dtype when it is None."""
    return bool(jit_compile) if jit_compile is not None else default_jit_compile(compute_dtype)


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
      options: the :class:`~deep_nmt_tf.decoding.SearchOptions` baked into the functions
        (beam size, ``n_best``, length limits, the default length penalty).
      max_input_length: source tokens kept (``decoding.max_input_length``).
      jit_compile: compile the search with XLA (None: :func:`default_jit_compile` of the
        model's compute dtype).
      pad_to_multiple: pad source widths up to a multiple of this.
    """

    def __init__(self, model, tokenizer, options: SearchOptions, max_input_length: int,
                 jit_compile: Optional[bool] = None, pad_to_multiple: int = 8,
                 name: Optional[str] = None):
        super().__init__(name=name)
        # The Keras model is held untracked, and its variables are tracked as the plain
        # tf.Variables the functions capture.  (Tracking the Keras model exports each Keras
        # variable as a second copy that the session-based loaders of TF Serving and
        # saved_model_cli restore instead of the captured one: "Could not find variable".)
        self._untracked = _Untracked(model)
        self.model_variables = [compat.tf_variable(v) for v in model.variables]
        self.tokenizer = tokenizer
        self.options = options
        self.max_input_length = int(max_input_length)
        self.jit_compile = resolve_jit_compile(jit_compile, model.dtype_policy.compute_dtype)
        self.pad_to_multiple = max(1, int(pad_to_multiple))
        self.vocab_size = int(model.vocab_size)

        # The compiled cores: static beam size and n-best; the length penalty is an input.
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
        self.preprocess_ids = tf.function(
            self._preprocess_ids, autograph=False,
            input_signature=[tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)])

    @property
    def model(self):
        """The Keras model (not tracked by this module; see ``model_variables``)."""
        return self._untracked.obj

    # -- pre-processing -----------------------------------------------------------------
    def prepare_source(self, tokens: tf.RaggedTensor) -> tf.Tensor:
        """Ragged token ids ``[B, (n)]`` -> ``[B, S]`` int32 encoder input (module docstring)."""
        return prepare_source(tokens, self.vocab_size, self.max_input_length,
                              self.pad_to_multiple)

    def _preprocess_ids(self, tokens):
        return self.prepare_source(tokens)

    def preprocess_text(self, text) -> tf.Tensor:
        """``[B]`` strings -> ``[B, S]`` encoder input (tokenised in the graph)."""
        return self.prepare_source(self.tokenizer.tokenize(text))

    # -- search -------------------------------------------------------------------------
    def _search(self, source_ids, length_penalty):
        return self.options.search(self.model, source_ids, length_penalty=length_penalty)

    def _search_dynamic_beam(self, source_ids, beam_size, length_penalty):
        o = self.options
        return beam_search(self.model, source_ids, beam_size=beam_size,
                           length_penalty=length_penalty, n_best=1, max_length_a=o.max_length_a,
                           max_length_b=o.max_length_b, min_length=o.min_length)

    def search_ids(self, source_ids, length_penalty=None):
        """Compiled search on prepared source ids (the options' beam size and n-best)."""
        if length_penalty is None:
            length_penalty = self.options.length_penalty
        return self._search_fn(source_ids, tf.constant(length_penalty, tf.float32))

    # -- post-processing ----------------------------------------------------------------
    def _detokenize_nbest(self, ids):
        """``[B, N, L]`` ids -> ``[B, N]`` strings."""
        shape = tf.shape(ids)
        flat = tf.reshape(ids, [shape[0] * shape[1], shape[2]])
        text = self.tokenizer.detokenize(flat)
        return tf.reshape(text, shape[:2])

    # -- signatures ---------------------------------------------------------------------
    def _translate_text(self, text):
        out = self.search_ids(self.preprocess_text(text))
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
            source_ids = self.preprocess_text(text)
        out = self._search_dynamic_beam_fn(source_ids, beam_size, length_penalty)
        text_out = self._detokenize_nbest(out["ids"])
        return {"translations": text_out[:, 0], "scores": out["scores"][:, 0]}

    def _translate_ids(self, source_ids):
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        out = self.search_ids(self.prepare_source(
            tf.RaggedTensor.from_tensor(source_ids, padding=PAD_ID)))
        return {"ids": out["ids"], "lengths": out["lengths"], "scores": out["scores"],
                "log_probs": out["log_probs"]}
