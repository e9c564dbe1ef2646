"""The encoder and decoder contracts, and the registries that map config types to classes.

A :class:`~deep_nmt_tf.models.Seq2SeqModel` is built from ``model.encoder.type`` and
``model.decoder.type`` (:mod:`deep_nmt_tf.config.model_schema`): each names a class registered
here with :func:`register_encoder` / :func:`register_decoder`, next to its options dataclass.
Any registered encoder works with any registered decoder; the model, the trainer, the search
and the exporter talk to them only through the methods below.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` the memory width
(:attr:`Encoder.output_dim`), ``V`` the vocabulary.  Ids are int32, padded with ``PAD_ID`` (0).

Adding an encoder type (``docs/DESIGN.md`` walks through the example of
``tests/test_extending.py``)::

    @dataclasses.dataclass
    class ConvEncoderOptions:                     # its section: model.encoder.conv
        num_layers: int = field(2, "Convolution layers.", min=1)

    @register_encoder("conv", options=ConvEncoderOptions)
    class ConvEncoder(Encoder):
        @classmethod
        def from_options(cls, options, model, embedding, dtype, name):
            return cls(embedding, options.num_layers, dtype=dtype, name=name)
        ...                                       # build / call / output_dim

    cfg = load_config(overrides=["model.encoder.type=conv"])   # after the registration
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, List, Optional

import keras

from deep_nmt_tf.config import DECODER_TYPES, ENCODER_TYPES
from deep_nmt_tf.layers.embedding import TokenEmbedding

__all__ = ["Encoder", "Decoder", "register_encoder", "register_decoder", "encoder_class",
           "decoder_class", "ENCODERS", "DECODERS", "build_encoder"]

#: Registered encoder/decoder classes by config type name.
ENCODERS: Dict[str, type] = {}
DECODERS: Dict[str, type] = {}


class Encoder(keras.layers.Layer):
    """Base class of the encoders: source ids in, a dict of tensors out.

    ``call(source_ids, training=None, return_gates=False)`` with int ``[B, S]`` ids returns:

    - ``"memory"``: ``[B, S, D]``, what the decoder attends to (``D`` = :attr:`output_dim`);
    - ``"mask"``: bool ``[B, S]``, True at real tokens;
    - ``"layer_outputs"``: a list of ``[B, S, *]`` tensors, the embedding output (layer 0) and
      each layer's output.  Transparent attention mixes them (:meth:`transparent_sources`), the
      grad-norm ratio differentiates the loss with respect to ``[1]`` and ``[-1]``, and the
      layer probe compares them with ``[0]``;
    - with ``return_gates=True`` also ``"gates"``: one dict per layer of lexical-shortcut gates
      (``{"self": (key_gate, value_gate)}``; empty dicts when the encoder has none; the hybrid
      encoders return an empty list: their parts' gates are not collected).

    Subclasses implement :meth:`from_options`, ``build``, ``call`` and :attr:`output_dim`; the
    other methods have defaults.
    """

    #: Options dataclass of the type (set by :func:`register_encoder`).
    options_class: ClassVar[Optional[type]] = None

    @classmethod
    def make_embedding(cls, options, model, dtype, name: str) -> TokenEmbedding:
        """The token embedding this encoder type reads (default: the Transformer's, scaled by
        sqrt(d_model)); ``model`` is the ``ModelConfig`` (``vocab_size``, ``d_model``)."""
        return TokenEmbedding(model.vocab_size, model.d_model, dtype=dtype, name=name)

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name: str) -> "Encoder":
        """Builds the encoder from its options section, the ``ModelConfig`` and the embedding
        (:meth:`make_embedding`'s, or the target side's when tied; None for an encoder that
        reads ``model.d_model``-wide features through :meth:`call_features` only)."""
        raise NotImplementedError(f"{cls.__name__}.from_options")

    @property
    def output_dim(self) -> int:
        """Width ``D`` of ``memory``."""
        raise NotImplementedError(f"{type(self).__name__}.output_dim")

    def call_features(self, features, mask, training=None, return_gates=False) -> Dict[str, Any]:
        """Encodes ``[B, S, F]`` features instead of token ids (a later stage of a cascade):
        the same dict as ``call``, whose ``layer_outputs[0]`` is the (dropped-out) input.
        Types that cannot do this keep the default (the cascade rejects them)."""
        raise NotImplementedError(f"the {type(self).__name__} cannot be a later stage of a "
                                  "cascaded encoder (it has no call_features)")

    # -- transparent attention (Bapna et al. 2018) -------------------------------------------
    @property
    def num_transparent_sources(self) -> int:
        """How many tensors :meth:`transparent_sources` returns (default: the N layers of
        ``self.layers_`` + the embedding output)."""
        return len(_layers(self, "num_transparent_sources")) + 1

    def transparent_sources(self, layer_outputs: List) -> List:
        """The tensors transparent attention mixes (default: all of ``layer_outputs``)."""
        return list(layer_outputs)

    def project_memory(self, mixes):
        """Maps the ``[M, B, S, *]`` transparent mixes to the memory width (default: as they
        are)."""
        return mixes

    # -- diagnostics ----------------------------------------------------------------------
    def diagnostic_weights(self) -> Dict[str, Any]:
        """Learned mixing matrices by name (e.g. ``{"dlcl": [L+1, L+1]}``); default none."""
        return {}


class Decoder(keras.layers.Layer):
    """Base class of the decoders: teacher forcing, and one step at a time from a state.

    - ``call(target_input_ids, memories, memory_mask, training=None, memory_embeddings=None,
      return_gates=False)`` -> float32 logits ``[B, T, V]`` (with ``return_gates``:
      ``(logits, gates)``, one dict per layer).  ``memories`` is one ``[B, S, D]`` tensor, or
      (transparent attention) a stacked ``[M, B, S, D]`` tensor / a list of M, one per
      encoder-decoder attention (:attr:`num_attention_modules`).  ``memory_embeddings``: the
      encoder's ``layer_outputs[0]``, passed only when :attr:`uses_memory_embeddings`.
    - ``init_state(memories, memory_mask, max_length, memory_embeddings=None)`` -> state: a
      nest (dicts/lists) of tensors, each with the batch as dimension 0 (except those
      :meth:`state_reorder_flags` marks ``None``) and a static shape that ``step`` keeps
      (caches are pre-allocated to ``max_length`` positions).
    - ``step(token_ids, step, state)`` with ``token_ids`` ``[B]`` at position ``step`` (int32
      scalar) -> (float32 logits ``[B, V]``, new state of the same structure).
    - :meth:`state_reorder_flags`: which state leaves beam search must reorder when it
      reorders hypotheses.
    """

    options_class: ClassVar[Optional[type]] = None

    @classmethod
    def make_embedding(cls, options, model, dtype, name: str) -> TokenEmbedding:
        """The target token embedding of this decoder type (default: the Transformer's)."""
        return TokenEmbedding(model.vocab_size, model.d_model, dtype=dtype, name=name)

    @classmethod
    def from_options(cls, options, model, embedding, memory_dim: int, dtype,
                     name: str) -> "Decoder":
        """Builds the decoder; ``memory_dim`` is the encoder's :attr:`~Encoder.output_dim`."""
        raise NotImplementedError(f"{cls.__name__}.from_options")

    @property
    def num_attention_modules(self) -> int:
        """M: encoder-decoder attentions, each of which may attend its own transparent mix
        (default: one per layer of ``self.layers_``)."""
        return len(_layers(self, "num_attention_modules"))

    @property
    def uses_memory_embeddings(self) -> bool:
        """Whether ``call``/``init_state`` need the source embeddings (default False)."""
        return False

    def state_reorder_flags(self, state) -> Any:
        """A nest like ``state`` of Python bools or None: True for the leaves that depend on
        the hypothesis (the search's loop carries them; beam search gathers them after each
        step), False for those that are the same for every hypothesis of a sentence (memory
        keys, masks: tiled once, never reordered), None for those that belong to no row and
        have no batch dimension (tables every step reads: never tiled).  False and None leaves
        must keep their initial value: the search passes them to every step as loop
        invariants and ignores what ``step`` returns for them.  Default: every leaf True."""
        return keras.tree.map_structure(lambda _: True, state)

    def diagnostic_weights(self) -> Dict[str, Any]:
        """Learned mixing matrices by name; default none."""
        return {}


def _layers(component, what: str):
    layers = getattr(component, "layers_", None)
    if layers is None:
        raise NotImplementedError(f"{type(component).__name__} has no layers_ list: override "
                                  f"{what}")
    return layers


# --------------------------------------------------------------------------------------------
# Registries
# --------------------------------------------------------------------------------------------


def _register(kind: str, classes: Dict[str, type], config_types, base: type, name: str,
              options: Optional[type]) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"register_{kind}({name!r}): {cls!r} is not a subclass of "
                            f"{base.__name__}")
        if options is not None:
            config_types.register(name, options)
        elif name not in config_types:
            raise ValueError(f"register_{kind}({name!r}): no options dataclass registered for "
                             f"this type; pass options=...")
        known = classes.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"{kind} type {name!r} is already registered ({known.__name__})")
        cls.options_class = config_types[name]
        classes[name] = cls
        return cls

    return wrap


def register_encoder(name: str, options: Optional[type] = None):
    """Class decorator: ``model.encoder.type: name`` builds this :class:`Encoder` subclass.

    Args:
      name: the type name (an identifier).
      options: its options dataclass (the section ``model.encoder.<name>``); the package's own
        types have theirs in ``deep_nmt_tf.config.model_schema`` and pass none.
    """
    return _register("encoder", ENCODERS, ENCODER_TYPES, Encoder, name, options)


def register_decoder(name: str, options: Optional[type] = None):
    """Class decorator: ``model.decoder.type: name`` builds this :class:`Decoder` subclass."""
    return _register("decoder", DECODERS, DECODER_TYPES, Decoder, name, options)


def _lookup(classes: Dict[str, type], kind: str, name: str) -> type:
    try:
        return classes[name]
    except KeyError:
        raise ValueError(f"no {kind} class registered for type {name!r} (known: "
                         f"{', '.join(sorted(classes))})") from None


def encoder_class(name: str) -> type:
    """The :class:`Encoder` subclass registered as ``name``."""
    return _lookup(ENCODERS, "encoder", name)


def decoder_class(name: str) -> type:
    """The :class:`Decoder` subclass registered as ``name``."""
    return _lookup(DECODERS, "decoder", name)


def build_encoder(one_of, model, dtype, name: str, embedding=None,
                  features: bool = False) -> Encoder:
    """Builds the encoder an ``EncoderConfig`` describes; what the model and the combinators
    (cascade stages, columns) call.

    Args:
      one_of: the ``EncoderConfig`` (type and options).
      model: the ``ModelConfig``.
      dtype: the dtype policy.
      name: the layer name.
      embedding: the token embedding to read (default: the type's own, :meth:`make_embedding`).
      features: the encoder reads features, not tokens (a later cascade stage): it gets no
        embedding, and its input width is ``model.d_model``.
    """
    cls = encoder_class(one_of.type)
    options = one_of.get()
    if embedding is None and not features:
        embedding = cls.make_embedding(options, model, dtype, f"{name}_embedding")
    return cls.from_options(options, model, embedding, dtype, name)
