"""Multi-head additive (Bahdanau) attention of RNMT+ (Chen et al. 2018).

Pure Keras 3 (``keras.ops`` only): runs on the TensorFlow and JAX backends.

For memory ``m`` ``[B, S, Dm]`` and query ``q`` ``[B, T, Dq]`` (or one step ``[B, Dq]``)::

    K      = m @ W_m + b_m                    # [B, S, A]  projected source: keys AND values
    Q      = q @ W_q + b_q                    # [B, T, A]
    split A into H heads of size A/H (4 x 256 at A = 1024)
    e_h    = v_h . tanh(K_h + Q_h)            # [B, T, H, S]  one additive score per head
    p_h    = softmax_S(e_h) with padded source positions at exactly 0 weight
    ctx    = concat_h( dropout(p_h) @ K_h )   # [B, T, A]

Lingvo's multi-headed attention runs an inner additive attention (with its own source and
query matrices, shared across heads) on the per-head chunks.  Linear maps compose, so those
inner matrices only re-parameterise ``W_m``/``W_q`` (the set of functions is the same);
here the outer projections feed ``tanh`` directly and each head has its own ``v_h``, as the
paper describes ("each head computes its own additive score").

Decoding: ``precompute(memory)`` projects the memory once per source (``[B, S, A]``, batch
major: a decoder-state leaf beam search can tile and gather); each step then calls
``layer(query_t, precomputed=..., memory_mask=...)`` with ``query_t`` ``[B, Dq]``.

References:
  Chen et al. 2018, "The Best of Both Worlds" (section 4.1, multi-head additive attention);
  Bahdanau et al. 2015, "Neural Machine Translation by Jointly Learning to Align and
  Translate" (additive attention).
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.layers.attention import dense

__all__ = ["MultiHeadAdditiveAttention"]

_NEG_INF = -1e9


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class MultiHeadAdditiveAttention(keras.layers.Layer):
    """Multi-head additive attention with padding mask, attention dropout and a decoding cache.

    Weights (created in ``build``): ``query_kernel`` ``[Dq, A]``, ``query_bias`` ``[A]``,
    ``memory_kernel`` ``[Dm, A]``, ``memory_bias`` ``[A]``, ``score_vector`` ``[H, A/H]``.

    Args:
      num_heads: H; must divide ``attention_dim``.
      attention_dim: A, the projection size; also the size of the returned context.
      dropout: dropout rate on the attention probabilities (training only).
      query_dim: Dq, optional; otherwise taken from the first query at build time.
      memory_dim: Dm, optional; otherwise taken from the memory at build time (needed when
        the layer is first called with ``precomputed`` only).
      kernel_initializer: projections (default glorot_uniform).
      bias_initializer: projection biases (default zeros).
      score_initializer: ``score_vector`` (default glorot_uniform).
      seed: seed of the attention dropout.
      **kwargs: ``keras.layers.Layer`` arguments.

    Call:
      ``layer(query, memory=None, memory_mask=None, precomputed=None, training=None,
      return_weights=False, dropout_mask=None)``

      - ``query``: ``[B, Dq]`` (one decoding step) or ``[B, T, Dq]``.
      - ``memory``: ``[B, S, Dm]``; or pass ``precomputed = layer.precompute(memory)``.
      - ``memory_mask``: ``[B, S]`` boolean, True = real token (None: all valid).  It is not
        called ``mask`` on purpose: Keras would fill a ``mask`` argument with the QUERY's mask.
      - ``dropout_mask``: optional pre-drawn keep-mask (see ``sample_dropout_mask``) broadcast
        against the weights; use it inside ``keras.ops.scan`` (JAX cannot advance random
        state inside a scan).  Used only when ``training``.

      Returns the context ``[B, A]`` / ``[B, T, A]`` (heads concatenated), and with
      ``return_weights`` also the per-head probabilities ``[B, H, S]`` / ``[B, T, H, S]``
      (before dropout; each sums to 1 over S; padded positions exactly 0).

    Memory: the full-sequence call materialises ``[B, T, S, A]`` for the tanh; RNMT+ calls it
    one decoder step at a time (``[B, S, A]``).

    Example:
      >>> att = MultiHeadAdditiveAttention(num_heads=4, attention_dim=16)
      >>> memory = keras.random.normal((2, 6, 10))
      >>> mask = keras.ops.arange(6)[None, :] < keras.ops.convert_to_tensor([[6], [3]])
      >>> ctx, w = att(keras.random.normal((2, 5, 8)), memory=memory, memory_mask=mask,
      ...              return_weights=True)
      >>> ctx.shape, w.shape
      ((2, 5, 16), (2, 5, 4, 6))
      >>> keys = att.precompute(memory)                                   # once per source
      >>> att(keras.random.normal((2, 8)), precomputed=keys, memory_mask=mask).shape
      (2, 16)

    References:
      Chen et al. 2018 (RNMT+); Bahdanau et al. 2015.
    """

    def __init__(self, num_heads, attention_dim, dropout=0.0, query_dim=None, memory_dim=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 score_initializer="glorot_uniform", seed=None, **kwargs):
        super().__init__(**kwargs)
        if attention_dim % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide "
                             f"attention_dim={attention_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.num_heads = int(num_heads)
        self.attention_dim = int(attention_dim)
        self.head_dim = self.attention_dim // self.num_heads
        self.dropout = float(dropout)
        self.query_dim = None if query_dim is None else int(query_dim)
        self.memory_dim = None if memory_dim is None else int(memory_dim)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.score_initializer = keras.initializers.get(score_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True  # the query's mask passes through

    def build(self, query_shape, memory_shape=None):
        query_dim = query_shape[-1] if query_shape is not None else self.query_dim
        memory_dim = memory_shape[-1] if memory_shape is not None else self.memory_dim
        if query_dim is None or memory_dim is None:
            raise ValueError(f"{self.name}: cannot build without the query and memory sizes; "
                             "call the layer with `memory` first or pass query_dim/memory_dim")
        self.query_dim, self.memory_dim = int(query_dim), int(memory_dim)
        a = self.attention_dim
        self.query_kernel = self.add_weight(name="query_kernel", shape=(self.query_dim, a),
                                            initializer=self.kernel_initializer)
        self.query_bias = self.add_weight(name="query_bias", shape=(a,),
                                          initializer=self.bias_initializer)
        self.memory_kernel = self.add_weight(name="memory_kernel", shape=(self.memory_dim, a),
                                             initializer=self.kernel_initializer)
        self.memory_bias = self.add_weight(name="memory_bias", shape=(a,),
                                           initializer=self.bias_initializer)
        self.score_vector = self.add_weight(name="score_vector",
                                            shape=(self.num_heads, self.head_dim),
                                            initializer=self.score_initializer)
        self.built = True

    def precompute(self, memory):
        """Projected memory ``[B, S, A]`` (the keys and the values), once per source."""
        if not self.built:
            self.build((None, self.query_dim) if self.query_dim else None, memory.shape)
        memory = ops.cast(memory, self.compute_dtype)
        return dense(memory, ops.cast(self.memory_kernel, self.compute_dtype),
                      ops.cast(self.memory_bias, self.compute_dtype))

    def sample_dropout_mask(self, shape):
        """A keep-mask of ``shape`` (e.g. ``[B, H, S]`` per step) scaled by ``1/(1-rate)``."""
        if self.dropout <= 0.0:
            return None
        return keras.random.dropout(ops.ones(shape, dtype="float32"), rate=self.dropout,
                                    seed=self.seed_generator)

    def call(self, query, memory=None, memory_mask=None, precomputed=None, training=None,
             return_weights=False, dropout_mask=None):
        if precomputed is None:
            if memory is None:
                raise ValueError(f"{self.name}: pass `memory` or `precomputed`")
            precomputed = self.precompute(memory)
        keys = ops.cast(precomputed, self.compute_dtype)               # [B, S, A]
        single_step = len(query.shape) == 2
        query = ops.cast(query, self.compute_dtype)
        if single_step:
            query = ops.expand_dims(query, 1)                              # [B, 1, Dq]
        q = dense(query, ops.cast(self.query_kernel, self.compute_dtype),
                   ops.cast(self.query_bias, self.compute_dtype))         # [B, T, A]

        b, t, s = ops.shape(q)[0], ops.shape(q)[1], ops.shape(keys)[1]
        h, d = self.num_heads, self.head_dim
        k_heads = ops.reshape(keys, (b, s, h, d))                          # [B, S, H, d]
        q_heads = ops.reshape(q, (b, t, h, d))                             # [B, T, H, d]
        hidden = ops.tanh(ops.expand_dims(k_heads, 1) + ops.expand_dims(q_heads, 2))  # B,T,S,H,d
        v = ops.cast(self.score_vector, self.compute_dtype)
        logits = ops.einsum("btshd,hd->bths", hidden, v)                  # [B, T, H, S]

        logits = ops.cast(logits, "float32")
        if memory_mask is not None:
            valid = ops.cast(memory_mask, "bool")[:, None, None, :]        # [B, 1, 1, S]
            logits = ops.where(valid, logits, _NEG_INF)
        weights = ops.softmax(logits, axis=-1)
        if memory_mask is not None:  # exact zeros (also when a row has no valid position)
            weights = weights * ops.cast(valid, weights.dtype)

        probs = weights
        if training and self.dropout > 0.0:
            if dropout_mask is None:
                probs = keras.random.dropout(probs, rate=self.dropout, seed=self.seed_generator)
            else:
                mask = ops.cast(dropout_mask, probs.dtype)
                if single_step and len(mask.shape) == 3:
                    mask = ops.expand_dims(mask, 1)
                probs = probs * mask
        probs = ops.cast(probs, self.compute_dtype)
        context = ops.einsum("bths,bshd->bthd", probs, k_heads)            # [B, T, H, d]
        context = ops.reshape(context, (b, t, h * d))
        if single_step:
            context = context[:, 0]
            weights = weights[:, 0]
        if return_weights:
            return context, weights
        return context

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads,
            "attention_dim": self.attention_dim,
            "dropout": self.dropout,
            "query_dim": self.query_dim,
            "memory_dim": self.memory_dim,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "score_initializer": keras.initializers.serialize(self.score_initializer),
            "seed": self.seed,
        })
        return config
