"""LayerNorm over the last axis in as few graph ops as ``keras.ops`` allow."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["LayerNorm", "layer_norm"]


def layer_norm(x, gamma, beta, epsilon):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis.

    The maths of ``keras.layers.LayerNormalization`` (statistics and scale in at least
    float32, the result in ``x``'s dtype) written as nine elementwise/reduction ops in
    float32 (mean, centre, square, mean, add, rsqrt, two products, add), where Keras' own
    takes fourteen (``ops.moments`` with its ``stop_gradient``, the scale and offset folded
    into a negated mean, reshapes of ``gamma``/``beta``); a bfloat16 or float16 input adds the
    casts in and out.  The decoder runs eighteen of them per step in Transformer-base.
    """
    dtype = x.dtype
    if keras.backend.standardize_dtype(dtype) in ("bfloat16", "float16"):
        x = ops.cast(x, "float32")
    centred = x - ops.mean(x, axis=-1, keepdims=True)
    variance = ops.mean(ops.square(centred), axis=-1, keepdims=True)
    y = centred * ops.rsqrt(variance + epsilon)
    y = y * ops.cast(gamma, x.dtype) + ops.cast(beta, x.dtype)
    return ops.cast(y, dtype)


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class LayerNorm(keras.layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` over the last axis, computed by :func:`layer_norm`.

    The same variables (``gamma``, ``beta``), configuration and results (to rounding) as the
    Keras layer it subclasses, in fewer graph ops: the Transformer's residual LayerNorms use
    it.  Only ``axis=-1`` with ``center`` and ``scale`` (the defaults) is supported.

    Example:
      >>> norm = LayerNorm(epsilon=1e-6)
      >>> norm(keras.ops.ones((2, 3, 8))).shape
      (2, 3, 8)
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.axis not in (-1, [-1]) or not (self.center and self.scale) or self.rms_scaling:
            raise ValueError("LayerNorm normalises the last axis with center and scale only")

    def call(self, inputs):
        return layer_norm(ops.cast(inputs, self.compute_dtype), self.gamma, self.beta,
                          self.epsilon)
