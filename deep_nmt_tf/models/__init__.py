"""Encoder/decoder stacks and full models (pure Keras 3)."""

from deep_nmt_tf.models.hybrid import CascadedEncoder, MultiColumnEncoder
from deep_nmt_tf.models.rnmt import RNMTPlusDecoder, RNMTPlusEncoder
from deep_nmt_tf.models.seq2seq import Seq2SeqModel, build_model
from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder

__all__ = ["Seq2SeqModel", "build_model", "TransformerEncoder", "TransformerDecoder",
           "RNMTPlusEncoder", "RNMTPlusDecoder", "CascadedEncoder", "MultiColumnEncoder"]
