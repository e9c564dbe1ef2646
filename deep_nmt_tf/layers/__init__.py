"""Keras 3 layers of deep_nmt_tf (``keras.ops`` only: TensorFlow and JAX backends).

Every layer is registered serializable under the package name ``deep_nmt_tf``.
"""

from deep_nmt_tf.layers.additive_attention import MultiHeadAdditiveAttention
from deep_nmt_tf.layers.attention import (MultiHeadAttention, causal_bias, padding_bias,
                                          step_bias)
from deep_nmt_tf.layers.deep_residual import (BlockScaled, admin_omega, deepnorm_constants,
                                              resolve_deep_residual)
from deep_nmt_tf.layers.dlcl import DLCLHistory, DynamicLinearCombination
from deep_nmt_tf.layers.embedding import (SinusoidalPositionEncoding, TokenEmbedding,
                                          sinusoidal_table)
from deep_nmt_tf.layers.lexical_shortcuts import LexicalShortcut
from deep_nmt_tf.layers.lstm import (BidirectionalLayerNormLSTM, LayerNormLSTM,
                                     LayerNormLSTMCell)
from deep_nmt_tf.layers.normalization import LayerNorm
from deep_nmt_tf.layers.transformer import (FeedForward, Residual, TransformerDecoderLayer,
                                            TransformerEncoderLayer)
from deep_nmt_tf.layers.transparent_attention import TransparentAttention

__all__ = [
    "MultiHeadAttention",
    "causal_bias",
    "padding_bias",
    "step_bias",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "sinusoidal_table",
    "FeedForward",
    "LayerNorm",
    "Residual",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "LayerNormLSTMCell",
    "LayerNormLSTM",
    "BidirectionalLayerNormLSTM",
    "MultiHeadAdditiveAttention",
    # the deep-encoder methods: Bapna et al., Wang et al., Emelin et al.
    "TransparentAttention",
    "DynamicLinearCombination",
    "DLCLHistory",
    "LexicalShortcut",
    # the later deep stabilisers: DeepNorm (Wang et al. 2022), Admin (Liu et al. 2020)
    "deepnorm_constants",
    "admin_omega",
    "resolve_deep_residual",
    "BlockScaled",
]
