"""How big a config's model is and how much memory its training needs, from the config alone
(pure Python: no TensorFlow, no Keras, nothing built), and whether that fits this machine.

``--override=model.encoder.transformer.num_layers=100000`` is a valid config, and building it
would take minutes of growing memory before failing.  ``deep-nmt-train`` and ``deep-nmt-fit``
therefore estimate first and refuse a config that cannot fit in the memory available
(:func:`check_fits`, naming the estimate and what is available); ``deep-nmt-train --check``
prints the estimate (:meth:`SizeEstimate.report`) and exits.

**Parameters** (:func:`count_parameters`) are counted per architecture the way the layers build
them: Transformer stacks (pre/post-norm, DLCL weights and LayerNorms, lexical shortcuts of both
variants on self- and cross-attention, untied softmax), RNMT+ (bidirectional LayerNorm-LSTMs and
the projection; the decoder's input-feeding LSTMs, multi-head additive attention and softmax),
the hybrid combinators (cascade stage norms; multi-column norms, merge projection and the
later columns' own embeddings), tied or untied embeddings and transparent attention.  The count
equals the built model's ``count_params()`` (``tests/test_robustness_edges.py`` builds several
architectures and compares); an encoder or decoder type registered from outside the package
is not counted (the estimate says so and nothing is refused).

**Training memory** (:func:`estimate`), in bytes:

- weights (float32 variables in every training precision), gradients, Adam's two moments,
  gradient accumulators (``training.gradient_accumulation_steps > 1``) and, in mixed
  precision, the half-precision copies of the weights the forward pass uses;
- activations kept for the backward pass, for the largest micro-batch the length buckets emit:
  the longest bucket, ``max(1, batch_tokens // (2 u))`` pairs padded to ``u`` source and
  target positions (``u`` the longer length limit; per worker under multi-worker).  Per
  position and layer a fixed number of ``d_model``/``ffn_dim``/LSTM-unit-wide tensors (counted
  from the layers' operations: inputs of every matmul, LayerNorm and dropout, the residual
  sums), the attention probabilities (``heads x S x S`` per sentence, twice with attention
  dropout), the additive attention's ``[T, S, A]`` tanh, and the ``[T, V]`` float32 logits with
  their log-softmax and gradient;
- the runtime: Python, TensorFlow and the data pipeline (:data:`RUNTIME_BYTES`, measured), and
  the shuffle buffer (``data.shuffle_buffer`` pairs at half the length limits).

Accuracy, measured once on the reference machine (BENCHMARKS.md, "Training memory
estimate"): the parameter counts are exact; the memory estimate is an upper-side estimate of
the peak resident memory of a training (the longest bucket and full padding are assumed), within
a factor of about 1.5 of the measured peak for the small models measured there.  It exists to
refuse configs that are off by orders of magnitude, not to tune a batch size to the last
megabyte: ``--nomemory_check`` skips the refusal.

The estimate is compared with the host's available memory (:func:`available_memory`:
``MemAvailable`` of ``/proc/meminfo``, or less under a cgroup limit).  On a machine with an
NVIDIA GPU the activations live in the GPU's memory, which this module does not read: only what
the host itself holds (the weights, their gradients and optimizer state, which checkpoints pass
through, and the runtime) is compared there.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Optional, Tuple

__all__ = ["SizeEstimate", "SizeError", "count_parameters", "estimate", "available_memory",
           "check_fits", "workers_of_tf_config", "RUNTIME_BYTES"]

#: Resident memory of a training process before its model and batches: Python, TensorFlow,
#: Keras and tf.data with a tiny model (measured: BENCHMARKS.md, "Training memory estimate").
RUNTIME_BYTES = 900 * 2**20
_FLOAT32 = 4
_HALF = 2


class SizeError(ValueError):
    """A config whose training cannot fit in this machine's memory (the message names the
    estimate and what is available)."""


def _layer_norm(width: int) -> int:
    return 2 * width


def _shortcut(variant: str, d: int, source: int) -> int:
    """Parameters of one :class:`~deep_nmt_tf.layers.LexicalShortcut`."""
    if variant == "shortcuts":
        return source * 2 * d + 2 * d
    return source * 4 * d + d * 2 * d + 2 * d  # feature_fusion


def _lstm(input_dim: int, units: int) -> int:
    """Parameters of one LayerNorm-LSTM cell: kernel, per-gate LayerNorm scale and offset."""
    return (input_dim + units) * 4 * units + 8 * units


def _transformer(options, d: int, decoder: bool, memory_dim: int, vocab: int) -> int:
    n, f = options.num_layers, options.ffn_dim
    per_layer = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 2 * _layer_norm(d)
    lexical = options.lexical_shortcuts
    on_self = lexical.enabled and (not decoder or lexical.placement in ("self", "both"))
    on_cross = lexical.enabled and decoder and lexical.placement in ("cross", "both")
    if decoder:  # The encoder-decoder attention and its residual's LayerNorm.
        per_layer += 2 * d * d + 2 * memory_dim * d + 4 * d + _layer_norm(d)
    if on_self:
        per_layer += _shortcut(lexical.variant, d, d)
    if on_cross:
        per_layer += _shortcut(lexical.variant, d, memory_dim)
    total = n * per_layer + (_layer_norm(d) if options.norm == "pre" else 0)
    dlcl = options.dlcl
    if dlcl.enabled:
        total += (n + 1) ** 2 if dlcl.weights == "learnable" else 0
        if dlcl.layer_norm:
            total += (n + int(dlcl.normalize_embedding)) * _layer_norm(d)
    if decoder and not options.tie_softmax:
        total += d * vocab + vocab
    return total


def _encoder(one_of, model, vocab: int, own_embedding: bool) -> Optional[Tuple[int, int]]:
    """``(parameters, output width)`` of an encoder section (its own embedding included when
    ``own_embedding``), or None for a type this module does not know."""
    d, options = model.d_model, one_of.get()
    embedding = vocab * d if own_embedding else 0
    if one_of.type == "transformer":
        return embedding + _transformer(options, d, False, d, vocab), d
    if one_of.type == "rnmt_plus":
        u = options.units or d
        layers = 2 * _lstm(d, u) + (options.num_layers - 1) * 2 * _lstm(2 * u, u)
        return embedding + layers + 2 * u * d + d, d
    if one_of.type in ("cascaded", "multi_column"):
        parts = options.stages if one_of.type == "cascaded" else options.columns
        counted = [_encoder(part, model, vocab,
                            own_embedding=own_embedding if i == 0 else
                            one_of.type == "multi_column")
                   for i, part in enumerate(parts)]
        if any(c is None for c in counted):
            return None
        total = sum(c[0] for c in counted)
        if one_of.type == "cascaded":  # A LayerNorm before every later stage.
            return total + sum(_layer_norm(c[1]) for c in counted[:-1]), counted[-1][1]
        width = sum(c[1] for c in counted)  # Column norms, merge projection, output norm.
        return total + 2 * width + width * d + d + _layer_norm(d), d
    return None


def _decoder(one_of, model, vocab: int, memory_dim: int) -> Optional[int]:
    d, options = model.d_model, one_of.get()
    if one_of.type == "transformer":
        return _transformer(options, d, True, memory_dim, vocab)
    if one_of.type == "rnmt_plus":
        u = options.units or d
        a = options.attention_dim or u
        lstms = _lstm(d + a, u) + (options.num_layers - 1) * _lstm(u + a, u)
        attention = u * a + a + memory_dim * a + a + a
        return lstms + attention + (u + a) * vocab + vocab
    return None


def _transparent_sources(one_of, d: int) -> int:
    options = one_of.get()
    if one_of.type == "rnmt_plus":  # The embedding joins only when as wide as a layer output.
        return options.num_layers + int(d == 2 * (options.units or d))
    return options.num_layers + 1


def _attention_modules(one_of) -> int:
    return one_of.get().num_layers if one_of.type == "transformer" else 1


def count_parameters(model, vocab_size: Optional[int] = None) -> Optional[Dict[str, int]]:
    """Parameters of the model a ``model`` config section describes, by part.

    Args:
      model: a :class:`~deep_nmt_tf.config.ModelConfig`.
      vocab_size: the vocabulary size (default ``model.vocab_size``).

    Returns:
      ``{"source embedding", "target embedding", "encoder", "decoder", "transparent attention",
      "total"}`` (the encoder's entry includes the embeddings of a multi-column encoder's later
      columns), or None when the encoder or decoder type is not one of the package's.
    """
    vocab = int(vocab_size if vocab_size is not None else model.vocab_size)
    d = model.d_model
    encoder = _encoder(model.encoder, model, vocab, own_embedding=False)
    if encoder is None:
        return None
    decoder = _decoder(model.decoder, model, vocab, memory_dim=encoder[1])
    if decoder is None:
        return None
    parts = {"source embedding": vocab * d,
             "target embedding": 0 if model.tie_source_target_embeddings else vocab * d,
             "encoder": encoder[0], "decoder": decoder, "transparent attention": 0}
    if model.transparent_attention.enabled:
        parts["transparent attention"] = (_transparent_sources(model.encoder, d)
                                          * _attention_modules(model.decoder))
    parts["total"] = sum(parts.values())
    return parts
