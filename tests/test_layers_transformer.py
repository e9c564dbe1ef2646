"""Transformer layers: shapes, masks, serialisation (backend-agnostic; re-run under JAX)."""

import numpy as np
import pytest
from keras import ops

from deep_nmt_tf import layers
from keras_test_utils import assert_config_roundtrip, assert_mixed_precision, to_numpy

D, H, F = 16, 4, 32


def _x(b=2, t=5, d=D, seed=0):
    return np.random.RandomState(seed).randn(b, t, d).astype("float32")


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_layer_padding_never_leaks(norm):
    layer = layers.TransformerEncoderLayer(D, H, F, norm=norm)
    x = _x()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    bias = layers.padding_bias(mask)
    y1 = to_numpy(layer(x, bias=bias))
    x2 = x.copy()
    x2[0, 3:] = 100.0 * np.random.randn(2, D)  # change padded positions only
    y2 = to_numpy(layer(x2, bias=bias))
    np.testing.assert_allclose(y1[0, :3], y2[0, :3], atol=1e-5)
    np.testing.assert_allclose(y1[1], y2[1], atol=1e-5)
    assert np.abs(y1[0, 3:] - y2[0, 3:]).max() > 1e-3  # the change is visible where allowed


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_layer_is_causal(norm):
    layer = layers.TransformerDecoderLayer(D, H, F, norm=norm)
    x, memory = _x(t=6), _x(t=4, seed=1)
    mem_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    kwargs = dict(self_bias=layers.causal_bias(6), memory_bias=layers.padding_bias(mem_mask))
    y1 = to_numpy(layer(x, memory, **kwargs))
    for t in range(5):
        x2 = x.copy()
        x2[:, t + 1:] += np.random.randn(2, 5 - t, D).astype("float32")
        y2 = to_numpy(layer(x2, memory, **kwargs))
        np.testing.assert_allclose(y1[:, : t + 1], y2[:, : t + 1], atol=1e-5)
        assert np.abs(y1[:, t + 1:] - y2[:, t + 1:]).max() > 1e-4
    memory2 = memory.copy()
    memory2[1, 2:] = 50.0  # padded memory of sentence 1
    np.testing.assert_allclose(to_numpy(layer(x, memory2, **kwargs))[1], y1[1], atol=1e-5)


def test_multi_head_attention_matches_numpy_reference():
    mha = layers.MultiHeadAttention(D, H)
    x = _x(b=1, t=3)
    y = to_numpy(mha(x))
    w_qkv, b_qkv, w_o, b_o = [to_numpy(w) for w in mha.weights]
    qkv = x[0] @ w_qkv + b_qkv
    q, k, v = np.split(qkv, 3, axis=-1)
    dh = D // H
    out = []
    for h in range(H):
        sl = slice(h * dh, (h + 1) * dh)
        s = q[:, sl] @ k[:, sl].T / np.sqrt(dh)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out.append(p @ v[:, sl])
    ref = np.concatenate(out, -1) @ w_o + b_o
    np.testing.assert_allclose(y[0], ref, atol=1e-5)


def test_attention_step_cache_matches_full():
    mha = layers.MultiHeadAttention(D, H)
    x = _x(t=4)
    full = to_numpy(mha(x, bias=layers.causal_bias(4)))
    cache = mha.init_cache(2, 4)
    for t in range(4):
        y, cache = mha.step(x[:, t:t + 1], cache, t, layers.step_bias(t, 4))
        np.testing.assert_allclose(to_numpy(y)[:, 0], full[:, t], atol=1e-5)


@pytest.mark.parametrize("shape,axis", [((3, 4, 5, 2), 2), ((3, 6), 1), ((5, 3), 0)])
def test_write_step_writes_one_slot_and_keeps_the_rest(shape, axis):
    """The decoding buffers' write: the slot at ``step`` along ``axis`` takes the update
    (whatever it held), every other value is kept, the dtype is the buffer's."""
    from deep_nmt_tf.layers.attention import write_step

    rng = np.random.default_rng(0)
    buffer = rng.normal(size=shape).astype("float32")
    update_shape = list(shape)
    update_shape[axis] = 1
    update = rng.normal(size=update_shape).astype("float32")
    step = shape[axis] - 2
    out = to_numpy(write_step(ops.convert_to_tensor(buffer), update, step, axis))
    expected = buffer.copy()
    index = [slice(None)] * len(shape)
    index[axis] = slice(step, step + 1)
    expected[tuple(index)] = update
    np.testing.assert_array_equal(out, expected)
    ids = to_numpy(write_step(ops.zeros(shape, "int32"), np.full(update_shape, 7), step, axis))
    assert ids.dtype == np.int32 and ids.sum() == 7 * np.prod(update_shape)


def test_embedding_scale_and_tied_logits():
    emb = layers.TokenEmbedding(11, 8)
    ids = np.array([[1, 2, 3]], "int32")
    e = to_numpy(emb(ids))
    table = to_numpy(emb.embeddings)
    np.testing.assert_allclose(e[0], table[[1, 2, 3]] * np.sqrt(8), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(emb.logits(e))[0], e[0] @ table.T, rtol=1e-5, atol=1e-5)


def test_sinusoidal_positions_offset():
    pos = layers.SinusoidalPositionEncoding()
    x = np.zeros((1, 6, 8), "float32")
    full = to_numpy(pos(x))
    np.testing.assert_allclose(to_numpy(pos(x[:, :1], start=4))[0, 0], full[0, 4], atol=1e-6)
    np.testing.assert_allclose(full[0, 0, :4], 0.0, atol=1e-7)  # sin(0)
    np.testing.assert_allclose(full[0, 0, 4:], 1.0, atol=1e-7)  # cos(0)


@pytest.mark.parametrize("make,call", [
    (lambda: layers.TokenEmbedding(13, D), lambda l: l(np.array([[1, 2, 0]], "int32"))),
    (lambda: layers.SinusoidalPositionEncoding(), lambda l: l(_x())),
    (lambda: layers.MultiHeadAttention(D, H, dropout=0.1), lambda l: l(_x())),
    (lambda: layers.MultiHeadAttention(D, H, self_attention=False, memory_dim=8),
     lambda l: l(_x(), memory=_x(t=3, d=8))),
    (lambda: layers.FeedForward(D, F, 0.1), lambda l: l(_x())),
    (lambda: layers.Residual("pre", 1e-6, 0.1), lambda l: l(_x(), _x(seed=3))),
    (lambda: layers.TransformerEncoderLayer(D, H, F, norm="pre"), lambda l: l(_x())),
    (lambda: layers.TransformerDecoderLayer(D, H, F, norm="post"),
     lambda l: l(_x(), _x(t=3), self_bias=layers.causal_bias(5))),
])
def test_serialization_round_trip(make, call):
    layer = make()
    call(layer)
    assert_config_roundtrip(layer, call)


def _decoder_layer_outputs(layer):
    """Teacher forcing and two cached steps of a decoder layer (with lexical shortcuts)."""
    x, memory, source = _x(t=3), _x(t=4, seed=1), _x(t=4, seed=2)
    bias = layers.padding_bias(np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool))
    out = {"call": layer(x, memory, self_bias=layers.causal_bias(3), memory_bias=bias,
                         shortcut=x, memory_shortcut=source)}
    cache = layer.init_cache(memory, 3, memory_shortcut=source)
    for t in range(2):
        y, cache = layer.step(x[:, t:t + 1], cache, t, layers.step_bias(t, 3), bias,
                              shortcut=x[:, t:t + 1])
        out[f"step_{t}"] = y
    out["cache"] = cache
    return out


@pytest.mark.parametrize("make,call,float32", [
    (lambda d: layers.TokenEmbedding(13, D, dtype=d),
     lambda l: {"embed": l(np.array([[1, 2, 0]], "int32")), "logits": l.logits(_x())}, ()),
    (lambda d: layers.MultiHeadAttention(D, H, dtype=d),
     lambda l: {"y": l(_x(), bias=layers.causal_bias(5))}, ()),
    (lambda d: layers.FeedForward(D, F, dtype=d), lambda l: {"y": l(_x())}, ()),
    (lambda d: layers.Residual("post", 1e-6, dtype=d), lambda l: {"y": l(_x(), _x(seed=3))},
     ()),
    (lambda d: layers.TransformerEncoderLayer(D, H, F, norm="pre", shortcut="shortcuts",
                                              dtype=d),
     lambda l: dict(zip(("y", "gates"), l(_x(), shortcut=_x(seed=4), return_gates=True))), ()),
    (lambda d: layers.TransformerDecoderLayer(D, H, F, norm="post", self_shortcut="shortcuts",
                                              cross_shortcut="feature_fusion", dtype=d),
     _decoder_layer_outputs, ()),
])
def test_layers_run_in_mixed_bfloat16(make, call, float32):
    """bfloat16 activations, float32 variables; close to the float32 layer."""
    assert_mixed_precision(make, call, float32, atol=0.15)
