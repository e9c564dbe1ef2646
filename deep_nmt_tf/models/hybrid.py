"""Hybrid encoders of Chen et al. 2018 (section 6), pure Keras 3.

- :class:`MultiColumnEncoder` (``model.architecture: multi_column``, section 6.2): several
  encoders ("columns", ``model.hybrid.columns``, any registered encoder types) read the same
  source; each column's output is layer-normalised, the columns are concatenated and a
  layer-normalised affine projection maps the result to ``d_model`` (the decoder's memory
  width)::

      c_k    = LayerNorm_k(column_k(source)["memory"])          # k = 1 .. K
      memory = LayerNorm(concat(c_1, .., c_K) @ W + b)

  The padding mask is shared (every column derives the same mask from the ids).
- :class:`CascadedEncoder` (``model.architecture: cascaded``, section 6.1): an RNMT+ encoder
  including its projection (sub-layer ``rnmt``; warm-startable and freezable as
  ``encoder/rnmt``), its output layer-normalised and fed into ``model.hybrid.cascade_layers``
  Transformer encoder layers WITHOUT positional embeddings (the recurrent encoder already
  encodes positions)::

      x_0    = LayerNorm(RNMTPlusEncoder(source)["memory"])
      x_k    = TransformerEncoderLayer_k(x_{k-1})               # k = 1 .. K (4 in the paper)
      memory = x_K  (post-norm)  /  LayerNorm(x_K)  (pre-norm)

Both return the encoder interface of ``docs/DESIGN.md``: ``{"memory", "mask",
"layer_outputs"}`` (+ ``"gates"`` with ``return_gates``).  ``layer_outputs`` is for the
diagnostics only (transparent attention is not defined for these encoders; the config refuses
it): multi-column: the first column's layer outputs, then the merged memory; cascaded: the RNMT+
layer outputs, then the normalised RNMT+ memory and each Transformer layer's output.
:class:`MultiColumnEncoder` also returns ``"column_outputs"``: the K normalised columns.

Choices where the paper is silent: each column has its own source embedding (the first column
uses the model's source embedding, which the target side may share); no extra dropout between
the RNMT+ part and the Transformer layers of the cascade (the layers have their own residual and
attention dropout).
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.layers.attention import padding_bias
from deep_nmt_tf.layers.transformer import TransformerEncoderLayer
from deep_nmt_tf.models.rnmt import RNMTPlusEncoder

__all__ = ["MultiColumnEncoder", "CascadedEncoder"]


def _serialize(layer):
    """A sub-layer's config without its build config: the parent builds it (with its own name
    scope, so that the variable paths nest under the parent)."""
    config = keras.saving.serialize_keras_object(layer)
    config.pop("build_config", None)
    return config


def _deserialize(obj):
    if isinstance(obj, dict):
        return keras.saving.deserialize_keras_object(obj)
    return obj


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class MultiColumnEncoder(keras.layers.Layer):
    """Multi-column encoder (module docstring).

    Args:
      columns: list of encoder layers (or their serialised configs), each following the
        encoder interface (``d_model`` attribute = width of its memory).
      output_dim: width of the merged memory (the decoder's ``d_model``).
      layer_norm_epsilon: epsilon of the column and output LayerNorms.
    """

    def __init__(self, columns, output_dim, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.columns = [_deserialize(c) for c in columns]
        if not self.columns:
            raise ValueError("a multi-column encoder needs at least one column")
        self.output_dim = int(output_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        policy = self.dtype_policy
        self.column_norms = [keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name=f"column_norm_{i}")
            for i in range(len(self.columns))]
        self.projection = keras.layers.Dense(self.output_dim, dtype=policy, name="projection")
        self.output_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="output_norm")
        self.dlcl = None  # interface parity with TransformerEncoder

    @property
    def d_model(self):
        return self.output_dim

    @property
    def embedding(self):
        return self.columns[0].embedding

    def build(self, ids_shape=None):
        if self.built:
            return
        total = 0
        for column, norm in zip(self.columns, self.column_norms):
            column.build((None, None))
            norm.build((None, None, column.d_model))
            total += column.d_model
        self.projection.build((None, None, total))
        self.output_norm.build((None, None, self.output_dim))
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        outs = [column(source_ids, training=training) for column in self.columns]
        normed = [norm(o["memory"]) for norm, o in zip(self.column_norms, outs)]
        merged = ops.concatenate(normed, axis=-1) if len(normed) > 1 else normed[0]
        memory = self.output_norm(self.projection(merged))
        result = {"memory": memory, "mask": outs[0]["mask"],
                  "layer_outputs": list(outs[0]["layer_outputs"]) + [memory],
                  "column_outputs": normed}
        if return_gates:
            result["gates"] = []
        return result

    def get_config(self):
        config = super().get_config()
        config.update({"columns": [_serialize(c) for c in self.columns],
                       "output_dim": self.output_dim,
                       "layer_norm_epsilon": self.layer_norm_epsilon})
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class CascadedEncoder(keras.layers.Layer):
    """Cascaded encoder (module docstring): RNMT+ encoder -> LayerNorm -> K Transformer layers.

    Args:
      rnmt: the :class:`~deep_nmt_tf.models.RNMTPlusEncoder` (or its serialised config); its
        ``output_dim`` is the Transformer layers' ``d_model``.  Named ``rnmt`` when built by
        the factory (warm start / freeze path ``encoder/rnmt``).
      num_layers: K Transformer layers.
      num_heads, ffn_dim, norm, residual_dropout, attention_dropout, relu_dropout,
      layer_norm_epsilon: see :class:`~deep_nmt_tf.layers.TransformerEncoderLayer`.
    """

    def __init__(self, rnmt, num_layers, num_heads, ffn_dim, norm="post", residual_dropout=0.1,
                 attention_dropout=0.0, relu_dropout=0.0, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.rnmt = _deserialize(rnmt)
        if not isinstance(self.rnmt, RNMTPlusEncoder):
            raise ValueError(f"the cascade's first stage must be an RNMTPlusEncoder, got "
                             f"{type(self.rnmt).__name__}")
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.norm = norm
        self.residual_dropout = float(residual_dropout)
        self.attention_dropout = float(attention_dropout)
        self.relu_dropout = float(relu_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        policy = self.dtype_policy
        d = self.d_model
        if d % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide the RNMT+ output "
                             f"width {d}")
        self.input_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="input_norm")
        self.layers_ = [TransformerEncoderLayer(
            d_model=d, num_heads=self.num_heads, ffn_dim=self.ffn_dim, norm=norm,
            residual_dropout=self.residual_dropout, attention_dropout=self.attention_dropout,
            relu_dropout=self.relu_dropout, layer_norm_epsilon=self.layer_norm_epsilon,
            dtype=policy, name=f"layer_{i}") for i in range(self.num_layers)]
        self.final_norm = None
        if norm == "pre":
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=policy, name="final_norm")
        self.dlcl = None

    @property
    def d_model(self):
        return self.rnmt.output_dim

    @property
    def embedding(self):
        return self.rnmt.embedding

    def build(self, ids_shape=None):
        if self.built:
            return
        self.rnmt.build(ids_shape)
        shape = (None, None, self.d_model)
        self.input_norm.build(shape)
        for layer in self.layers_:
            layer.build(shape)
        if self.final_norm is not None:
            self.final_norm.build(shape)
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        out = self.rnmt(source_ids, training=training)
        mask = out["mask"]
        bias = padding_bias(mask)
        x = self.input_norm(out["memory"])
        # Padded positions to 0 (a fresh tensor: the RNMT+ output's Keras mask, which the
        # Transformer layers do not take, stays behind; they mask with ``bias``).
        x = ops.where(ops.expand_dims(mask, -1), x, ops.zeros_like(x))
        outputs = list(out["layer_outputs"]) + [x]
        for layer in self.layers_:
            x = layer(x, bias=bias, training=training)
            outputs.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        result = {"memory": x, "mask": mask, "layer_outputs": outputs}
        if return_gates:
            result["gates"] = []
        return result

    def get_config(self):
        config = super().get_config()
        config.update({"rnmt": _serialize(self.rnmt),
                       "num_layers": self.num_layers, "num_heads": self.num_heads,
                       "ffn_dim": self.ffn_dim, "norm": self.norm,
                       "residual_dropout": self.residual_dropout,
                       "attention_dropout": self.attention_dropout,
                       "relu_dropout": self.relu_dropout,
                       "layer_norm_epsilon": self.layer_norm_epsilon})
        return config
