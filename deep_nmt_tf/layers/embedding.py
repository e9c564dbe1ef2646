"""Token embeddings (optionally shared with the softmax) and sinusoidal positions."""

from __future__ import annotations

import math

import keras
from keras import ops

__all__ = ["TokenEmbedding", "SinusoidalPositionEncoding", "sinusoidal_table"]


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), usable as the (tied) output softmax.

    ``call(ids)`` returns ``E[ids] * sqrt(d_model)`` (Vaswani et al. 2017, section 3.4);
    ``logits(x)`` returns ``x @ E^T``, so one instance can serve as source embedding, target
    embedding and pre-softmax projection.

    Args:
      vocab_size: number of rows.
      d_model: embedding size.
      scale: multiply looked-up vectors by sqrt(d_model).
      embeddings_initializer: default ``RandomNormal(stddev=d_model**-0.5)`` (Tensor2Tensor).

    Shapes: ``call``: int ``[B, T]`` -> ``[B, T, d_model]``; ``logits``: ``[..., d_model]`` ->
    ``[..., vocab_size]``.

    Example:
      >>> emb = TokenEmbedding(100, 16)
      >>> emb(keras.ops.ones((2, 3), "int32")).shape
      (2, 3, 16)
    """

    def __init__(self, vocab_size, d_model, scale=True, embeddings_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.scale = bool(scale)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
            or keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer, trainable=True)
        self.built = True

    def call(self, ids):
        x = ops.take(self.embeddings, ops.cast(ids, "int32"), axis=0)
        x = ops.cast(x, self.compute_dtype)
        if self.scale:
            x = x * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        return x

    def logits(self, x):
        """``x @ E^T`` in the compute dtype (callers cast the logits to float32 for the
        softmax)."""
        shape = ops.shape(x)
        flat = ops.reshape(ops.cast(x, self.compute_dtype), (-1, self.d_model))
        out = ops.matmul(flat, ops.transpose(ops.cast(self.embeddings, self.compute_dtype)))
        return ops.reshape(out, tuple(shape[:-1]) + (self.vocab_size,))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "scale": self.scale,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        })
        return config


def sinusoidal_table(positions, d_model, max_wavelength=10000.0, dtype="float32"):
    """Sinusoidal encodings of Vaswani et al. (2017), Tensor2Tensor layout [sin | cos].

    Args:
      positions: int or float tensor of any shape (e.g. ``[T]`` or a scalar step).
      d_model: output size (even or odd; an odd size gets a zero last channel).

    Returns:
      ``positions.shape + [d_model]`` tensor.
    """
    num_timescales = d_model // 2
    positions = ops.cast(positions, "float32")
    log_increment = math.log(float(max_wavelength)) / max(num_timescales - 1, 1)
    inv_timescales = ops.exp(ops.arange(num_timescales, dtype="float32") * -log_increment)
    scaled = ops.expand_dims(positions, -1) * inv_timescales
    signal = ops.concatenate([ops.sin(scaled), ops.cos(scaled)], axis=-1)
    if d_model % 2:
        signal = ops.pad(signal, [[0, 0]] * (len(signal.shape) - 1) + [[0, 1]])
    return ops.cast(signal, dtype)


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Adds sinusoidal position encodings to ``x`` (``[B, T, D]``), starting at ``start``.

    ``start`` (a scalar, may be a tensor) lets a decoder add the encoding of position ``step``
    to a single-step input of shape ``[B, 1, D]``.
    """

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = float(max_wavelength)

    def call(self, x, start=0):
        length = ops.shape(x)[1]
        positions = ops.arange(length, dtype="int32") + ops.cast(start, "int32")
        table = sinusoidal_table(positions, x.shape[-1], self.max_wavelength, x.dtype)
        return x + table[None]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config
