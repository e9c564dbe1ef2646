"""The ``model`` section: shared keys, and one option section per encoder/decoder type.

::

    model:
      vocab_size: 0                 # shared by every architecture
      d_model: 512
      encoder:
        type: transformer           # a registered encoder type (ENCODER_TYPES)
        transformer: {num_layers: 6, num_heads: 8, ...}
      decoder:
        type: rnmt_plus             # a registered decoder type (DECODER_TYPES)
        rnmt_plus: {num_layers: 8, units: 1024, ...}

An encoder/decoder type's keys live in its own section, so no key means different things in
different architectures.  The hybrids of Chen et al. 2018 (section 6) are an encoder of one type
with a decoder of another (``encoder.type: transformer`` + ``decoder.type: rnmt_plus``), and the
two combinators ``cascaded`` and ``multi_column``, whose stages/columns are encoder sections
themselves (any registered type).

Option classes may declare what the cross-field rules (``deep_nmt_tf.config.rules``) need to know
about their type without importing the model code:

- ``embedding_kind()``: which token embedding the type builds (``"transformer"``: scaled by
  sqrt(d_model), normal init; ``"rnmt_plus"``: unscaled, uniform init); tying source and target
  embeddings needs the same kind on both sides;
- ``TRANSPARENT_ATTENTION``: whether transparent attention can mix the type's layer outputs;
- ``validate(path, model, fail)``: the type's own cross-field checks.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Tuple

from deep_nmt_tf.config.fields import OneOf, Registry, field

__all__ = [
    "ENCODER_TYPES", "DECODER_TYPES", "EncoderConfig", "DecoderConfig",
    "DLCLOptions", "ResidualScalingOptions", "EncoderShortcutOptions", "DecoderShortcutOptions",
    "TransformerEncoderOptions", "TransformerDecoderOptions",
    "RNMTPlusEncoderOptions", "RNMTPlusDecoderOptions",
    "CascadedEncoderOptions", "MultiColumnEncoderOptions",
    "TransparentAttentionConfig", "ModelConfig",
]

ENCODER_TYPES = Registry("encoder", "model.encoder",
                         "deep_nmt_tf.models.register_encoder(name, options=...)")
DECODER_TYPES = Registry("decoder", "model.decoder",
                         "deep_nmt_tf.models.register_decoder(name, options=...)")


# --------------------------------------------------------------------------------------------
# Transformer stacks (Vaswani et al. 2017) and their deep-network options
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DLCLOptions:
    """Dynamic linear combination of layers (Wang et al. 2019) in one Transformer stack."""
    enabled: bool = field(False, "Each layer's input is a learned combination of all earlier "
                          "outputs.")
    weights: str = field("learnable", "Combination weights: learned, fixed all-one or fixed "
                         "average.", choices=("learnable", "one", "avg"))
    init: str = field("avg", "Initialisation of learnable weights: 1/(l+1) ('avg') or 1 "
                      "('one').", choices=("avg", "one"))
    layer_norm: bool = field(True, "Apply the layer norms of Eq. 8/9 (off: Table 6 ablation).")
    normalize_embedding: bool = field(False, "Also normalise y_0 as Eq. 8/9 literally do "
                                      "(pre-norm: LN(y_0) when stored; post-norm: LN of the "
                                      "first combination); the reference never does. Needs "
                                      "layer_norm.")
    window: int = field(0, "Combine only the last k outputs (0: all).", min=0)
    softmax: bool = field(False, "Softmax-normalise each row of the weight matrix.")


@dataclasses.dataclass
class EncoderShortcutOptions:
    """Lexical shortcuts (Emelin et al. 2019) on the encoder's self-attentions."""
    enabled: bool = field(False, "Gate embedding shortcuts into every self-attention's keys "
                          "and values.")
    variant: str = field("shortcuts", "'shortcuts' (Eq. 5-12) or 'feature_fusion' "
                         "(Eq. 13-14).", choices=("shortcuts", "feature_fusion"))
    source: str = field("lexical", "'lexical': the embeddings; 'non_lexical': layer n-2's "
                        "output (layers 1 and 2: the embeddings).",
                        choices=("lexical", "non_lexical"))


@dataclasses.dataclass
class DecoderShortcutOptions:
    """Lexical shortcuts (Emelin et al. 2019) in the decoder (placements of their Table 4)."""
    enabled: bool = field(False, "Gate embedding shortcuts into attention keys and values.")
    variant: str = field("shortcuts", "'shortcuts' (Eq. 5-12) or 'feature_fusion' "
                         "(Eq. 13-14).", choices=("shortcuts", "feature_fusion"))
    placement: str = field("self", "Which decoder attentions get shortcuts: the "
                           "self-attentions (from the target embeddings), the encoder-decoder "
                           "attentions (from the source embeddings), or both.",
                           choices=("self", "cross", "both"))
    source: str = field("lexical", "'lexical': the embeddings; 'non_lexical': layer n-2's "
                        "output (self-attention placement only).",
                        choices=("lexical", "non_lexical"))


@dataclasses.dataclass
class ResidualScalingOptions:
    """Up-weighted post-norm residuals for deep stacks, ``x_{l+1} = LN(w x_l + G(x_l))``:
    DeepNorm (Wang et al. 2022) or Admin (Liu et al. 2020); see
    ``deep_nmt_tf.layers.deep_residual``.  Defined with post-norm, transparent attention and
    lexical shortcuts; not with pre-norm or DLCL (refused)."""
    method: str = field("none", "'deepnorm': w = alpha, FFN/value/output projections "
                        "initialised scaled by beta; 'admin': w = a learnable per-dimension "
                        "omega; 'none': w = 1.", choices=("none", "deepnorm", "admin"))
    alpha: float = field(0.0, "DeepNorm's residual weight; 0: the paper's formula (encoder "
                         "0.81 (N^4 M)^(1/16), decoder (3M)^(1/4)).", min=0.0)
    beta: float = field(0.0, "DeepNorm's initialisation scale; 0: the paper's formula "
                        "(encoder 0.87 (N^4 M)^(-1/16), decoder (12M)^(-1/4)).", min=0.0)
    omega: float = field(0.0, "Admin's initial omega; 0: sqrt((n+1)/ln(n+1) - 1), n = 2 "
                         "(encoder) or 3 (decoder) residual sub-layers per layer.", min=0.0)


@dataclasses.dataclass
class _TransformerStackOptions:
    """The keys both Transformer stacks have."""
    num_layers: int = field(6, "Number of layers.", min=1)
    num_heads: int = field(8, "Attention heads; must divide model.d_model.", min=1)
    ffn_dim: int = field(2048, "Inner dimension of the feed-forward sub-layers.", min=1)
    norm: str = field("post", "Residual layout: 'post' (LN after the residual) or 'pre' (LN "
                      "before each sub-layer, and a final LN).", choices=("pre", "post"))
    input_dropout: float = field(0.1, "Dropout on the stack's input (embeddings + positions; "
                                 "as a cascade stage, the previous stage's output).",
                                 min=0.0, max=1.0, max_exclusive=True)
    residual_dropout: float = field(0.1, "Dropout on each sub-layer output before the "
                                    "residual.", min=0.0, max=1.0, max_exclusive=True)
    attention_dropout: float = field(0.0, "Dropout on attention probabilities.", min=0.0,
                                     max=1.0, max_exclusive=True)
    relu_dropout: float = field(0.0, "Dropout inside the feed-forward sub-layer.", min=0.0,
                                max=1.0, max_exclusive=True)
    dlcl: DLCLOptions = field(DLCLOptions(), "DLCL (Wang et al. 2019).")
    residual_scaling: ResidualScalingOptions = field(
        ResidualScalingOptions(), "DeepNorm (Wang et al. 2022) / Admin (Liu et al. 2020).")

    def embedding_kind(self) -> str:
        return "transformer"


@dataclasses.dataclass
class TransformerEncoderOptions(_TransformerStackOptions):
    """A Transformer encoder stack (``model.encoder.type: transformer``)."""
    lexical_shortcuts: EncoderShortcutOptions = field(EncoderShortcutOptions(),
                                                      "Lexical shortcuts (Emelin et al. 2019).")

    TRANSPARENT_ATTENTION: ClassVar[bool] = True


@dataclasses.dataclass
class TransformerDecoderOptions(_TransformerStackOptions):
    """A Transformer decoder stack (``model.decoder.type: transformer``)."""
    lexical_shortcuts: DecoderShortcutOptions = field(DecoderShortcutOptions(),
                                                      "Lexical shortcuts (Emelin et al. 2019).")
    tie_softmax: bool = field(True, "Use the target embedding matrix as the softmax weights.")


# --------------------------------------------------------------------------------------------
# RNMT+ (Chen et al. 2018)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _RNMTPlusStackOptions:
    """The keys both RNMT+ stacks have."""
    units: int = field(0, "LSTM units (encoder: per direction, its layer outputs twice as "
                       "wide); 0: model.d_model.", min=0)
    embedding_dropout: float = field(0.1, "Dropout on the embeddings (an encoder as a cascade "
                                     "stage: on the previous stage's output).", min=0.0,
                                     max=1.0, max_exclusive=True)
    dropout: float = field(0.1, "Dropout on each layer's output before it feeds the next "
                           "layer.", min=0.0, max=1.0, max_exclusive=True)
    residual_start: int = field(2, "First layer (0-based) with a residual connection (2: from "
                                "the third layer on, as the paper).", min=1)
    cell_clip: float = field(10.0, "Clip the LSTM cell state to +-cell_clip (0: no clipping).",
                             min=0.0)
    forget_bias: float = field(1.0, "Initial forget-gate bias (part of the per-gate LayerNorm "
                               "offset).")

    def embedding_kind(self) -> str:
        return "rnmt_plus"


@dataclasses.dataclass
class RNMTPlusEncoderOptions(_RNMTPlusStackOptions):
    """An RNMT+ encoder: bidirectional LayerNorm-LSTM layers and a projection to d_model."""
    num_layers: int = field(6, "Bidirectional layers.", min=1)

    TRANSPARENT_ATTENTION: ClassVar[bool] = True


@dataclasses.dataclass
class RNMTPlusDecoderOptions(_RNMTPlusStackOptions):
    """An RNMT+ decoder: LayerNorm-LSTM layers, multi-head additive attention, input feeding
    (layer 0 feeds the attention)."""
    num_layers: int = field(8, "LSTM layers.", min=1)
    attention_heads: int = field(4, "Heads of the multi-head additive attention.", min=1)
    attention_dim: int = field(0, "Additive-attention projection (= context) width (0: the "
                               "units); attention_heads must divide it.", min=0)
    attention_dropout: float = field(0.0, "Dropout on the attention probabilities.", min=0.0,
                                     max=1.0, max_exclusive=True)


ENCODER_TYPES.register("transformer", TransformerEncoderOptions)
ENCODER_TYPES.register("rnmt_plus", RNMTPlusEncoderOptions)
DECODER_TYPES.register("transformer", TransformerDecoderOptions)
DECODER_TYPES.register("rnmt_plus", RNMTPlusDecoderOptions)


# --------------------------------------------------------------------------------------------
# The one-of sections, and the combinators whose parts are encoder sections themselves
# --------------------------------------------------------------------------------------------


class EncoderConfig(OneOf):
    """``model.encoder``: ``type`` and one option section per registered encoder type."""
    registry = ENCODER_TYPES
    default_type = "transformer"


class DecoderConfig(OneOf):
    """``model.decoder``: ``type`` and one option section per registered decoder type."""
    registry = DECODER_TYPES
    default_type = "transformer"


def _stages():
    return (EncoderConfig("rnmt_plus"),
            EncoderConfig("transformer", transformer=TransformerEncoderOptions(
                num_layers=4, input_dropout=0.0)))


@dataclasses.dataclass
class CascadedEncoderOptions:
    """Cascaded encoder (Chen et al. section 6.2): each stage encodes the layer-normalised
    output of the one before (stage 0 reads the tokens); the paper's is RNMT+ then 4
    Transformer layers (without positions: a later stage takes features, not tokens)."""
    stages: Tuple[EncoderConfig, ...] = field(_stages(), "The stages, bottom first: a list of "
                                              "encoder sections ({type: ..., <type>: {...}}).")

    TRANSPARENT_ATTENTION: ClassVar[bool] = False

    def embedding_kind(self) -> str:
        return self.stages[0].get().embedding_kind() if self.stages else None


def _columns():
    return (EncoderConfig("rnmt_plus"), EncoderConfig("transformer"))


@dataclasses.dataclass
class MultiColumnEncoderOptions:
    """Multi-column encoder (Chen et al. section 6.2): every column reads the source; their
    layer-normalised outputs are concatenated and projected (layer-normalised) to d_model."""
    columns: Tuple[EncoderConfig, ...] = field(_columns(), "The columns: a list of encoder "
                                               "sections ({type: ..., <type>: {...}}); column 0 "
                                               "uses the model's source embedding.")

    TRANSPARENT_ATTENTION: ClassVar[bool] = False

    def embedding_kind(self) -> str:
        return self.columns[0].get().embedding_kind() if self.columns else None


ENCODER_TYPES.register("cascaded", CascadedEncoderOptions)
ENCODER_TYPES.register("multi_column", MultiColumnEncoderOptions)


# --------------------------------------------------------------------------------------------
# The model section
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TransparentAttentionConfig:
    """Transparent attention (Bapna et al. 2018): the decoder attends softmax-mixed encoder
    layers (embeddings = layer 0)."""
    enabled: bool = field(False, "Attend a learned softmax mix of all encoder layer outputs.")
    weight_dropout: float = field(0.1, "Dropout on the (N+1)xM mix logits before the softmax.",
                                  min=0.0, max=1.0, max_exclusive=True)
    min_probability: float = field(0.0, "Optional floor p on each source's mix probability: "
                                   "s = p + (1 - (N+1) p) softmax(W); needs (N+1) p <= 1.",
                                   min=0.0, max=1.0)


@dataclasses.dataclass
class ModelConfig:
    """The model: shared keys, the encoder and the decoder (docs/CONFIG.md lists every key)."""
    vocab_size: int = field(0, "Vocabulary size; 0 = read from the vocabulary file.", min=0)
    d_model: int = field(512, "Model width: token embeddings and the encoder output the "
                         "decoder attends (the Transformer stacks' width; RNMT+ units "
                         "default to it).", min=1)
    layer_norm_epsilon: float = field(1e-6, "Epsilon of every LayerNorm (Transformer layers, "
                                      "LayerNorm-LSTM gates, hybrid merges).", min=0.0,
                                      min_exclusive=True)
    tie_source_target_embeddings: bool = field(True, "Share the source and target embedding "
                                               "matrix (both sides must build the same kind "
                                               "of embedding).")
    encoder: EncoderConfig = field(EncoderConfig(), "The encoder: type and options.")
    decoder: DecoderConfig = field(DecoderConfig(), "The decoder: type and options.")
    transparent_attention: TransparentAttentionConfig = field(
        TransparentAttentionConfig(), "Transparent attention between encoder and decoder.")
