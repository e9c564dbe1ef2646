"""Lexical shortcuts and feature fusion (Emelin et al. 2019, Eq. 5-14)."""

from __future__ import annotations

import math

import keras
from keras import ops

from deep_nmt_tf.layers.attention import dense

__all__ = ["LexicalShortcut", "VARIANTS"]

VARIANTS = ("shortcuts", "feature_fusion")


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class LexicalShortcut(keras.layers.Layer):
    """Gates a shortcut source (the embeddings) into one attention's keys and values.

    Plain shortcuts (Eq. 5-12), for layer l with shortcut source ``E`` (the layer-0 input: scaled
    token embedding plus positions after input dropout, not normalised) and hidden input
    ``H = H_{l-1}`` (the attention's ordinary input)::

        K_sc = E W^{K_SC}_l,   V_sc = E W^{V_SC}_l          (Eq. 5-6, no bias)
        K    = attention's own key projection of H,   V likewise   (Eq. 7-8)
        r^K  = sigmoid(K_sc + K + b^K),   r^V likewise      (Eq. 9-10, a bias vector per gate)
        K'   = r^K * K_sc + (1 - r^K) * K,   V' likewise    (Eq. 11-12)

    Queries come from the hidden stream only (the attention's own query projection); there
    are no separate gate matrices.  Extra parameters per attention: ``2 D_s D + 2 D``.

    Feature fusion (Eq. 13-14): ``[K_sc, K] = W^K_l [E; H]`` with ``W^K_l`` of shape
    ``[D_s + D, 2D]`` split in halves, likewise for values, then gated as above.  We store
    ``W^K_l`` in two places: its ``H -> K`` block is the attention's ordinary key kernel (and
    bias), the other three blocks live here (``source_kernel`` holds the ``E`` rows of both
    halves of ``W^K`` and ``W^V``; ``hidden_kernel`` holds the ``H`` rows of the shortcut
    halves).  The shortcut halves have no bias.  Extra parameters per attention:
    ``2 (D_s * 2D + D * D) + 2 D`` = ``6 D^2 + 2 D`` for ``D_s = D``, which with d_model 512 and
    12 self-attentions gives Emelin et al.'s Table 5 (65,166K -> 84,053K).

    Initialisation: the kernels are Glorot-uniform over the *logical* matrices of the reference
    (``[D_s, D]`` per shortcut projection; ``[D_s + D, 2D]`` per fused projection), so a fused
    storage layout does not change the scale.  Gate biases start at zero (the reference TF code
    draws them Glorot-uniform, |b| < sqrt(3/D) ~ 0.08 for D = 512: a negligible difference; zero
    keeps the initial gate a symmetric function of ``K_sc + K``).

    The reference TF code's quirks are not copied (see ``../shared/METHODS.md``): keys, values
    and queries all come from the same (pre-norm: normalised) attention input, and the residual
    is the standard one.

    Args:
      d_model: key/value size D of the attention.
      source_dim: size D_s of the shortcut source (default d_model).
      variant: ``'shortcuts'`` or ``'feature_fusion'``.
      kernel_initializer: overrides the reference-equivalent Glorot initialisation above.
      gate_bias_initializer: initialiser of ``b^K`` and ``b^V`` (default zeros).

    Call:
      ``layer(source, hidden, keys, values, return_gates=False)`` with ``source`` ``[B, T, D_s]``,
      ``hidden`` ``[B, T, D]`` (the attention input; read only by feature fusion) and ``keys`` /
      ``values`` ``[B, T, D]`` the attention's own projections of ``hidden`` (before head
      splitting).  Returns gated ``(keys, values)`` ``[B, T, D]``, plus ``(r^K, r^V)`` when
      ``return_gates``.

    Example:
      >>> sc = LexicalShortcut(8)
      >>> e, h = keras.random.normal((2, 3, 8)), keras.random.normal((2, 3, 8))
      >>> k, v = sc(e, h, h, h)
      >>> k.shape
      (2, 3, 8)

    References:
      Emelin, Titov, Sennrich (2019). Widening the Representation Bottleneck in Neural Machine
      Translation with Lexical Shortcuts. WMT.
    """

    def __init__(self, d_model, source_dim=None, variant="shortcuts", kernel_initializer=None,
                 gate_bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.d_model = int(d_model)
        self.source_dim = int(source_dim or d_model)
        self.variant = variant
        self.kernel_initializer = (keras.initializers.get(kernel_initializer)
                                   if kernel_initializer is not None else None)
        self.gate_bias_initializer = keras.initializers.get(gate_bias_initializer)

    def _glorot(self, fan_in, fan_out):
        if self.kernel_initializer is not None:
            return self.kernel_initializer
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return keras.initializers.RandomUniform(-limit, limit)

    def build(self, input_shape=None):
        d, ds = self.d_model, self.source_dim
        if self.variant == "shortcuts":
            # [W^{K_SC} | W^{V_SC}], each a [D_s, D] reference matrix.
            self.source_kernel = self.add_weight(
                name="source_kernel", shape=(ds, 2 * d), initializer=self._glorot(ds, d))
            self.hidden_kernel = None
        else:
            # E rows of W^K and W^V: [K_sc | K_hidden | V_sc | V_hidden]; H rows of the shortcut
            # halves: [K_sc | V_sc].  Reference matrices W^K, W^V are [D_s + D, 2D] each.
            init = self._glorot(ds + d, 2 * d)
            self.source_kernel = self.add_weight(
                name="source_kernel", shape=(ds, 4 * d), initializer=init)
            self.hidden_kernel = self.add_weight(
                name="hidden_kernel", shape=(d, 2 * d), initializer=init)
        self.key_gate_bias = self.add_weight(
            name="key_gate_bias", shape=(d,), initializer=self.gate_bias_initializer)
        self.value_gate_bias = self.add_weight(
            name="value_gate_bias", shape=(d,), initializer=self.gate_bias_initializer)
        self.built = True

    def shortcut_key_value(self, source, hidden, keys, values):
        """``(K_sc, K, V_sc, V)`` before gating (feature fusion adds the E terms to K, V)."""
        if self.variant == "shortcuts":
            k_sc, v_sc = ops.split(dense(source, self.source_kernel), 2, axis=-1)
            return k_sc, keys, v_sc, values
        k_sc_e, k_h_e, v_sc_e, v_h_e = ops.split(dense(source, self.source_kernel), 4, axis=-1)
        k_sc_h, v_sc_h = ops.split(dense(hidden, self.hidden_kernel), 2, axis=-1)
        return k_sc_e + k_sc_h, keys + k_h_e, v_sc_e + v_sc_h, values + v_h_e

    def call(self, source, hidden, keys, values, return_gates=False):
        k_sc, k, v_sc, v = self.shortcut_key_value(source, hidden, keys, values)
        gate_k = ops.sigmoid(k_sc + k + ops.cast(self.key_gate_bias, k.dtype))
        gate_v = ops.sigmoid(v_sc + v + ops.cast(self.value_gate_bias, v.dtype))
        k = gate_k * k_sc + (1.0 - gate_k) * k
        v = gate_v * v_sc + (1.0 - gate_v) * v
        if return_gates:
            return k, v, (gate_k, gate_v)
        return k, v

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "source_dim": self.source_dim,
            "variant": self.variant,
            "kernel_initializer": (keras.initializers.serialize(self.kernel_initializer)
                                   if self.kernel_initializer is not None else None),
            "gate_bias_initializer": keras.initializers.serialize(self.gate_bias_initializer),
        })
        return config
