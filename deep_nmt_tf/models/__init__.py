"""Encoders, decoders and the encoder-decoder model (pure Keras 3).

Importing this package imports every module in it, so that each encoder/decoder type registers
itself (:func:`register_encoder` / :func:`register_decoder`, :mod:`deep_nmt_tf.models.base`): a
new type is one new module here, with its options dataclass beside its class.
"""

import importlib
import pkgutil

from deep_nmt_tf.models.base import (Decoder, Encoder, build_encoder, decoder_class,
                                     encoder_class, register_decoder, register_encoder)
from deep_nmt_tf.models.hybrid import CascadedEncoder, MultiColumnEncoder
from deep_nmt_tf.models.rnmt import RNMTPlusDecoder, RNMTPlusEncoder
from deep_nmt_tf.models.seq2seq import Seq2SeqModel, build_model
from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Seq2SeqModel", "build_model", "Encoder", "Decoder", "register_encoder",
           "register_decoder", "encoder_class", "decoder_class", "build_encoder",
           "TransformerEncoder", "TransformerDecoder", "RNMTPlusEncoder", "RNMTPlusDecoder",
           "CascadedEncoder", "MultiColumnEncoder"]
