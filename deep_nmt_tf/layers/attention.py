"""Multi-head scaled dot-product attention with padding/causal masks and decoding caches."""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.layers.deep_residual import BlockScaled

__all__ = [
    "MultiHeadAttention",
    "padding_bias",
    "causal_bias",
    "step_bias",
    "step_masks",
    "dense",
    "write_step",
    "NEG_INF",
]

NEG_INF = -1e9


def dense(x, kernel, bias=None):
    """``x @ kernel + bias`` over the last axis, as one 2-D GEMM (fast on every backend); a
    2-D ``x`` (a decoding step's ``[B, D]`` rows) needs no reshape."""
    if len(x.shape) == 2:
        out = ops.matmul(x, ops.cast(kernel, x.dtype))
        return out if bias is None else out + ops.cast(bias, x.dtype)
    shape = ops.shape(x)
    in_dim = kernel.shape[0]
    out = ops.matmul(ops.reshape(x, (-1, in_dim)), ops.cast(kernel, x.dtype))
    if bias is not None:
        out = out + ops.cast(bias, x.dtype)
    return ops.reshape(out, tuple(shape[:-1]) + (kernel.shape[1],))


def padding_bias(mask):
    """Additive attention bias ``[B, 1, 1, S]`` from a boolean ``[B, S]`` mask (True = token)."""
    mask = ops.cast(mask, "float32")
    return ((1.0 - mask) * NEG_INF)[:, None, None, :]


def causal_bias(length):
    """Additive bias ``[1, 1, T, T]``: position t may attend to positions <= t."""
    i = ops.arange(length)[:, None]
    j = ops.arange(length)[None, :]
    return ops.where(j > i, NEG_INF, 0.0)[None, None, :, :]


def step_bias(step, max_length):
    """Additive bias ``[1, 1, 1, L]`` for decoding step ``step``: cache slots > step are masked."""
    j = ops.arange(max_length)
    return ops.where(j > ops.cast(step, j.dtype), NEG_INF, 0.0)[None, None, None, :]


def step_masks(step, positions):
    """What one decoding step of every layer shares, computed once per step from ``positions``
    (``arange(L)`` int32, built once before the loop): the float32 self-attention bias ``[L]``
    (slots after ``step`` masked, as :func:`step_bias`) and the write masks of the caches of
    :meth:`MultiHeadAttention.init_cache`, True at slot ``step``: ``[L]`` for the keys
    ``[B, H, dh, L]``, ``[L, 1]`` for the values ``[B, H, L, dh]``.
    """
    step = ops.cast(step, positions.dtype)
    bias = ops.where(ops.greater(positions, step), NEG_INF, 0.0)
    key_mask = ops.equal(positions, step)
    return bias, (key_mask, ops.expand_dims(key_mask, 1))


def write_step(buffer, update, step, axis):
    """Returns ``buffer`` with ``update`` (size 1 along ``axis``) written at index ``step``.

    A scatter (``keras.ops.scatter_update``: one slice per index of the dimensions before
    ``axis``), not a dynamic-update-slice: TensorFlow implements ``keras.ops.slice_update``
    with an XLA-only op, which TF Serving's default configuration (XLA disabled) cannot run,
    while a scatter is a plain TensorFlow op on every backend (XLA and JAX update in place).
    Without XLA, TensorFlow copies the buffer first, and the index arithmetic adds about a
    dozen ops per write: the decoding loop's buffers (the search's ids, the self-attention
    caches of :meth:`MultiHeadAttention.write_cache`) are written with selects instead
    (issue 31, BENCHMARKS.md "Decoder step ops").
    """
    shape = ops.shape(buffer)
    lead = 1
    for k in range(axis):
        lead = lead * shape[k]
    flat = ops.arange(lead, dtype="int32")
    columns, stride = [], lead
    for k in range(axis):  # Row-major coordinates of each leading index.
        stride = stride // shape[k]
        columns.append((flat // stride) % shape[k])
    columns.append(ops.full_like(flat, ops.cast(step, "int32")))
    indices = ops.stack(columns, axis=1)
    trailing = tuple(shape[k] for k in range(axis + 1, len(buffer.shape)))
    updates = ops.reshape(ops.cast(update, buffer.dtype), (lead,) + trailing)
    return ops.scatter_update(buffer, indices, updates)


def split_heads(x, num_heads):
    """``[B, T, H*dh]`` -> ``[B, H, T, dh]``."""
    b, t = ops.shape(x)[0], ops.shape(x)[1]
    x = ops.reshape(x, (b, t, num_heads, x.shape[-1] // num_heads))
    return ops.transpose(x, (0, 2, 1, 3))


def merge_heads(x):
    """``[B, H, T, dh]`` -> ``[B, T, H*dh]``."""
    x = ops.transpose(x, (0, 2, 1, 3))
    b, t = ops.shape(x)[0], ops.shape(x)[1]
    return ops.reshape(x, (b, t, x.shape[2] * x.shape[3]))


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2).

    Self-attention uses one fused ``[D, 3D]`` query/key/value projection; encoder-decoder
    attention a ``[D, D]`` query and a fused ``[D_mem, 2D]`` key/value projection.  The
    sub-steps are public so that layers that change keys/values (lexical shortcuts) or cache
    them (incremental decoding) reuse them:

    - ``project_query(x)``, ``project_key_value(memory)``, ``project_qkv(x)`` return per-head
      tensors ``[B, H, T, dh]`` (queries already scaled by ``dh**-0.5``);
    - ``project_qkv_raw(x)`` / ``project_key_value_raw(memory)`` return the same projections
      before head splitting (``[B, T, D]``, queries unscaled) for layers that modify keys and
      values (lexical shortcuts gate them); ``split_heads`` and ``scale_query`` finish them;
    - ``attend(q, k, v, bias, training)`` returns the output projection ``[B, Tq, D]``.

    Args:
      d_model: model size D (= H * dh).
      num_heads: H.
      dropout: dropout rate on the attention probabilities.
      self_attention: fused q/k/v projection of one input if True; query from ``x`` and
        keys/values from ``memory`` otherwise.
      memory_dim: size of the memory for encoder-decoder attention (default d_model).
      kernel_initializer, bias_initializer: projection initialisers.
      value_output_scale: DeepNorm's beta: the value and output projections are initialised
        scaled by it (the query and key projections are not).

    Call:
      ``layer(x, memory=None, bias=None, training=None)``: ``x`` ``[B, T, D]``; ``bias`` an
      additive mask broadcastable to ``[B, H, T, S]`` (see ``padding_bias``/``causal_bias``).

    Example:
      >>> mha = MultiHeadAttention(16, 4)
      >>> x = keras.random.normal((2, 5, 16))
      >>> mha(x).shape
      (2, 5, 16)
    """

    def __init__(self, d_model, num_heads, dropout=0.0, self_attention=True, memory_dim=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 value_output_scale=1.0, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}")
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.head_dim = self.d_model // self.num_heads
        self.dropout = float(dropout)
        self.self_attention = bool(self_attention)
        self.memory_dim = int(memory_dim or d_model)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.value_output_scale = float(value_output_scale)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _w(self, name, shape, bias=False, scaled_blocks=None):
        """A weight; ``scaled_blocks`` (one bool per equal column block) marks the blocks that
        DeepNorm's beta (``value_output_scale``) scales at initialisation."""
        init = self.bias_initializer if bias else self.kernel_initializer
        if scaled_blocks is not None and self.value_output_scale != 1.0:
            init = BlockScaled(init, [self.value_output_scale if scaled else 1.0
                                      for scaled in scaled_blocks])
        return self.add_weight(name=name, shape=shape, initializer=init)

    def build(self, input_shape=None):
        d = self.d_model
        if self.self_attention:
            self.qkv_kernel = self._w("qkv_kernel", (d, 3 * d), scaled_blocks=(False, False, True))
            self.qkv_bias = self._w("qkv_bias", (3 * d,), bias=True)
        else:
            self.q_kernel = self._w("q_kernel", (d, d))
            self.q_bias = self._w("q_bias", (d,), bias=True)
            self.kv_kernel = self._w("kv_kernel", (self.memory_dim, 2 * d),
                                     scaled_blocks=(False, True))
            self.kv_bias = self._w("kv_bias", (2 * d,), bias=True)
        self.output_kernel = self._w("output_kernel", (d, d), scaled_blocks=(True,))
        self.output_bias = self._w("output_bias", (d,), bias=True)
        self.built = True

    # -- projections ---------------------------------------------------------------------
    def _scale(self, q):
        return q * ops.cast(self.head_dim ** -0.5, q.dtype)

    def project_qkv(self, x):
        """Self-attention: ``[B, T, D]`` -> q, k, v each ``[B, H, T, dh]``."""
        qkv = dense(x, self.qkv_kernel, self.qkv_bias)
        q, k, v = ops.split(qkv, 3, axis=-1)
        h = self.num_heads
        return self._scale(split_heads(q, h)), split_heads(k, h), split_heads(v, h)

    def project_qkv_raw(self, x):
        """Self-attention projections before head splitting: q, k, v each ``[B, T, D]``."""
        return ops.split(dense(x, self.qkv_kernel, self.qkv_bias), 3, axis=-1)

    def project_key_value_raw(self, memory):
        """Keys/values of ``memory`` before head splitting: k, v each ``[B, S, D]``."""
        if self.self_attention:
            kernel, bias = self.qkv_kernel[:, self.d_model:], self.qkv_bias[self.d_model:]
        else:
            kernel, bias = self.kv_kernel, self.kv_bias
        return ops.split(dense(memory, kernel, bias), 2, axis=-1)

    def scale_query(self, q):
        """Scales per-head queries ``[B, H, T, dh]`` by ``dh**-0.5``."""
        return self._scale(q)

    def project_query(self, x):
        """Query ``[B, T, D]`` -> ``[B, H, T, dh]`` (scaled)."""
        if self.self_attention:
            kernel, bias = self.qkv_kernel[:, : self.d_model], self.qkv_bias[: self.d_model]
        else:
            kernel, bias = self.q_kernel, self.q_bias
        return self._scale(split_heads(dense(x, kernel, bias), self.num_heads))

    def project_key_value(self, memory):
        """Keys/values of ``memory`` ``[B, S, D_mem]`` -> k, v each ``[B, H, S, dh]``."""
        if self.self_attention:
            kernel, bias = self.qkv_kernel[:, self.d_model:], self.qkv_bias[self.d_model:]
        else:
            kernel, bias = self.kv_kernel, self.kv_bias
        k, v = ops.split(dense(memory, kernel, bias), 2, axis=-1)
        return split_heads(k, self.num_heads), split_heads(v, self.num_heads)

    def split_heads(self, x):
        return split_heads(x, self.num_heads)

    # -- attention -----------------------------------------------------------------------
    def attention_probs(self, q, k, bias=None, training=None):
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        scores = ops.cast(scores, "float32")
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")
        probs = ops.cast(ops.softmax(scores, axis=-1), q.dtype)
        return self.dropout_layer(probs, training=training)

    def attend(self, q, k, v, bias=None, training=None):
        """Per-head q ``[B,H,T,dh]``, k/v ``[B,H,S,dh]`` -> output ``[B, T, D]``."""
        probs = self.attention_probs(q, k, bias, training)
        context = merge_heads(ops.matmul(probs, v))
        return dense(context, self.output_kernel, self.output_bias)

    def call(self, x, memory=None, bias=None, training=None):
        if self.self_attention:
            q, k, v = self.project_qkv(x)
        else:
            if memory is None:
                raise ValueError("encoder-decoder attention needs `memory`")
            q = self.project_query(x)
            k, v = self.project_key_value(memory)
        return self.attend(q, k, v, bias, training)

    # -- incremental decoding ------------------------------------------------------------
    # One decoding step works on ``[B, D]`` rows (a ``[B, 1, D]`` input is reshaped): the
    # projections need no reshape, heads are split and merged by reshapes alone (one position:
    # no transpose), and the caches are laid out so that both products are plain matmuls.
    def init_cache(self, batch_size, max_length, dtype=None):
        """Zero self-attention cache: keys ``"k"`` ``[B, H, dh, L]`` (stored transposed, so
        that the step's query-key product needs no transpose) and values ``"v"``
        ``[B, H, L, dh]``."""
        h, dh = self.num_heads, self.head_dim
        dtype = dtype or self.compute_dtype
        return {"k": ops.zeros((batch_size, h, dh, max_length), dtype),
                "v": ops.zeros((batch_size, h, max_length, dh), dtype)}

    def write_cache(self, cache, k, v, step, masks=None):
        """Writes one position's keys/values (``[B, D]``) at slot ``step`` of
        :meth:`init_cache`'s cache.

        A select (``where``) with the write masks of :func:`step_masks` (computed from
        ``step`` unless given): one elementwise pass over each buffer, no index arithmetic,
        and on the plain TensorFlow graph much cheaper than a ``TensorScatterUpdate``, which
        copies the buffer first and then scatters (BENCHMARKS.md, "Decoder step ops").
        """
        if masks is None:
            masks = step_masks(step, ops.arange(ops.shape(cache["v"])[2], dtype="int32"))[1]
        key_mask, value_mask = masks
        h, dh = self.num_heads, self.head_dim
        k = ops.cast(ops.reshape(k, (-1, h, dh, 1)), cache["k"].dtype)
        v = ops.cast(ops.reshape(v, (-1, h, 1, dh)), cache["v"].dtype)
        return {"k": ops.where(key_mask, k, cache["k"]), "v": ops.where(value_mask, v, cache["v"])}

    def step_query(self, q, scale=True):
        """A step's projected query ``[B, D]`` -> per-head ``[B, H, 1, dh]``, scaled by
        ``dh**-0.5`` unless ``scale=False`` (keys scaled instead, once: the memory's)."""
        q = self._scale(q) if scale else q
        return ops.reshape(q, (-1, self.num_heads, 1, self.head_dim))

    def attend_step(self, q, k_t, v, bias=None):
        """One query per row: ``q`` ``[B, H, 1, dh]`` (:meth:`step_query`), keys ``k_t``
        ``[B, H, dh, S]`` (transposed), values ``[B, H, S, dh]``, additive float32 ``bias``
        broadcastable to ``[B, H, 1, S]`` -> output projection ``[B, D]``."""
        scores = ops.cast(ops.matmul(q, k_t), "float32")
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")
        probs = ops.cast(ops.softmax(scores, axis=-1), q.dtype)
        context = ops.reshape(ops.matmul(probs, v), (-1, self.d_model))
        return dense(context, self.output_kernel, self.output_bias)

    def step(self, x, cache, step, bias, training=None, masks=None):
        """One self-attention decoding step.

        Args:
          x: ``[B, D]`` (or ``[B, 1, D]``) input at position ``step``.
          cache: :meth:`init_cache`'s ``{"k", "v"}`` holding positions < step.
          step: scalar int position.
          bias: additive bias masking the slots after ``step`` (:func:`step_bias`, or the
            first result of :func:`step_masks`).
          masks: the write masks of :func:`step_masks` (default: computed from ``step``).

        Returns:
          (output of ``x``'s shape, updated cache).
        """
        del training  # no dropout at inference
        x2 = ops.cast(x, self.compute_dtype)
        x2 = ops.reshape(x2, (-1, self.d_model)) if len(x.shape) == 3 else x2
        q, k, v = ops.split(dense(x2, self.qkv_kernel, self.qkv_bias), 3, axis=-1)
        cache = self.write_cache(cache, k, v, step, masks)
        y = self.attend_step(self.step_query(q), cache["k"], cache["v"], bias)
        return (ops.expand_dims(y, 1) if len(x.shape) == 3 else y), cache

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
            "self_attention": self.self_attention,
            "memory_dim": self.memory_dim,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "value_output_scale": self.value_output_scale,
        })
        return config
