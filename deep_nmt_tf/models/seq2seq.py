"""The encoder-decoder model and its factory from the typed config."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

import keras

from deep_nmt_tf.layers.embedding import TokenEmbedding
from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder

__all__ = ["Seq2SeqModel", "build_model"]


def _model_config_dict(model_config) -> Dict[str, Any]:
    from deep_nmt_tf.config import config_to_dict

    if dataclasses.is_dataclass(model_config):
        return config_to_dict(model_config)
    return dict(model_config)


def _model_config(config_dict):
    from deep_nmt_tf.config import ModelConfig, config_from_dict

    return config_from_dict({"model": config_dict, "data": {"corpus": "synthetic"}},
                            source="<model config>").model


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class Seq2SeqModel(keras.Model):
    """Encoder-decoder translation model built from a ``model`` config section.

    Inputs (teacher forcing): ``{"source_ids": [B, S], "target_input_ids": [B, T]}`` int32,
    padded with 0; output float32 logits ``[B, T, V]``.

    Decoding interface (used by ``deep_nmt_tf.decoding`` and the exporter)::

        encoded = model.encode(source_ids)
        state = model.init_decoder_state(encoded, max_length)
        logits, state = model.decode_step(token_ids, step, state)

    Args:
      model_config: a :class:`deep_nmt_tf.config.ModelConfig` or its dict form; ``vocab_size``
        must be set (> 0).

    Example:
      >>> from deep_nmt_tf.config import ModelConfig
      >>> cfg = ModelConfig(vocab_size=100, d_model=16, num_heads=2, ffn_dim=32,
      ...                   encoder_layers=1, decoder_layers=1)
      >>> model = Seq2SeqModel(cfg)
    """

    def __init__(self, model_config, **kwargs):
        super().__init__(**kwargs)
        cfg = model_config if dataclasses.is_dataclass(model_config) else _model_config(
            model_config)
        if cfg.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (> 0) before building the model; "
                             "the trainer fills it in from the vocabulary file")
        self.model_config = cfg
        policy = self.dtype_policy
        d = cfg.d_model
        source_embedding = TokenEmbedding(cfg.vocab_size, d, dtype=policy,
                                          name="source_embedding")
        target_embedding = (source_embedding if cfg.tie_source_target_embeddings else
                            TokenEmbedding(cfg.vocab_size, d, dtype=policy,
                                           name="target_embedding"))
        common = dict(d_model=d, num_heads=cfg.num_heads, ffn_dim=cfg.ffn_dim, norm=cfg.norm,
                      input_dropout=cfg.input_dropout, residual_dropout=cfg.residual_dropout,
                      attention_dropout=cfg.attention_dropout, relu_dropout=cfg.relu_dropout,
                      layer_norm_epsilon=cfg.layer_norm_epsilon, dtype=policy)
        self.encoder = TransformerEncoder(source_embedding, cfg.encoder_layers, name="encoder",
                                          **common)
        self.decoder = TransformerDecoder(target_embedding, cfg.decoder_layers, name="decoder",
                                          tie_softmax=cfg.tie_softmax_embeddings, **common)

    def build(self, input_shape=None):
        if self.built:
            return
        self.encoder.build((None, None))
        self.decoder.build((None, None))
        self.built = True

    # -- teacher forcing -----------------------------------------------------------------
    def decoder_memories(self, encoded, training=None):
        """Memory (or list of per-layer memories) the decoder attends to."""
        return encoded["memory"]

    def call(self, inputs, training=None):
        encoded = self.encode(inputs["source_ids"], training=training)
        return self.decoder(inputs["target_input_ids"],
                            self.decoder_memories(encoded, training=training),
                            encoded["mask"], training=training)

    # -- decoding interface ---------------------------------------------------------------
    def encode(self, source_ids, training=False):
        """Runs the encoder: dict with ``memory``, ``mask`` and ``layer_outputs``."""
        return self.encoder(source_ids, training=training)

    def init_decoder_state(self, encoded, max_length):
        """Decoder state (memory keys/values computed once, empty self-attention caches)."""
        return self.decoder.init_state(self.decoder_memories(encoded, training=False),
                                       encoded["mask"], max_length)

    def decode_step(self, token_ids, step, state):
        """``token_ids`` ``[B]`` at position ``step`` -> (float32 logits ``[B, V]``, state)."""
        return self.decoder.step(token_ids, step, state)

    @property
    def vocab_size(self):
        return self.model_config.vocab_size

    def get_config(self):
        return {"model_config": _model_config_dict(self.model_config),
                "name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        dtype = config.pop("dtype", None)
        if isinstance(dtype, dict):
            dtype = keras.dtype_policies.deserialize(dtype)
        return cls(dtype=dtype, **config)


def build_model(config) -> Seq2SeqModel:
    """Builds (creates the variables of) the model described by ``config.model``.

    Args:
      config: a :class:`deep_nmt_tf.config.Config` (or a ``ModelConfig``) whose
        ``model.vocab_size`` is set.

    Returns:
      A built :class:`Seq2SeqModel`.
    """
    model_config = getattr(config, "model", config)
    model = Seq2SeqModel(model_config, name="seq2seq")
    model.build()
    return model
