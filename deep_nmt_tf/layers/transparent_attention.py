"""Transparent attention (Bapna et al. 2018): learned softmax mixes of all encoder layers."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["TransparentAttention"]


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransparentAttention(keras.layers.Layer):
    """Turns the embedding output and N encoder layer outputs into M memories.

    Bapna et al. (2018), Eq. 1-2: a learned ``(N+1) x M`` matrix ``W``, with dropout on ``W``
    (training only), is softmax-normalised over the N+1 sources, ``s_ij = softmax_i(W_ij)``, and
    encoder-decoder attention module j attends to ``z^j = sum_i s_ij h^i``.  M is the number of
    encoder-decoder attention modules: the decoder depth for the Transformer, 1 for RNMT+ (which
    applies its encoder projection after the combination).

    Details (see ``../shared/METHODS.md``):

    - ``W`` starts at zero (a uniform mix).  Dropout is applied to the logits ``W`` before the
      softmax, as the paper's "we apply dropout to W" and Lingvo's ``WeightedSumLayer`` do.
      (Lingvo adds the constant ``1/(N+1)`` to ``W`` before its dropout so that dropout perturbs
      the mix even at initialisation; the softmax is invariant to that constant without dropout.
      We follow the paper's formula and do not add it: with zero logits dropout is inert until
      the weights move.)
    - Optional floor ``min_probability = p``: ``s = p + (1 - (N+1) p) softmax(W)``, so every
      source keeps at least ``p``; requires ``(N+1) p <= 1``.
    - The sources are the *raw* outputs (the embedding output after input dropout, and each
      layer's output before any final LayerNorm of a pre-norm stack); the caller passes them.
    - One static output structure in training and inference: a stacked ``[M, B, S, D]`` tensor,
      computed once per source sentence (``Seq2SeqModel.decoder_memories``), so decoding caches
      the per-module keys/values like ordinary memories and nothing grows with M beyond the M
      memories themselves.

    Args:
      num_sources: N+1 (encoder layers plus the embedding layer).
      num_outputs: M.
      weight_dropout: dropout rate on the logits ``W`` (paper and Lingvo default 0.1).
      min_probability: floor on each source's probability (0 disables).

    Call:
      ``layer(sources, training=None)`` with ``sources`` a list of N+1 tensors ``[B, S, D]``
      (embedding output first) or one stacked ``[N+1, B, S, D]`` tensor; returns ``[M, B, S, D]``.

    Example:
      >>> mix = TransparentAttention(num_sources=4, num_outputs=2)
      >>> srcs = [keras.random.normal((2, 5, 8)) for _ in range(4)]
      >>> mix(srcs).shape
      (2, 2, 5, 8)

    References:
      Bapna, Chen, Firat, Cao, Wu (2018). Training Deeper Neural Machine Translation Models with
      Transparent Attention. EMNLP.
    """

    def __init__(self, num_sources, num_outputs, weight_dropout=0.1, min_probability=0.0,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_sources = int(num_sources)
        self.num_outputs = int(num_outputs)
        if self.num_sources < 1 or self.num_outputs < 1:
            raise ValueError("num_sources and num_outputs must be >= 1")
        self.weight_dropout = float(weight_dropout)
        self.min_probability = float(min_probability)
        if self.min_probability * self.num_sources > 1.0 + 1e-9:
            raise ValueError(
                f"transparent attention: min_probability={self.min_probability} times "
                f"{self.num_sources} sources exceeds 1; use at most {1.0 / self.num_sources:.4g}")
        # The logits stay float32 under mixed precision (a [N+1, M] tensor: no cost).
        self.dropout_layer = keras.layers.Dropout(self.weight_dropout, dtype="float32")

    def build(self, input_shape=None):
        self.mix_logits = self.add_weight(
            name="mix_logits", shape=(self.num_sources, self.num_outputs),
            initializer="zeros", trainable=True)
        self.built = True

    def mix_weights(self, training=None):
        """The normalised ``[N+1, M]`` mix ``s`` (float32); dropout on the logits if training."""
        logits = ops.cast(self.mix_logits, "float32")
        if training and self.weight_dropout > 0.0:
            logits = self.dropout_layer(logits, training=True)
        probs = ops.softmax(logits, axis=0)
        if self.min_probability > 0.0:
            p = self.min_probability
            probs = p + (1.0 - self.num_sources * p) * probs
        return probs

    def call(self, sources, training=None):
        if isinstance(sources, (list, tuple)):
            if len(sources) != self.num_sources:
                raise ValueError(f"expected {self.num_sources} sources, got {len(sources)}")
            stacked = ops.stack(list(sources), axis=0)
        else:
            stacked = sources
            if stacked.shape[0] is not None and stacked.shape[0] != self.num_sources:
                raise ValueError(f"expected {self.num_sources} sources, got {stacked.shape[0]}")
        probs = ops.cast(self.mix_weights(training), stacked.dtype)
        # [N+1, M] x [N+1, B, S, D] -> [M, B, S, D]: one GEMM over the source axis.
        return ops.einsum("nm,nbsd->mbsd", probs, stacked)

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)):
            shape = tuple(input_shape[0])
        else:
            shape = tuple(input_shape)[1:]
        return (self.num_outputs,) + shape

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_sources": self.num_sources,
            "num_outputs": self.num_outputs,
            "weight_dropout": self.weight_dropout,
            "min_probability": self.min_probability,
        })
        return config
