"""Transformer encoder and decoder stacks (Vaswani et al. 2017), pre-norm or post-norm.

Both stacks follow the interfaces in ``docs/DESIGN.md``: the encoder returns a dict with the
memory, its padding mask and the per-layer outputs (embedding output first, as layer 0); the
decoder computes teacher-forced logits and runs one step at a time from a cache.
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.layers.attention import causal_bias, padding_bias, step_bias
from deep_nmt_tf.layers.embedding import SinusoidalPositionEncoding, TokenEmbedding
from deep_nmt_tf.layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer

__all__ = ["TransformerEncoder", "TransformerDecoder"]


class _StackBase(keras.layers.Layer):
    """Shared hyper-parameters, embedding handling and serialisation of the two stacks."""

    def __init__(self, embedding, num_layers, d_model, num_heads, ffn_dim, norm="post",
                 input_dropout=0.1, residual_dropout=0.1, attention_dropout=0.0,
                 relu_dropout=0.0, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        self.embedding = embedding
        self.num_layers = int(num_layers)
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.norm = norm
        self.input_dropout = float(input_dropout)
        self.residual_dropout = float(residual_dropout)
        self.attention_dropout = float(attention_dropout)
        self.relu_dropout = float(relu_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.positions = SinusoidalPositionEncoding(dtype=self.dtype_policy, name="positions")
        self.input_dropout_layer = keras.layers.Dropout(self.input_dropout,
                                                        dtype=self.dtype_policy)
        self.final_norm = None
        if norm == "pre":
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm")

    def layer_kwargs(self):
        return dict(d_model=self.d_model, num_heads=self.num_heads, ffn_dim=self.ffn_dim,
                    norm=self.norm, residual_dropout=self.residual_dropout,
                    attention_dropout=self.attention_dropout, relu_dropout=self.relu_dropout,
                    layer_norm_epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)

    def embed(self, ids, start=0, training=None):
        """Scaled token embedding + sinusoidal positions + input dropout (layer 0's output)."""
        x = self.embedding(ids)
        x = self.positions(x, start=start)
        return self.input_dropout_layer(x, training=training)

    def finalize(self, x):
        return self.final_norm(x) if self.final_norm is not None else x

    def _build_common(self, ids_shape):
        if not self.embedding.built:
            self.embedding.build(ids_shape)
        if self.final_norm is not None:
            self.final_norm.build((None, None, self.d_model))

    def get_config(self):
        config = super().get_config()
        config.update({
            "embedding": keras.saving.serialize_keras_object(self.embedding),
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "norm": self.norm,
            "input_dropout": self.input_dropout,
            "residual_dropout": self.residual_dropout,
            "attention_dropout": self.attention_dropout,
            "relu_dropout": self.relu_dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        })
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerEncoder(_StackBase):
    """Embedding + N Transformer encoder layers (+ final LayerNorm when pre-norm).

    Call: ``encoder(source_ids, training=None)`` with int ``[B, S]`` ids (``PAD_ID`` = padding)
    returns a dict:

    - ``"memory"``: ``[B, S, D]`` the encoder output (after the final LayerNorm if pre-norm);
    - ``"mask"``: bool ``[B, S]``, True at real tokens;
    - ``"layer_outputs"``: list of N+1 ``[B, S, D]`` tensors: the embedding output (layer 0)
      and each layer's raw output (transparent attention mixes these).

    Args:
      embedding: a :class:`TokenEmbedding` (possibly shared with the decoder).
      num_layers: N.
      d_model, num_heads, ffn_dim, norm, *_dropout, layer_norm_epsilon: see
        :class:`~deep_nmt_tf.layers.TransformerEncoderLayer`; ``input_dropout`` applies to the
        embeddings plus positions.
    """

    def __init__(self, embedding, num_layers, *args, **kwargs):
        super().__init__(embedding, num_layers, *args, **kwargs)
        self.layers_ = [TransformerEncoderLayer(**self.layer_kwargs(), name=f"layer_{i}")
                        for i in range(self.num_layers)]

    def build(self, ids_shape):
        self._build_common(ids_shape)
        for layer in self.layers_:
            layer.build((None, None, self.d_model))
        self.built = True

    def call(self, source_ids, training=None):
        mask = ops.not_equal(source_ids, PAD_ID)
        bias = padding_bias(mask)
        x = self.embed(source_ids, training=training)
        outputs = [x]
        for layer in self.layers_:
            x = layer(x, bias=bias, training=training)
            outputs.append(x)
        return {"memory": self.finalize(x), "mask": mask, "layer_outputs": outputs}


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerDecoder(_StackBase):
    """Embedding + M Transformer decoder layers (+ final LayerNorm when pre-norm) + softmax.

    Teacher forcing: ``decoder(target_input_ids, memories, memory_mask, training)`` returns
    float32 logits ``[B, T, V]``.  ``memories`` is one ``[B, S, D_mem]`` tensor shared by all
    layers or a list of M tensors, one per encoder-decoder attention (transparent attention).

    Incremental decoding: ``state = decoder.init_state(memories, memory_mask, max_length)``;
    ``logits, state = decoder.step(token_ids, step, state)``.

    Args:
      embedding: target :class:`TokenEmbedding`.
      num_layers: M.
      tie_softmax: use ``embedding.logits`` as the output layer; else a separate
        ``[D, V]`` projection.
      memory_dim: encoder output size (default d_model).
      other args: as :class:`TransformerEncoder`.
    """

    def __init__(self, embedding, num_layers, *args, tie_softmax=True, memory_dim=None,
                 **kwargs):
        super().__init__(embedding, num_layers, *args, **kwargs)
        self.tie_softmax = bool(tie_softmax)
        self.memory_dim = int(memory_dim or self.d_model)
        self.layers_ = [TransformerDecoderLayer(**self.layer_kwargs(), memory_dim=self.memory_dim,
                                                name=f"layer_{i}")
                        for i in range(self.num_layers)]

    def build(self, ids_shape):
        self._build_common(ids_shape)
        for layer in self.layers_:
            layer.build((None, None, self.d_model))
        if not self.tie_softmax:
            self.softmax_kernel = self.add_weight(
                name="softmax_kernel", shape=(self.d_model, self.embedding.vocab_size),
                initializer="glorot_uniform")
            self.softmax_bias = self.add_weight(
                name="softmax_bias", shape=(self.embedding.vocab_size,), initializer="zeros")
        self.built = True

    def _memories(self, memories):
        if isinstance(memories, (list, tuple)):
            if len(memories) != self.num_layers:
                raise ValueError(f"got {len(memories)} memories for {self.num_layers} layers")
            return list(memories)
        return [memories] * self.num_layers

    def output_logits(self, x):
        x = self.finalize(x)
        if self.tie_softmax:
            logits = self.embedding.logits(x)
        else:
            flat = ops.reshape(x, (-1, self.d_model))
            logits = ops.matmul(flat, ops.cast(self.softmax_kernel, x.dtype))
            logits = logits + ops.cast(self.softmax_bias, x.dtype)
            logits = ops.reshape(logits, tuple(ops.shape(x)[:-1]) + (self.embedding.vocab_size,))
        return ops.cast(logits, "float32")

    def call(self, target_input_ids, memories, memory_mask, training=None):
        memories = self._memories(memories)
        memory_bias = padding_bias(memory_mask)
        self_bias = causal_bias(ops.shape(target_input_ids)[1])
        x = self.embed(target_input_ids, training=training)
        for layer, memory in zip(self.layers_, memories):
            x = layer(x, memory, self_bias=self_bias, memory_bias=memory_bias, training=training)
        return self.output_logits(x)

    def init_state(self, memories, memory_mask, max_length):
        """Decoder state for incremental decoding; every leaf has the batch as dim 0."""
        memories = self._memories(memories)
        return {
            "memory_mask": memory_mask,
            "layers": [layer.init_cache(memory, max_length)
                       for layer, memory in zip(self.layers_, memories)],
        }

    def step(self, token_ids, step, state):
        """One decoding step: ``token_ids`` ``[B]`` at position ``step`` -> logits ``[B, V]``."""
        max_length = ops.shape(state["layers"][0]["self"]["k"])[2]
        memory_bias = padding_bias(state["memory_mask"])
        self_bias = step_bias(step, max_length)
        x = self.embed(ops.expand_dims(token_ids, 1), start=step, training=False)
        new_layers = []
        for layer, cache in zip(self.layers_, state["layers"]):
            x, cache = layer.step(x, cache, step, self_bias, memory_bias, training=False)
            new_layers.append(cache)
        logits = self.output_logits(x)[:, 0, :]
        return logits, {"memory_mask": state["memory_mask"], "layers": new_layers}

    def get_config(self):
        config = super().get_config()
        config.update({"tie_softmax": self.tie_softmax, "memory_dim": self.memory_dim})
        return config
