"""The encoder-decoder model and its factory from the typed config."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict

import keras
from keras import ops

from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.layers.embedding import TokenEmbedding
from deep_nmt_tf.layers.transparent_attention import TransparentAttention
from deep_nmt_tf.models.hybrid import CascadedEncoder, MultiColumnEncoder
from deep_nmt_tf.models.rnmt import RNMTPlusDecoder, RNMTPlusEncoder, rnmt_embedding
from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder

__all__ = ["Seq2SeqModel", "build_model", "EMBEDDING_BUILDERS", "ENCODER_BUILDERS",
           "DECODER_BUILDERS", "register_component"]


def _model_config_dict(model_config) -> Dict[str, Any]:
    from deep_nmt_tf.config import config_to_dict

    if dataclasses.is_dataclass(model_config):
        return config_to_dict(model_config)
    return dict(model_config)


def _model_config(config_dict):
    from deep_nmt_tf.config import ModelConfig, config_from_dict

    return config_from_dict({"model": config_dict, "data": {"corpus": "synthetic"}},
                            source="<model config>").model


# --------------------------------------------------------------------------------------------
# Component factories, keyed by component type.  ``model.architecture`` names an (encoder
# type, decoder type) pair (``deep_nmt_tf.config.ARCHITECTURES``); Seq2SeqModel builds the source
# embedding with the encoder type's embedding builder, the target embedding (unless tied) with
# the decoder type's, then the encoder and the decoder.  Any registered encoder works with any
# registered decoder: encoders return ``{"memory" [B, S, d_model], "mask", "layer_outputs"}``
# and decoders attend a ``memory_dim``-wide memory.  Optional encoder hooks for transparent
# attention: ``num_transparent_sources``, ``transparent_sources(layer_outputs)`` (default: all
# layer outputs) and ``project_memory(mix)`` (default: none); decoders declare
# ``num_attention_modules`` (M; default: their number of layers).
# --------------------------------------------------------------------------------------------

#: type -> ``builder(model_config, dtype_policy, name) -> TokenEmbedding``.
EMBEDDING_BUILDERS: Dict[str, Callable] = {}
#: type -> ``builder(model_config, embedding, dtype_policy, name="encoder") -> encoder layer``.
ENCODER_BUILDERS: Dict[str, Callable] = {}
#: type -> ``builder(model_config, embedding, dtype_policy, memory_dim) -> decoder layer``.
DECODER_BUILDERS: Dict[str, Callable] = {}
_REGISTRIES = {"embedding": EMBEDDING_BUILDERS, "encoder": ENCODER_BUILDERS,
               "decoder": DECODER_BUILDERS}


def register_component(kind: str, name: str):
    """Decorator registering a builder: ``kind`` is embedding, encoder or decoder."""
    registry = _REGISTRIES[kind]

    def wrap(builder):
        if name in registry:
            raise ValueError(f"{kind} type {name!r} is already registered")
        registry[name] = builder
        return builder

    return wrap


@register_component("embedding", "transformer")
def _transformer_embedding(cfg, policy, name):
    return TokenEmbedding(cfg.vocab_size, cfg.d_model, dtype=policy, name=name)


def _transformer_options(cfg, policy):
    common = dict(d_model=cfg.d_model, num_heads=cfg.num_heads, ffn_dim=cfg.ffn_dim,
                  norm=cfg.norm, input_dropout=cfg.input_dropout,
                  residual_dropout=cfg.residual_dropout, attention_dropout=cfg.attention_dropout,
                  relu_dropout=cfg.relu_dropout, layer_norm_epsilon=cfg.layer_norm_epsilon,
                  dtype=policy)
    dl = cfg.dlcl
    dlcl = dict(weights=dl.weights, init=dl.init, layer_norm=dl.layer_norm,
                normalize_embedding=dl.normalize_embedding, window=dl.window,
                softmax=dl.softmax)
    lex = cfg.lexical_shortcuts
    self_shortcuts = cross_shortcuts = None
    if lex.enabled:
        if lex.placement in ("self", "both"):
            self_shortcuts = dict(variant=lex.variant, source=lex.source)
        if lex.placement in ("cross", "both"):
            if lex.source != "lexical":
                raise ValueError("model.lexical_shortcuts.source 'non_lexical' is defined "
                                 "for self-attention shortcuts only (placement: self)")
            cross_shortcuts = lex.variant
    return common, dlcl, self_shortcuts, cross_shortcuts


@register_component("encoder", "transformer")
def _transformer_encoder(cfg, embedding, policy, name="encoder"):
    common, dlcl, self_shortcuts, _ = _transformer_options(cfg, policy)
    return TransformerEncoder(embedding, cfg.encoder_layers, name=name,
                              dlcl=dlcl if cfg.dlcl.encoder else None,
                              shortcuts=self_shortcuts, **common)


@register_component("decoder", "transformer")
def _transformer_decoder(cfg, embedding, policy, memory_dim):
    common, dlcl, self_shortcuts, cross_shortcuts = _transformer_options(cfg, policy)
    return TransformerDecoder(embedding, cfg.decoder_layers, name="decoder",
                              tie_softmax=cfg.tie_softmax_embeddings, memory_dim=memory_dim,
                              dlcl=dlcl if cfg.dlcl.decoder else None,
                              shortcuts=self_shortcuts, cross_shortcuts=cross_shortcuts,
                              **common)


@register_component("embedding", "rnmt_plus")
def _rnmt_embedding(cfg, policy, name):
    return rnmt_embedding(cfg.vocab_size, cfg.d_model, dtype=policy, name=name)


def _rnmt_cell_options(cfg):
    r = cfg.rnmt
    return dict(residual_start=r.residual_start, cell_clip=r.cell_clip,
                forget_bias=r.forget_bias, layer_norm_epsilon=cfg.layer_norm_epsilon)


@register_component("encoder", "rnmt_plus")
def _rnmt_encoder(cfg, embedding, policy, name="encoder"):
    return RNMTPlusEncoder(embedding, cfg.encoder_layers, units=cfg.rnmt.encoder_units or
                           cfg.d_model, output_dim=cfg.d_model, dropout=cfg.residual_dropout,
                           embedding_dropout=cfg.input_dropout, dtype=policy, name=name,
                           **_rnmt_cell_options(cfg))


# Hybrid encoders (Chen et al. 2018 section 6; deep_nmt_tf.models.hybrid).  The cascade's source
# embedding is the RNMT+ one; a multi-column encoder's is its first column's (the other columns
# build their own).
@register_component("embedding", "cascaded")
def _cascaded_embedding(cfg, policy, name):
    return _rnmt_embedding(cfg, policy, name)


@register_component("encoder", "cascaded")
def _cascaded_encoder(cfg, embedding, policy, name="encoder"):
    rnmt = _rnmt_encoder(cfg, embedding, policy, name="rnmt")
    return CascadedEncoder(rnmt, cfg.hybrid.cascade_layers, num_heads=cfg.num_heads,
                           ffn_dim=cfg.ffn_dim, norm=cfg.norm,
                           residual_dropout=cfg.residual_dropout,
                           attention_dropout=cfg.attention_dropout,
                           relu_dropout=cfg.relu_dropout,
                           layer_norm_epsilon=cfg.layer_norm_epsilon, dtype=policy, name=name)


@register_component("embedding", "multi_column")
def _multi_column_embedding(cfg, policy, name):
    return _builder(EMBEDDING_BUILDERS, "embedding", cfg.hybrid.columns[0])(cfg, policy, name)


@register_component("encoder", "multi_column")
def _multi_column_encoder(cfg, embedding, policy, name="encoder"):
    columns = []
    for i, kind in enumerate(cfg.hybrid.columns):
        if i:
            embedding = _builder(EMBEDDING_BUILDERS, "embedding", kind)(
                cfg, policy, f"column_{i}_embedding")
        columns.append(_builder(ENCODER_BUILDERS, "encoder", kind)(
            cfg, embedding, policy, name=f"column_{i}"))
    return MultiColumnEncoder(columns, output_dim=cfg.d_model,
                              layer_norm_epsilon=cfg.layer_norm_epsilon, dtype=policy,
                              name=name)


@register_component("decoder", "rnmt_plus")
def _rnmt_decoder(cfg, embedding, policy, memory_dim):
    if cfg.tie_softmax_embeddings:
        raise ValueError("model.tie_softmax_embeddings: the RNMT+ softmax reads [decoder "
                         "output; attention context], not an embedding-sized vector: set it "
                         "to false")
    r = cfg.rnmt
    units = r.decoder_units or cfg.d_model
    return RNMTPlusDecoder(embedding, cfg.decoder_layers, units=units,
                           attention_heads=r.attention_heads,
                           attention_dim=r.attention_dim or units, memory_dim=memory_dim,
                           dropout=cfg.residual_dropout, embedding_dropout=cfg.input_dropout,
                           attention_dropout=cfg.attention_dropout, dtype=policy,
                           name="decoder", **_rnmt_cell_options(cfg))


def _builder(registry, kind, name):
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"no {kind} of type {name!r} (known: {', '.join(sorted(registry))})"
                         ) from None


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

    ``model.architecture`` picks the encoder and decoder types (``transformer``: Vaswani et
    al.; ``rnmt_plus``: Chen et al. 2018, :mod:`deep_nmt_tf.models.rnmt`); each is built by
    its factory (``ENCODER_BUILDERS`` / ``DECODER_BUILDERS`` / ``EMBEDDING_BUILDERS``).

    Deep-network options of the ``model`` config (each off by default): transparent attention
    (the decoder's M encoder-decoder attentions attend M learned mixes of the encoder's
    embedding and layer outputs, computed once per source in :meth:`decoder_memories`; M =
    ``decoder_layers`` for the Transformer, 1 for RNMT+, whose encoder projection is applied
    to the mix), DLCL in the encoder and/or decoder, and lexical shortcuts
    (self-attentions, encoder-decoder attentions or both; plain or feature fusion; lexical or
    non-lexical source).  Any combination builds and decodes incrementally.

    Diagnostics: :meth:`diagnostic_weights` (transparent and DLCL weight matrices) and
    :meth:`lexical_shortcut_gates` (mean gate per layer on a batch).

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
        from deep_nmt_tf.config import model_components

        encoder_type, decoder_type = model_components(cfg)
        source_embedding = _builder(EMBEDDING_BUILDERS, "embedding", encoder_type)(
            cfg, policy, "source_embedding")
        target_embedding = (source_embedding if cfg.tie_source_target_embeddings else
                            _builder(EMBEDDING_BUILDERS, "embedding", decoder_type)(
                                cfg, policy, "target_embedding"))
        self.encoder = _builder(ENCODER_BUILDERS, "encoder", encoder_type)(
            cfg, source_embedding, policy)
        self.decoder = _builder(DECODER_BUILDERS, "decoder", decoder_type)(
            cfg, target_embedding, policy, getattr(self.encoder, "d_model", cfg.d_model))
        self.transparent_attention = None
        ta = cfg.transparent_attention
        if ta.enabled:
            # Sources: the encoder's (default: embedding + N layer outputs); M = the decoder's
            # number of encoder-decoder attention modules (its depth; 1 for RNMT+).
            self.transparent_attention = TransparentAttention(
                num_sources=getattr(self.encoder, "num_transparent_sources",
                                    cfg.encoder_layers + 1),
                num_outputs=getattr(self.decoder, "num_attention_modules", None) or len(
                    self.decoder.layers_),
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
        layer; the same structure in training and inference).

        With transparent attention the mixes replace the encoder output: the sources are the
        raw outputs (Bapna et al.; Lingvo's pre-norm stack has no final LayerNorm), so the
        encoder's own output path (a pre-norm stack's final LayerNorm, DLCL's last row) is
        still computed into ``encoded["memory"]`` but receives no gradient from the loss.
        """
        if self.transparent_attention is None:
            return encoded["memory"]
        sources = encoded["layer_outputs"]
        select = getattr(self.encoder, "transparent_sources", None)
        if select is not None:
            sources = select(sources)
        mixes = self.transparent_attention(sources, training=training)
        # RNMT+: the encoder's final projection applies to the mix (Bapna et al. 2018).
        project = getattr(self.encoder, "project_memory", None)
        return mixes if project is None else project(mixes)

    def _memory_embeddings(self, encoded):
        if self.decoder.cross_shortcuts is None:
            return None
        return encoded["layer_outputs"][0]

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

    # -- diagnostics -----------------------------------------------------------------------
    def diagnostic_weights(self):
        """Learned mixing matrices as float32 tensors (inference values, no dropout):

        - ``"transparent_attention"``: ``[N+1, M]`` softmax-normalised mix (rows: embedding
          and encoder layers 1..N; columns: decoder layers), Bapna et al. Fig. 4;
        - ``"encoder_dlcl"`` / ``"decoder_dlcl"``: ``[L+1, L+1]`` effective DLCL weights (row l
          feeds layer l+1, row L the stack output; masked entries are 0), Wang et al. Fig. 5.

        Only the enabled methods appear.  ``keras.ops.convert_to_numpy`` gives arrays.
        """
        out = {}
        if self.transparent_attention is not None:
            out["transparent_attention"] = self.transparent_attention.mix_weights(training=False)
        if self.encoder.dlcl is not None:
            out["encoder_dlcl"] = self.encoder.dlcl.weight_matrix()
        if self.decoder.dlcl is not None:
            out["decoder_dlcl"] = self.decoder.dlcl.weight_matrix()
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
          decoder self-attention).  Empty without lexical shortcuts.
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
