"""Transformer encoder and decoder layers, pre-norm or post-norm, with T2T's four dropouts."""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.layers.attention import MultiHeadAttention, dense
from deep_nmt_tf.layers.deep_residual import BlockScaled
from deep_nmt_tf.layers.lexical_shortcuts import LexicalShortcut
from deep_nmt_tf.layers.normalization import LayerNorm

__all__ = ["FeedForward", "Residual", "TransformerEncoderLayer", "TransformerDecoderLayer"]


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class FeedForward(keras.layers.Layer):
    """Position-wise ``relu(x W1 + b1) W2 + b2`` with dropout on the hidden activations
    (Tensor2Tensor's ``relu_dropout``).

    Args:
      d_model: input/output size.
      ffn_dim: hidden size.
      relu_dropout: dropout rate on the ReLU output.
    """

    def __init__(self, d_model, ffn_dim, relu_dropout=0.0, kernel_initializer="glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model = int(d_model)
        self.ffn_dim = int(ffn_dim)
        self.relu_dropout = float(relu_dropout)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout_layer = keras.layers.Dropout(self.relu_dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        init = self.kernel_initializer
        self.kernel1 = self.add_weight(name="kernel1", shape=(self.d_model, self.ffn_dim),
                                       initializer=init)
        self.bias1 = self.add_weight(name="bias1", shape=(self.ffn_dim,), initializer="zeros")
        self.kernel2 = self.add_weight(name="kernel2", shape=(self.ffn_dim, self.d_model),
                                       initializer=init)
        self.bias2 = self.add_weight(name="bias2", shape=(self.d_model,), initializer="zeros")
        self.built = True

    def call(self, x, training=None):
        h = ops.relu(dense(x, self.kernel1, self.bias1))
        h = self.dropout_layer(h, training=training)
        return dense(h, self.kernel2, self.bias2)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "ffn_dim": self.ffn_dim,
            "relu_dropout": self.relu_dropout,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class Residual(keras.layers.Layer):
    """Residual connection with LayerNorm and residual dropout around a sub-layer ``f``:

    - post-norm: ``LN(w * x + dropout(f(x)))``, ``w`` = 1 (Vaswani et al.), a constant alpha
      (DeepNorm) or a learnable per-dimension vector initialised to ``scale`` (Admin); see
      :mod:`deep_nmt_tf.layers.deep_residual`;
    - pre-norm:  ``x + dropout(f(LN(x)))`` (no residual scale).

    Usage: ``y = res.outputs(x, f(res.inputs(x)), training)``.

    Args:
      norm: ``"post"`` or ``"pre"``.
      epsilon: LayerNorm epsilon.
      residual_dropout: dropout on ``f(x)``.
      scale: the residual weight ``w`` (post-norm only).
      learnable_scale: ``w`` is a trainable ``[D]`` vector initialised to ``scale`` (Admin).
    """

    def __init__(self, norm="post", epsilon=1e-6, residual_dropout=0.0, scale=1.0,
                 learnable_scale=False, **kwargs):
        super().__init__(**kwargs)
        self.norm = norm
        self.epsilon = float(epsilon)
        self.residual_dropout = float(residual_dropout)
        self.scale = float(scale)
        self.learnable_scale = bool(learnable_scale)
        self.pre = norm == "pre"
        if self.pre and (self.scale != 1.0 or self.learnable_scale):
            raise ValueError("a residual scale (DeepNorm, Admin) needs norm='post'")
        self.norm_layer = LayerNorm(epsilon=self.epsilon, dtype=self.dtype_policy, name="norm")
        self.dropout = keras.layers.Dropout(self.residual_dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.norm_layer.build(input_shape)
        if self.learnable_scale:
            self.omega = self.add_weight(
                name="omega", shape=(input_shape[-1],),
                initializer=keras.initializers.Constant(self.scale))
        self.built = True

    def inputs(self, x):
        return self.norm_layer(x) if self.pre else x

    def outputs(self, x, y, training=None):
        y = self.dropout(y, training=training)
        if self.learnable_scale:
            x = x * ops.cast(self.omega, x.dtype)
        elif self.scale != 1.0:
            x = x * ops.cast(self.scale, x.dtype)
        y = x + y
        return y if self.pre else self.norm_layer(y)

    def call(self, x, y, training=None):
        return self.outputs(x, y, training)

    def get_config(self):
        config = super().get_config()
        config.update({"norm": self.norm, "epsilon": self.epsilon,
                       "residual_dropout": self.residual_dropout, "scale": self.scale,
                       "learnable_scale": self.learnable_scale})
        return config


class _TransformerLayerBase(keras.layers.Layer):
    def __init__(self, d_model, num_heads, ffn_dim, norm="post", residual_dropout=0.1,
                 attention_dropout=0.0, relu_dropout=0.0, layer_norm_epsilon=1e-6,
                 residual_scale=1.0, learnable_residual_scale=False, init_scale=1.0, **kwargs):
        super().__init__(**kwargs)
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.residual_scale = float(residual_scale)
        self.learnable_residual_scale = bool(learnable_residual_scale)
        self.init_scale = float(init_scale)
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.norm = norm
        self.residual_dropout = float(residual_dropout)
        self.attention_dropout = float(attention_dropout)
        self.relu_dropout = float(relu_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def _sublayer(self, name):
        return Residual(self.norm, self.layer_norm_epsilon, self.residual_dropout,
                        scale=self.residual_scale, learnable_scale=self.learnable_residual_scale,
                        dtype=self.dtype_policy, name=f"{name}_residual")

    def _attention(self, name, self_attention, **kwargs):
        return MultiHeadAttention(self.d_model, self.num_heads, self.attention_dropout,
                                  self_attention=self_attention,
                                  value_output_scale=self.init_scale, dtype=self.dtype_policy,
                                  name=name, **kwargs)

    def _make_ffn(self):
        init = "glorot_uniform"
        if self.init_scale != 1.0:
            init = BlockScaled(init, [self.init_scale])
        return FeedForward(self.d_model, self.ffn_dim, self.relu_dropout,
                           kernel_initializer=init, dtype=self.dtype_policy, name="ffn")

    def _shortcut(self, variant, name):
        if variant is None:
            return None
        return LexicalShortcut(self.d_model, variant=variant, dtype=self.dtype_policy, name=name)

    @staticmethod
    def _gated_self_attention(attention, shortcut, x, source, bias, training):
        """Self-attention whose keys/values are gated with ``source`` (lexical shortcuts)."""
        q, k, v = attention.project_qkv_raw(x)
        k, v, gates = shortcut(source, x, k, v, return_gates=True)
        q = attention.scale_query(attention.split_heads(q))
        y = attention.attend(q, attention.split_heads(k), attention.split_heads(v), bias,
                             training)
        return y, gates

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "norm": self.norm,
            "residual_dropout": self.residual_dropout,
            "attention_dropout": self.attention_dropout,
            "relu_dropout": self.relu_dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "residual_scale": self.residual_scale,
            "learnable_residual_scale": self.learnable_residual_scale,
            "init_scale": self.init_scale,
        })
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerEncoderLayer(_TransformerLayerBase):
    """Self-attention + feed-forward, each with a residual connection and LayerNorm.

    Args:
      d_model, num_heads, ffn_dim: sizes.
      norm: ``"post"`` (Vaswani et al.) or ``"pre"`` (Wang et al. 2019).
      residual_dropout, attention_dropout, relu_dropout: Tensor2Tensor's dropouts.
      layer_norm_epsilon: LayerNorm epsilon.
      residual_scale, learnable_residual_scale: the post-norm residual weight of every
        sub-layer (:class:`Residual`): DeepNorm's alpha (fixed) or Admin's initial omega
        (learnable), see :mod:`deep_nmt_tf.layers.deep_residual`.
      init_scale: DeepNorm's beta: the feed-forward, value and output projections are
        initialised scaled by it (1: unscaled).

      shortcut: ``None`` or a lexical-shortcut variant (``'shortcuts'`` or
        ``'feature_fusion'``, :class:`~deep_nmt_tf.layers.LexicalShortcut`) gating a shortcut
        source into the self-attention keys/values.

    Call: ``layer(x, bias=None, training=None, shortcut=None, return_gates=False)``, ``x``
    ``[B, S, D]``, ``bias`` the padding bias ``[B, 1, 1, S]`` (``padding_bias``), ``shortcut``
    the shortcut source ``[B, S, D]`` (required when the layer has a shortcut).  Returns
    ``[B, S, D]``; with ``return_gates`` also a dict ``{"self": (key_gate, value_gate)}`` (empty
    without shortcut).

    Example:
      >>> layer = TransformerEncoderLayer(16, 4, 32, norm="pre")
      >>> layer(keras.random.normal((2, 5, 16))).shape
      (2, 5, 16)
    """

    def __init__(self, *args, shortcut=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.shortcut_variant = shortcut
        self.self_attention = self._attention("self_attention", True)
        self.self_shortcut = self._shortcut(shortcut, "self_attention_shortcut")
        self.ffn = self._make_ffn()
        self.attention_sublayer = self._sublayer("self_attention")
        self.ffn_sublayer = self._sublayer("ffn")

    def build(self, input_shape):
        subs = [self.self_attention, self.ffn, self.attention_sublayer, self.ffn_sublayer]
        if self.self_shortcut is not None:
            subs.append(self.self_shortcut)
        for sub in subs:
            sub.build(input_shape)
        self.built = True

    def attention_block(self, x, bias=None, training=None, shortcut=None, return_gates=False):
        """Self-attention sub-layer on the (pre-norm: normalised) input ``x``; with a lexical
        shortcut its keys/values are gated with the shortcut source ``shortcut``."""
        if self.self_shortcut is None:
            y, gates = self.self_attention(x, bias=bias, training=training), None
        else:
            if shortcut is None:
                raise ValueError(f"{self.name}: this layer has a lexical shortcut; pass the "
                                 "shortcut source as `shortcut=`")
            y, gates = self._gated_self_attention(self.self_attention, self.self_shortcut, x,
                                                  shortcut, bias, training)
        return (y, gates) if return_gates else y

    def call(self, x, bias=None, training=None, shortcut=None, return_gates=False):
        s = self.attention_sublayer
        y, gates = self.attention_block(s.inputs(x), bias, training, shortcut, return_gates=True)
        x = s.outputs(x, y, training)
        s = self.ffn_sublayer
        x = s.outputs(x, self.ffn(s.inputs(x), training=training), training)
        if return_gates:
            return x, ({"self": gates} if gates is not None else {})
        return x

    def get_config(self):
        config = super().get_config()
        config.update({"shortcut": self.shortcut_variant})
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerDecoderLayer(_TransformerLayerBase):
    """Causal self-attention, encoder-decoder attention and feed-forward sub-layers.

    Call (teacher forcing): ``layer(x, memory, self_bias=None, memory_bias=None, training=None,
    shortcut=None, memory_shortcut=None, return_gates=False)`` with ``x`` ``[B, T, D]``,
    ``memory`` ``[B, S, D_mem]``, ``self_bias`` the causal bias (``causal_bias(T)``) and
    ``memory_bias`` the source padding bias.  ``shortcut`` (``[B, T, D]``) and
    ``memory_shortcut`` (``[B, S, D_mem]``, the source embeddings) are the lexical-shortcut
    sources of the self- and encoder-decoder attention when the layer has those shortcuts.

    Incremental decoding: ``cache = layer.init_cache(memory, max_length, memory_shortcut=None)``
    computes the memory keys/values once (gated, with a cross-attention shortcut);
    ``y, cache = layer.step(x, cache, step, self_bias, memory_bias, shortcut=None)`` runs one
    position (``x`` ``[B, 1, D]``, ``self_bias = step_bias(step, max_length)``, ``shortcut`` the
    shortcut source at that position).  The self-attention cache holds the gated keys/values.

    Args: as :class:`TransformerEncoderLayer` except ``shortcut`` (here ``self_shortcut``),
      plus ``memory_dim`` (default d_model),
      ``self_shortcut`` / ``cross_shortcut``: ``None`` or a lexical-shortcut variant for the
      self-attention / the encoder-decoder attention (Emelin et al. 2019, Table 4).
    """

    def __init__(self, *args, memory_dim=None, self_shortcut=None, cross_shortcut=None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.memory_dim = int(memory_dim or self.d_model)
        self.self_shortcut_variant = self_shortcut
        self.cross_shortcut_variant = cross_shortcut
        self.self_attention = self._attention("self_attention", True)
        self.cross_attention = self._attention("cross_attention", False,
                                               memory_dim=self.memory_dim)
        self.self_shortcut = self._shortcut(self_shortcut, "self_attention_shortcut")
        self.cross_shortcut = None
        if cross_shortcut is not None:
            self.cross_shortcut = LexicalShortcut(
                self.d_model, source_dim=self.memory_dim, variant=cross_shortcut,
                dtype=self.dtype_policy, name="cross_attention_shortcut")
        self.ffn = self._make_ffn()
        self.self_sublayer = self._sublayer("self_attention")
        self.cross_sublayer = self._sublayer("cross_attention")
        self.ffn_sublayer = self._sublayer("ffn")

    def build(self, input_shape):
        for sub in (self.self_attention, self.cross_attention, self.ffn,
                    self.self_sublayer, self.cross_sublayer,
                    self.ffn_sublayer):
            sub.build(input_shape)
        if self.self_shortcut is not None:
            self.self_shortcut.build(input_shape)
        if self.cross_shortcut is not None:
            self.cross_shortcut.build((None, None, self.memory_dim))
        self.built = True

    def _cross_and_ffn(self, x, cross_k, cross_v, memory_bias, training):
        s = self.cross_sublayer
        q = self.cross_attention.project_query(s.inputs(x))
        y = self.cross_attention.attend(q, cross_k, cross_v, memory_bias, training)
        return self._ffn_sublayer(s.outputs(x, y, training), training)

    def _ffn_sublayer(self, x, training):
        s = self.ffn_sublayer
        return s.outputs(x, self.ffn(s.inputs(x), training=training), training)

    def _require(self, value, what):
        if value is None:
            raise ValueError(f"{self.name}: this layer has a lexical shortcut on its {what}; "
                             "pass its shortcut source")

    def cross_key_value(self, memory, memory_shortcut=None, return_gates=False):
        """Per-head keys/values ``[B, H, S, dh]`` of ``memory`` (gated with the source
        embeddings ``memory_shortcut`` when the cross-attention has a shortcut)."""
        att = self.cross_attention
        if self.cross_shortcut is None:
            k, v = att.project_key_value(memory)
            gates = None
        else:
            self._require(memory_shortcut, "encoder-decoder attention")
            k, v = att.project_key_value_raw(memory)
            k, v, gates = self.cross_shortcut(memory_shortcut, memory, k, v, return_gates=True)
            k, v = att.split_heads(k), att.split_heads(v)
        return (k, v, gates) if return_gates else (k, v)

    def self_attention_block(self, x, self_bias=None, training=None, shortcut=None,
                             return_gates=False):
        """Self-attention sub-layer (teacher forcing) on the (pre-norm: normalised) input."""
        if self.self_shortcut is None:
            y, gates = self.self_attention(x, bias=self_bias, training=training), None
        else:
            self._require(shortcut, "self-attention")
            y, gates = self._gated_self_attention(self.self_attention, self.self_shortcut, x,
                                                  shortcut, self_bias, training)
        return (y, gates) if return_gates else y

    def self_attention_step(self, x, cache, step, self_bias, training=None, shortcut=None,
                            masks=None):
        """Self-attention sub-layer for one decoding step (``x`` ``[B, D]``); returns (y, new
        self cache).

        With a lexical shortcut the cache receives the *gated* keys/values of position
        ``step``; ``shortcut`` is the shortcut source at that position only.  ``masks``: the
        cache write masks of :func:`~deep_nmt_tf.layers.attention.step_masks`.
        """
        if self.self_shortcut is None:
            return self.self_attention.step(x, cache, step, self_bias, training, masks=masks)
        self._require(shortcut, "self-attention")
        att = self.self_attention
        q, k, v = att.project_qkv_raw(x)
        k, v = self.self_shortcut(shortcut, x, k, v)
        cache = att.write_cache(cache, k, v, step, masks)
        return att.attend_step(att.step_query(q), cache["k"], cache["v"], self_bias), cache

    def call(self, x, memory, self_bias=None, memory_bias=None, training=None, shortcut=None,
             memory_shortcut=None, return_gates=False):
        s = self.self_sublayer
        y, self_gates = self.self_attention_block(s.inputs(x), self_bias, training, shortcut,
                                                  return_gates=True)
        x = s.outputs(x, y, training)
        k, v, cross_gates = self.cross_key_value(memory, memory_shortcut, return_gates=True)
        x = self._cross_and_ffn(x, k, v, memory_bias, training)
        if return_gates:
            gates = {}
            if self_gates is not None:
                gates["self"] = self_gates
            if cross_gates is not None:
                gates["cross"] = cross_gates
            return x, gates
        return x

    def init_cache(self, memory, max_length, memory_shortcut=None):
        """Decoding cache: zero self-attention keys/values
        (:meth:`~deep_nmt_tf.layers.MultiHeadAttention.init_cache`) and the memory's keys
        and values, computed once; the keys transposed and scaled by ``dh**-0.5`` (so that no
        step scales its query)."""
        batch = ops.shape(memory)[0]
        k, v = self.cross_key_value(memory, memory_shortcut)
        k = ops.transpose(self.cross_attention.scale_query(k), (0, 1, 3, 2))
        return {"self": self.self_attention.init_cache(batch, max_length, self.compute_dtype),
                "cross": {"k": k, "v": v}}

    def step(self, x, cache, step, self_bias, memory_bias=None, training=None, shortcut=None,
             masks=None):
        """One position: ``x`` ``[B, D]`` (or ``[B, 1, D]``, the result has ``x``'s shape);
        ``masks`` as :meth:`self_attention_step` (default: computed from ``step``)."""
        rank3 = len(x.shape) == 3
        x = ops.cast(x, self.compute_dtype)
        if rank3:
            x = ops.reshape(x, (-1, self.d_model))
            if shortcut is not None:
                shortcut = ops.reshape(shortcut, (-1, self.d_model))
        s = self.self_sublayer
        y, self_cache = self.self_attention_step(s.inputs(x), cache["self"], step, self_bias,
                                                 training, shortcut, masks)
        x = s.outputs(x, y, training)
        s, att = self.cross_sublayer, self.cross_attention
        q = att.step_query(dense(s.inputs(x), att.q_kernel, att.q_bias), scale=False)
        y = att.attend_step(q, cache["cross"]["k"], cache["cross"]["v"], memory_bias)
        x = self._ffn_sublayer(s.outputs(x, y, training), training)
        return (ops.expand_dims(x, 1) if rank3 else x), {"self": self_cache,
                                                         "cross": cache["cross"]}

    def get_config(self):
        config = super().get_config()
        config.update({"memory_dim": self.memory_dim,
                       "self_shortcut": self.self_shortcut_variant,
                       "cross_shortcut": self.cross_shortcut_variant})
        return config
