"""MultiHeadAdditiveAttention (RNMT+).  Pure Keras: no TF.  Also run under KERAS_BACKEND=jax."""

import numpy as np
import pytest

import keras
from keras import ops

from deep_nmt_tf.layers.additive_attention import MultiHeadAdditiveAttention
from deep_nmt_tf.layers.lstm import LayerNormLSTMCell
from keras_test_utils import assert_config_roundtrip, to_numpy

B, T, S, DQ, DM, H, A = 3, 4, 6, 5, 7, 4, 16
LENGTHS = [S, 4, 1]


def _mask(lengths=LENGTHS, time=S):
    return np.arange(time)[None, :] < np.asarray(lengths)[:, None]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(B, T, DQ)).astype("float32"),
            rng.normal(size=(B, S, DM)).astype("float32"))


def numpy_attention(query, memory, mask, layer):
    """Plain numpy reference: per-head v_h . tanh(K_h + Q_h), masked softmax, concat."""
    wq, bq, wm, bm, v = [to_numpy(w) for w in (layer.query_kernel, layer.query_bias,
                                               layer.memory_kernel, layer.memory_bias,
                                               layer.score_vector)]
    h, d = v.shape
    k = (memory @ wm + bm).reshape(memory.shape[0], memory.shape[1], h, d)    # [B, S, H, d]
    q = (query @ wq + bq).reshape(query.shape[0], query.shape[1], h, d)       # [B, T, H, d]
    logits = np.einsum("btshd,hd->bths", np.tanh(k[:, None] + q[:, :, None]), v)
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    ctx = np.einsum("bths,bshd->bthd", w, k).reshape(query.shape[0], query.shape[1], h * d)
    return ctx, w


def _layer(**kwargs):
    layer = MultiHeadAdditiveAttention(num_heads=H, attention_dim=A, **kwargs)
    query, memory = _inputs()
    layer(query, memory=memory)
    rng = np.random.default_rng(42)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5
                       for w in layer.get_weights()])
    return layer


def test_weights_shapes_and_numpy_reference():
    layer = _layer()
    assert [tuple(w.shape) for w in layer.weights] == [(DQ, A), (A,), (DM, A), (A,),
                                                      (H, A // H)]
    query, memory = _inputs()
    mask = _mask()
    ctx, weights = layer(query, memory=memory, memory_mask=mask, return_weights=True)
    ctx, weights = to_numpy(ctx), to_numpy(weights)
    assert ctx.shape == (B, T, A) and weights.shape == (B, T, H, S)
    ctx_ref, w_ref = numpy_attention(query, memory, mask, layer)
    np.testing.assert_allclose(weights, w_ref, atol=1e-5)
    np.testing.assert_allclose(ctx, ctx_ref, atol=1e-4)


def test_weights_sum_to_one_and_padding_gets_zero_weight():
    layer = _layer()
    query, memory = _inputs(1)
    mask = _mask()
    memory_garbage = np.where(mask[..., None], memory, 1e3).astype("float32")
    ctx, weights = layer(query, memory=memory_garbage, memory_mask=mask, return_weights=True)
    weights = to_numpy(weights)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights.transpose(0, 3, 1, 2)[~mask] == 0.0)  # exactly zero on padding
    # Padding content has no effect on the context.
    ctx_clean = layer(query, memory=memory, memory_mask=mask)
    np.testing.assert_allclose(to_numpy(ctx), to_numpy(ctx_clean), atol=1e-5)
    # A row without any valid position gives zero weights and context (no NaN).
    empty = np.zeros((B, S), bool)
    ctx0, w0 = layer(query, memory=memory, memory_mask=empty, return_weights=True)
    assert np.all(to_numpy(w0) == 0.0) and np.all(to_numpy(ctx0) == 0.0)


def test_heads_have_their_own_scores():
    layer = _layer()
    query, memory = _inputs(2)
    ctx, weights = [to_numpy(v) for v in layer(query, memory=memory, return_weights=True)]
    v = to_numpy(layer.score_vector).copy()
    v[0] *= -3.0  # change head 0's score vector only
    layer.score_vector.assign(v)
    ctx2, weights2 = [to_numpy(v) for v in layer(query, memory=memory, return_weights=True)]
    d = A // H
    assert np.abs(weights2[:, :, 0] - weights[:, :, 0]).max() > 1e-3
    np.testing.assert_allclose(weights2[:, :, 1:], weights[:, :, 1:], atol=1e-6)
    assert np.abs(ctx2[..., :d] - ctx[..., :d]).max() > 1e-3
    np.testing.assert_allclose(ctx2[..., d:], ctx[..., d:], atol=1e-6)


def test_single_step_with_precomputed_memory_equals_sequence():
    layer = _layer()
    query, memory = _inputs(3)
    mask = _mask()
    ctx, weights = [to_numpy(v) for v in
                    layer(query, memory=memory, memory_mask=mask, return_weights=True)]
    keys = layer.precompute(memory)
    assert tuple(keys.shape) == (B, S, A)
    for t in range(T):
        ctx_t, w_t = layer(query[:, t], precomputed=keys, memory_mask=mask, return_weights=True)
        assert tuple(ctx_t.shape) == (B, A) and tuple(w_t.shape) == (B, H, S)
        np.testing.assert_allclose(to_numpy(ctx_t), ctx[:, t], atol=1e-5)
        np.testing.assert_allclose(to_numpy(w_t), weights[:, t], atol=1e-6)


def test_attention_dropout():
    layer = _layer(dropout=0.5, seed=1)
    query, memory = _inputs(4)
    mask = _mask()
    ref = to_numpy(layer(query, memory=memory, memory_mask=mask))
    np.testing.assert_allclose(to_numpy(layer(query, memory=memory, memory_mask=mask,
                                              training=False)), ref, atol=1e-6)
    ctx_tr, w_tr = layer(query, memory=memory, memory_mask=mask, training=True,
                         return_weights=True)
    assert np.abs(to_numpy(ctx_tr) - ref).max() > 1e-4
    np.testing.assert_allclose(to_numpy(w_tr).sum(-1), 1.0, atol=1e-5)  # returned pre-dropout
    # A pre-drawn mask (for use inside keras.ops.scan): ones = no dropout, zeros = no context.
    keys = layer.precompute(memory)
    ones = np.ones((B, H, S), "float32")
    ctx_1 = layer(query[:, 0], precomputed=keys, memory_mask=mask, training=True,
                  dropout_mask=ones)
    np.testing.assert_allclose(to_numpy(ctx_1), ref[:, 0], atol=1e-5)
    ctx_0 = layer(query[:, 0], precomputed=keys, memory_mask=mask, training=True,
                  dropout_mask=np.zeros_like(ones))
    assert np.all(to_numpy(ctx_0) == 0.0)
    drawn = to_numpy(layer.sample_dropout_mask((B, H, S)))
    assert set(np.unique(drawn)) <= {0.0, 2.0}


def test_config_roundtrip_and_saved_model(tmp_path):
    query, memory = _inputs(5)
    mask = _mask()
    layer = MultiHeadAdditiveAttention(
        H, A, dropout=0.1, seed=7, kernel_initializer=keras.initializers.RandomUniform(-0.1, 0.1))
    config = layer.get_config()
    assert config["kernel_initializer"]["config"]["maxval"] == 0.1
    assert_config_roundtrip(layer, lambda l: l(query, memory=memory, memory_mask=mask))

    q_in = keras.Input((None, DQ), name="query")
    m_in = keras.Input((None, DM), name="memory")
    mask_in = keras.Input((None,), dtype="bool", name="mask")
    out = MultiHeadAdditiveAttention(H, A, name="att")(q_in, memory=m_in, memory_mask=mask_in)
    model = keras.Model([q_in, m_in, mask_in], out)
    expected = to_numpy(model([query, memory, mask]))
    path = str(tmp_path / "att.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded([query, memory, mask])), expected, atol=1e-6)


def test_build_from_sizes_for_decoding():
    layer = MultiHeadAdditiveAttention(H, A, query_dim=DQ, memory_dim=DM)
    query, memory = _inputs(6)
    keys = layer.precompute(memory)  # builds from memory_dim/query_dim
    assert layer.built and tuple(keys.shape) == (B, S, A)
    assert tuple(layer(query[:, 0], precomputed=keys).shape) == (B, A)
    with pytest.raises(ValueError):
        MultiHeadAdditiveAttention(3, A)


def test_mixed_precision_policy():
    layer = MultiHeadAdditiveAttention(H, A, dtype="mixed_bfloat16")
    query, memory = _inputs(7)
    mask = _mask()
    ctx, w = layer(query, memory=memory, memory_mask=mask, return_weights=True)
    assert keras.backend.standardize_dtype(ctx.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(w.dtype) == "float32"
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in layer.weights)
    np.testing.assert_allclose(to_numpy(w).sum(-1), 1.0, atol=1e-3)
    assert np.all(to_numpy(w).transpose(0, 3, 1, 2)[~mask] == 0.0)
    ref = to_numpy(numpy_attention(query, memory, mask, layer)[0])
    np.testing.assert_allclose(to_numpy(ops.cast(ctx, "float32")), ref, atol=0.1)


def test_decoder_style_recurrence_inside_scan():
    """The RNMT+ decoder's bottom loop: LSTM step on [y_t; ctx_{t-1}], then attention."""
    rng = np.random.default_rng(8)
    units, emb = 8, 5
    cell = LayerNormLSTMCell(units)
    cell.build((None, emb + A))
    _, memory = _inputs(8)
    mask = _mask()
    targets = rng.normal(size=(B, T, emb)).astype("float32")
    # Reference: one step at a time, as incremental decoding runs it.
    state, ctx, expected = cell.get_initial_state(batch_size=B), ops.zeros((B, A)), []
    att_q = MultiHeadAdditiveAttention(H, A, query_dim=units, memory_dim=DM)
    att_q.build((None, units), (None, S, DM))
    keys = att_q.precompute(memory)
    for t in range(T):
        h, state = cell(ops.concatenate([targets[:, t], ctx], -1), state)
        ctx = att_q(h, precomputed=keys, memory_mask=mask)
        expected.append(to_numpy(ctx))
    # The same recurrence as one keras.ops.scan (embedding part of the projection hoisted).
    w_x, w_h = cell.split_kernel()
    w_emb, w_ctx = w_x[:emb], w_x[emb:]
    xs = ops.transpose(ops.matmul(ops.convert_to_tensor(targets), w_emb), (1, 0, 2))

    def step(carry, x_t):
        h, c, ctx = carry
        h, (_, c) = cell.recurrent_step(x_t + ops.matmul(ctx, w_ctx), [h, c], w_h)
        ctx = att_q(h, precomputed=keys, memory_mask=mask)
        return (h, c, ctx), (h, c, ctx)

    init = tuple(cell.get_initial_state(batch_size=B)) + (ops.zeros((B, A)),)
    _, (_, _, contexts) = ops.scan(step, init, xs)
    np.testing.assert_allclose(to_numpy(ops.transpose(contexts, (1, 0, 2))),
                               np.stack(expected, 1), atol=1e-5)
