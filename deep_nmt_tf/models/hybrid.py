"""The hybrid encoders of Chen et al. 2018 (section 6) as combinators over registered encoders.

- :class:`CascadedEncoder` (``model.encoder.type: cascaded``, section 6.1): stages encode one
  after the other; stage 0 reads the source tokens, each later stage the layer-normalised
  output of the one before it (through :meth:`~deep_nmt_tf.models.base.Encoder.call_features`:
  no embedding, hence no positional embeddings for a Transformer stage)::

      m_0    = stage_0(source)["memory"]
      x_k    = LayerNorm_k(m_{k-1}), padded positions set to 0          # k = 1 .. K-1
      m_k    = stage_k.call_features(x_k, mask)["memory"]
      memory = m_{K-1}

  The paper's: RNMT+ (with its projection) then 4 Transformer layers
  (``configs/cascaded_rnmt_transformer.yaml``; stage 0 is warm-startable and freezable as
  ``encoder/stages/0``).
- :class:`MultiColumnEncoder` (``model.encoder.type: multi_column``, section 6.2): every column
  reads the same source; each column's output is layer-normalised, the columns are concatenated
  and a layer-normalised affine projection maps the result to ``d_model``::

      c_k    = LayerNorm_k(column_k(source)["memory"])                  # k = 0 .. K-1
      memory = LayerNorm(concat(c_0, .., c_{K-1}) @ W + b)

Both return the encoder dict of :class:`~deep_nmt_tf.models.base.Encoder`.  Their
``layer_outputs`` serve the diagnostics only (transparent attention is not defined for them;
the config refuses it): cascaded: every stage's layer outputs in order (a later stage's
``layer_outputs[0]`` is its normalised input); multi-column: the first column's, then the merged
memory.  :class:`MultiColumnEncoder` also returns ``"column_outputs"``: the K normalised
columns.

Choices where the paper is silent: column 0 uses the model's source embedding (the target side
may share it), the other columns build their own; a later cascade stage's own input dropout
(``input_dropout`` / ``embedding_dropout`` of its section) applies to its input.
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.models.base import Encoder, build_encoder, encoder_class, register_encoder

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


class _Combinator(Encoder):
    """Shared parts: a list of sub-encoders (``self.parts``), their diagnostics, layer norms."""

    parts_name = "parts"

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon,
                                               dtype=self.dtype_policy, name=name)

    @property
    def embedding(self):
        return self.parts[0].embedding

    def diagnostic_weights(self):
        return {f"{self.parts_name}_{i}_{name}": value
                for i, part in enumerate(self.parts)
                for name, value in part.diagnostic_weights().items()}

    @classmethod
    def make_embedding(cls, options, model, dtype, name):
        first = getattr(options, cls.parts_name)[0]
        return encoder_class(first.type).make_embedding(first.get(), model, dtype, name)

    #: Whether the parts after the first read features (a cascade) rather than tokens.
    later_parts_read_features = False

    @classmethod
    def _build_parts(cls, options, model, embedding, dtype):
        """Part 0 gets the model's source embedding; later columns build their own, later
        cascade stages none."""
        return [build_encoder(part, model, dtype, f"{cls.parts_name[:-1]}_{i}",
                              embedding=embedding if i == 0 else None,
                              features=i > 0 and cls.later_parts_read_features)
                for i, part in enumerate(getattr(options, cls.parts_name))]


@register_encoder("multi_column")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class MultiColumnEncoder(_Combinator):
    """Multi-column encoder (module docstring).

    Args:
      columns: list of encoders (or their serialised configs).
      output_dim: width of the merged memory (the decoder's ``d_model``).
      layer_norm_epsilon: epsilon of the column and output LayerNorms.
    """

    parts_name = "columns"

    def __init__(self, columns, output_dim, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.columns = [_deserialize(c) for c in columns]
        if not self.columns:
            raise ValueError("a multi-column encoder needs at least one column")
        self.merged_dim = int(output_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.column_norms = [self._norm(f"column_norm_{i}") for i in range(len(self.columns))]
        self.projection = keras.layers.Dense(self.merged_dim, dtype=self.dtype_policy,
                                             name="projection")
        self.output_norm = self._norm("output_norm")

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name):
        return cls(cls._build_parts(options, model, embedding, dtype), output_dim=model.d_model,
                   layer_norm_epsilon=model.layer_norm_epsilon, dtype=dtype, name=name)

    @property
    def parts(self):
        return self.columns

    @property
    def output_dim(self):
        return self.merged_dim

    def build(self, ids_shape=None):
        if self.built:
            return
        total = 0
        for column, norm in zip(self.columns, self.column_norms):
            column.build((None, None))
            norm.build((None, None, column.output_dim))
            total += column.output_dim
        self.projection.build((None, None, total))
        self.output_norm.build((None, None, self.merged_dim))
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
                       "output_dim": self.merged_dim,
                       "layer_norm_epsilon": self.layer_norm_epsilon})
        return config


@register_encoder("cascaded")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class CascadedEncoder(_Combinator):
    """Cascaded encoder (module docstring): each stage encodes the layer-normalised output of
    the one before.

    Args:
      stages: list of encoders (or their serialised configs), bottom first; every stage after
        the first must implement ``call_features`` and take features of the previous stage's
        ``output_dim``.
      layer_norm_epsilon: epsilon of the LayerNorms between stages.
    """

    parts_name = "stages"
    later_parts_read_features = True

    def __init__(self, stages, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.stages = [_deserialize(s) for s in stages]
        if not self.stages:
            raise ValueError("a cascaded encoder needs at least one stage")
        for stage in self.stages[1:]:
            if type(stage).call_features is Encoder.call_features:
                raise ValueError(f"{type(stage).__name__} cannot be a later cascade stage: it "
                                 "has no call_features")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.stage_norms = [self._norm(f"stage_norm_{i}") for i in range(1, len(self.stages))]

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name):
        return cls(cls._build_parts(options, model, embedding, dtype),
                   layer_norm_epsilon=model.layer_norm_epsilon, dtype=dtype, name=name)

    @property
    def parts(self):
        return self.stages

    @property
    def output_dim(self):
        return self.stages[-1].output_dim

    def build(self, ids_shape=None):
        if self.built:
            return
        self.stages[0].build(ids_shape)
        for before, stage, norm in zip(self.stages, self.stages[1:], self.stage_norms):
            shape = (None, None, before.output_dim)
            norm.build(shape)
            stage.build(shape)
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        out = self.stages[0](source_ids, training=training)
        mask = out["mask"]
        outputs = list(out["layer_outputs"])
        for stage, norm in zip(self.stages[1:], self.stage_norms):
            x = norm(out["memory"])
            # Padded positions to 0 (a fresh tensor: the previous stage's Keras mask, which
            # the next stage does not take, stays behind; it masks with ``mask``).
            x = ops.where(ops.expand_dims(mask, -1), x, ops.zeros_like(x))
            out = stage.call_features(x, mask, training=training)
            outputs.extend(out["layer_outputs"])
        result = {"memory": out["memory"], "mask": mask, "layer_outputs": outputs}
        if return_gates:
            result["gates"] = []
        return result

    def get_config(self):
        config = super().get_config()
        config.update({"stages": [_serialize(s) for s in self.stages],
                       "layer_norm_epsilon": self.layer_norm_epsilon})
        return config
