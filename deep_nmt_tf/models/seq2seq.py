"""The encoder-decoder model, built from the ``model`` config section.

``model.encoder.type`` and ``model.decoder.type`` name registered classes
(:mod:`deep_nmt_tf.models.base`); importing :mod:`deep_nmt_tf.models` registers the package's
own (``transformer``, ``rnmt_plus``, ``cascaded``, ``multi_column``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

import keras
from keras import ops

from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.layers.transparent_attention import TransparentAttention
from deep_nmt_tf.models.base import build_encoder, decoder_class, encoder_class

__all__ = ["Seq2SeqModel", "build_model", "INFERENCE_POLICIES"]


def _model_config_dict(model_config) -> Dict[str, Any]:
    from deep_nmt_tf.config import config_to_dict

    if dataclasses.is_dataclass(model_config):
        return config_to_dict(model_config)
    return dict(model_config)


def _model_config(config_dict):
    from deep_nmt_tf.config import config_from_dict

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

    Teacher forcing from an ``encoded`` dict: ``model.decode(encoded, target_input_ids,
    training)`` (``call`` is ``decode(encode(...))``); the grad-norm-ratio diagnostic
    differentiates the loss with respect to ``encoded["layer_outputs"][1]`` and ``[-1]``.

    ``model.encoder.type`` / ``model.decoder.type`` pick registered encoder and decoder
    classes (:mod:`deep_nmt_tf.models.base`; ``transformer``: Vaswani et al.; ``rnmt_plus``:
    Chen et al. 2018; the ``cascaded`` and ``multi_column`` combinators of its section 6); any
    encoder works with any decoder.  The source embedding is the encoder type's; the target
    side shares it (``model.tie_source_target_embeddings``) or builds the decoder type's.

    Transparent attention (``model.transparent_attention``, off by default): the decoder's M
    encoder-decoder attentions attend M learned mixes of the encoder's embedding and layer
    outputs, computed once per source in :meth:`decoder_memories` (M = the Transformer
    decoder's depth, 1 for RNMT+, whose encoder projection is applied to the mix).  DLCL and
    lexical shortcuts are options of the Transformer stacks.  Any combination builds and
    decodes incrementally.

    Diagnostics: :meth:`diagnostic_weights` (transparent and DLCL weight matrices) and
    :meth:`lexical_shortcut_gates` (mean gate per layer on a batch).

    Args:
      model_config: a :class:`deep_nmt_tf.config.ModelConfig` or its dict form; ``vocab_size``
        must be set (> 0).

    Example:
      >>> from deep_nmt_tf.config import config_from_dict
      >>> cfg = config_from_dict({"model": {"vocab_size": 100, "d_model": 16, "encoder": {
      ...     "transformer": {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}}}})
      >>> model = Seq2SeqModel(cfg.model)
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
        source_embedding = encoder_class(cfg.encoder.type).make_embedding(
            cfg.encoder.get(), cfg, policy, "source_embedding")
        self.encoder = build_encoder(cfg.encoder, cfg, policy, "encoder",
                                     embedding=source_embedding)
        decoder_cls, decoder_options = decoder_class(cfg.decoder.type), cfg.decoder.get()
        target_embedding = (source_embedding if cfg.tie_source_target_embeddings else
                            decoder_cls.make_embedding(decoder_options, cfg, policy,
                                                       "target_embedding"))
        self.decoder = decoder_cls.from_options(decoder_options, cfg, target_embedding,
                                                self.encoder.output_dim, policy, "decoder")
        self.transparent_attention = None
        ta = cfg.transparent_attention
        if ta.enabled:
            # Sources: the encoder's (default: embedding + N layer outputs); M = the decoder's
            # number of encoder-decoder attention modules (its depth; 1 for RNMT+).
            self.transparent_attention = TransparentAttention(
                num_sources=self.encoder.num_transparent_sources,
                num_outputs=self.decoder.num_attention_modules,
                weight_dropout=ta.weight_dropout, min_probability=ta.min_probability,
                dtype=policy, name="transparent_attention")

    def build(self, input_shape=None):
        if self.built:
            return
        self.encoder.build((None, None))
        self.decoder.build((None, None))
        if self.transparent_attention is not None:
            self.transparent_attention.build()
        self.built = True

    # -- teacher forcing -----------------------------------------------------------------
    def decoder_memories(self, encoded, training=None):
        """Memory the decoder attends to: ``encoded["memory"]``, or with transparent attention
        the stacked ``[M, B, S, D]`` mixes of ``encoded["layer_outputs"]`` (one per decoder
        layer of the Transformer, M = 1 for RNMT+; the same structure in training and
        inference).

        With transparent attention the mixes replace the encoder output: the sources are the
        raw outputs (Bapna et al.; Lingvo's pre-norm stack has no final LayerNorm), so the
        encoder's own output path (a pre-norm stack's final LayerNorm, DLCL's last row) is
        still computed into ``encoded["memory"]`` but receives no gradient from the loss.
        """
        if self.transparent_attention is None:
            return encoded["memory"]
        sources = self.encoder.transparent_sources(encoded["layer_outputs"])
        mixes = self.transparent_attention(sources, training=training)
        # RNMT+: the encoder's final projection applies to the mix (Bapna et al. 2018).
        return self.encoder.project_memory(mixes)

    def _memory_embeddings(self, encoded):
        return encoded["layer_outputs"][0] if self.decoder.uses_memory_embeddings else None

    def decode(self, encoded, target_input_ids, training=None, return_gates=False,
               return_layer_outputs=False):
        """Teacher-forced float32 logits ``[B, T, V]`` from an ``encode`` result.

        ``return_gates`` / ``return_layer_outputs``: passed to the decoder, which then returns
        a tuple (``return_layer_outputs``: Transformer decoders only; see
        :class:`~deep_nmt_tf.models.transformer.TransformerDecoder`).
        """
        extra = {"return_layer_outputs": True} if return_layer_outputs else {}
        return self.decoder(target_input_ids, self.decoder_memories(encoded, training=training),
                            encoded["mask"], training=training,
                            memory_embeddings=self._memory_embeddings(encoded),
                            return_gates=return_gates, **extra)

    def call(self, inputs, training=None):
        encoded = self.encode(inputs["source_ids"], training=training)
        return self.decode(encoded, inputs["target_input_ids"], training=training)

    # -- decoding interface ---------------------------------------------------------------
    def encode(self, source_ids, training=False):
        """Runs the encoder: dict with ``memory``, ``mask`` and ``layer_outputs``."""
        return self.encoder(source_ids, training=training)

    def init_decoder_state(self, encoded, max_length):
        """Decoder state (memory keys/values computed once, empty self-attention caches)."""
        return self.decoder.init_state(self.decoder_memories(encoded, training=False),
                                       encoded["mask"], max_length,
                                       memory_embeddings=self._memory_embeddings(encoded))

    def decode_step(self, token_ids, step, state):
        """``token_ids`` ``[B]`` at position ``step`` -> (float32 logits ``[B, V]``, state)."""
        return self.decoder.step(token_ids, step, state)

    def state_reorder_flags(self, state):
        """Which decoder-state leaves beam search reorders (the decoder declares them:
        :meth:`~deep_nmt_tf.models.base.Decoder.state_reorder_flags`)."""
        return self.decoder.state_reorder_flags(state)

    # -- diagnostics -----------------------------------------------------------------------
    def diagnostic_weights(self):
        """Learned mixing matrices as float32 tensors (inference values, no dropout):

        - ``"transparent_attention"``: ``[sources, M]`` softmax-normalised mix, Bapna et al.
          Fig. 4: for the Transformer ``[N+1, M]`` (rows: embedding and encoder layers 1..N;
          columns: decoder layers); for RNMT+ ``M = 1`` and the embedding row only when the
          embedding is as wide as a layer output (``E == 2U``; see
          :class:`~deep_nmt_tf.models.rnmt.RNMTPlusEncoder`);
        - ``"encoder_dlcl"`` / ``"decoder_dlcl"``: ``[L+1, L+1]`` effective DLCL weights (row l
          feeds layer l+1, row L the stack output; masked entries are 0), Wang et al. Fig. 5.

        Only the enabled methods appear.  ``keras.ops.convert_to_numpy`` gives arrays.
        """
        out = {}
        if self.transparent_attention is not None:
            out["transparent_attention"] = self.transparent_attention.mix_weights(training=False)
        for stack in (self.encoder, self.decoder):
            for name, value in stack.diagnostic_weights().items():
                out[f"{stack.name}_{name}"] = value
        return out

    def lexical_shortcut_gates(self, inputs, training=False):
        """Mean lexical-shortcut gate per layer and attention on a batch (Emelin et al.).

        Args:
          inputs: ``{"source_ids", "target_input_ids"}`` as for ``call``.

        Returns:
          dict ``"encoder/layer_3/self/key" -> scalar`` float32 tensor (also ``.../value``;
          decoder layers also ``.../cross/...`` with cross-attention shortcuts): the gate
          ``r`` averaged over the channels and the non-padding positions of the batch (source
          positions for encoder self-attention and cross-attention, target positions for
          decoder self-attention).  Empty without lexical shortcuts; the hybrid encoders
          (cascaded, multi-column) report no encoder gates, even where a Transformer part has
          shortcuts.
        """
        source_ids, target_ids = inputs["source_ids"], inputs["target_input_ids"]
        encoded = self.encoder(source_ids, training=training, return_gates=True)
        _, dec_gates = self.decode(encoded, target_ids, training=training, return_gates=True)
        masks = {"source": ops.cast(ops.not_equal(source_ids, PAD_ID), "float32"),
                 "target": ops.cast(ops.not_equal(target_ids, PAD_ID), "float32")}

        def masked_mean(gate, mask):
            gate = ops.mean(ops.cast(gate, "float32"), axis=-1)
            return ops.sum(gate * mask) / ops.maximum(ops.sum(mask), 1.0)

        out = {}
        for stack, gates in (("encoder", encoded["gates"]), ("decoder", dec_gates)):
            for i, layer_gates in enumerate(gates):
                for kind, (gk, gv) in layer_gates.items():
                    positions = "target" if (stack, kind) == ("decoder", "self") else "source"
                    prefix = f"{stack}/layer_{i}/{kind}"
                    out[f"{prefix}/key"] = masked_mean(gk, masks[positions])
                    out[f"{prefix}/value"] = masked_mean(gv, masks[positions])
        return out

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


#: Inference precisions (``--precision`` of the tools) -> Keras dtype policies.  Inference
#: uses plain half-precision policies: the variables themselves are bfloat16/float16 (half the
#: memory traffic, no casts in the decoding loop); softmax, LayerNorm statistics, the mixing
#: weights and the logits are still computed in float32.
INFERENCE_POLICIES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def build_model(config, dtype="float32") -> Seq2SeqModel:
    """Builds (creates the variables of) the model described by ``config.model``.

    Args:
      config: a :class:`deep_nmt_tf.config.Config` (or a ``ModelConfig``) whose
        ``model.vocab_size`` is set.
      dtype: the Keras dtype policy (name or ``keras.DTypePolicy``): ``float32``, the training
        policies ``mixed_bfloat16`` / ``mixed_float16`` (``training.precision``: float32
        variables) or the inference policies ``bfloat16`` / ``float16`` (half-precision
        variables; :data:`INFERENCE_POLICIES`).  Whatever the policy, the model's logits are
        float32.

    Returns:
      A built :class:`Seq2SeqModel`.
    """
    model_config = getattr(config, "model", config)
    model = Seq2SeqModel(model_config, name="seq2seq", dtype=dtype)
    model.build()
    return model
