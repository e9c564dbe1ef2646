"""LayerNormLSTMCell / LayerNormLSTM / BidirectionalLayerNormLSTM (RNMT+).  Pure Keras: no TF.

Also run under ``KERAS_BACKEND=jax`` (see conftest.py).
"""

import numpy as np
import pytest

import keras
from keras import ops

from deep_nmt_tf.layers.lstm import (BidirectionalLayerNormLSTM, LayerNormLSTM,
                                     LayerNormLSTMCell, reverse_sequence, sequence_lengths)
from keras_test_utils import assert_config_roundtrip, assert_mixed_precision, to_numpy

B, T, D, U = 3, 6, 5, 4


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_step(x, h, c, kernel, scale, bias, units, tanh_output, clip, eps):
    """Plain numpy reference of one RNMT+ cell step (gate order i, f, g, o)."""
    z = np.concatenate([x, h], axis=-1) @ kernel
    z = z.reshape(-1, 4, units)
    mean = z.mean(-1, keepdims=True)
    var = ((z - mean) ** 2).mean(-1, keepdims=True)
    zn = (z - mean) / np.sqrt(var + eps) * scale.reshape(4, units) + bias.reshape(4, units)
    i, f, g, o = zn[:, 0], zn[:, 1], zn[:, 2], zn[:, 3]
    c_new = np.clip(_sigmoid(f) * c + _sigmoid(i) * np.tanh(g), -clip, clip)
    h_new = _sigmoid(o) * (np.tanh(c_new) if tanh_output else c_new)
    return h_new, c_new


def _randomize(layer, rng, scale=0.5):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * scale
                       for w in layer.get_weights()])


def _lengths_mask(lengths, time=T):
    return np.arange(time)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("output_activation", [None, "tanh"])
def test_cell_matches_numpy_reference_step(output_activation):
    rng = np.random.default_rng(0)
    cell = LayerNormLSTMCell(U, output_activation=output_activation, cell_clip=3.0)
    cell.build((B, D))
    kernel = rng.normal(size=(D + U, 4 * U)).astype("float32")
    scale = rng.uniform(0.5, 2.0, size=(4 * U,)).astype("float32")
    bias = rng.normal(size=(4 * U,)).astype("float32")
    cell.set_weights([kernel, scale, bias])
    x = rng.normal(size=(B, D)).astype("float32")
    h = rng.normal(size=(B, U)).astype("float32")
    c = rng.normal(scale=4.0, size=(B, U)).astype("float32")  # some |c| > clip
    out, (h1, c1) = cell(x, [h, c])
    h_ref, c_ref = numpy_step(x, h, c, kernel, scale, bias, U, output_activation == "tanh",
                              3.0, cell.layer_norm_epsilon)
    np.testing.assert_allclose(to_numpy(c1), c_ref, atol=1e-5)
    np.testing.assert_allclose(to_numpy(h1), h_ref, atol=1e-5)
    np.testing.assert_allclose(to_numpy(out), h_ref, atol=1e-5)
    assert np.abs(to_numpy(c1)).max() <= 3.0 + 1e-6
    assert np.isclose(np.abs(to_numpy(c1)).max(), 3.0)  # the clip is active in this example
    # The low-level path (projected input + recurrent matmul) is the same maths.
    w_x, w_h = cell.split_kernel()
    h2, (_, c2) = cell.recurrent_step(cell.project_inputs(x, w_x), [h, c], w_h)
    np.testing.assert_allclose(to_numpy(h2), h_ref, atol=1e-5)
    np.testing.assert_allclose(to_numpy(c2), c_ref, atol=1e-5)


def test_initialisation_and_weight_shapes():
    cell = LayerNormLSTMCell(U, forget_bias=1.0)
    cell.build((None, D))
    kernel, scale, bias = [to_numpy(w) for w in (cell.kernel, cell.gate_scale, cell.bias)]
    assert kernel.shape == (D + U, 4 * U) and scale.shape == (4 * U,) and bias.shape == (4 * U,)
    assert np.abs(kernel).max() <= 0.04 and np.abs(kernel).max() > 0.0  # Uniform(+-0.04)
    np.testing.assert_array_equal(scale, np.ones(4 * U))
    expected_bias = np.zeros((4, U))
    expected_bias[1] = 1.0  # forget gate (order i, f, g, o)
    np.testing.assert_array_equal(bias, expected_bias.reshape(-1))
    assert cell.state_size == [U, U] and cell.output_size == U


def test_layer_norm_statistics_are_per_gate():
    rng = np.random.default_rng(1)
    cell = LayerNormLSTMCell(U)
    cell.build((None, D))
    cell.set_weights([to_numpy(cell.kernel), np.ones(4 * U, "float32"),
                      np.zeros(4 * U, "float32")])
    z = rng.normal(size=(B, 4 * U)).astype("float32")
    base = to_numpy(cell.normalize_gates(z))
    assert base.shape == (B, 4, U)
    np.testing.assert_allclose(base.mean(-1), 0.0, atol=1e-5)      # each gate: mean 0
    np.testing.assert_allclose(base.var(-1), 1.0, atol=1e-3)       # each gate: variance 1
    for gate in range(4):
        z2 = z.reshape(B, 4, U).copy()
        z2[:, gate] = 7.0 * z2[:, gate] + 3.0  # rescale and shift ONE gate's pre-activation
        changed = to_numpy(cell.normalize_gates(z2.reshape(B, 4 * U)))
        np.testing.assert_allclose(changed, base, atol=1e-4)  # no gate's values move
    # Contrast: a joint LayerNorm over all 4U pre-activations would move the other gates.
    z2 = z.reshape(B, 4, U).copy()
    z2[:, 0] *= 7.0
    joint = (z2 - z2.mean((1, 2), keepdims=True)) / z2.std((1, 2), keepdims=True)
    assert np.abs(joint[:, 1:] - base[:, 1:]).max() > 0.1


def test_sequence_layer_equals_step_by_step_cell_and_keras_rnn():
    rng = np.random.default_rng(2)
    layer = LayerNormLSTM(U, return_state=True)
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer(x)
    _randomize(layer, rng)
    y, h_last, c_last = layer(x)
    # Decoding-style: the cell one step at a time.
    state = layer.cell.get_initial_state(batch_size=B)
    steps = []
    for t in range(T):
        out, state = layer.cell(x[:, t], state)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(to_numpy(y), np.stack(steps, 1), atol=1e-5)
    np.testing.assert_allclose(to_numpy(h_last), to_numpy(state[0]), atol=1e-5)
    np.testing.assert_allclose(to_numpy(c_last), to_numpy(state[1]), atol=1e-5)
    # The same cell inside keras.layers.RNN.
    rnn = keras.layers.RNN(layer.cell, return_sequences=True)
    np.testing.assert_allclose(to_numpy(rnn(x)), to_numpy(y), atol=1e-5)


def numpy_lstm(x, lengths, weights, units, tanh_output=False, clip=10.0, eps=1e-6,
               backwards=False, recurrent_mask=None):
    """Numpy reference of a masked (right-padded) sequence; padded outputs are 0."""
    kernel, scale, bias = weights
    batch, time = x.shape[:2]
    y = np.zeros((batch, time, units), "float32")
    h_last = np.zeros((batch, units), "float32")
    c_last = np.zeros((batch, units), "float32")
    for b, n in enumerate(lengths):
        order = range(n - 1, -1, -1) if backwards else range(n)
        h = np.zeros((1, units), "float32")
        c = np.zeros((1, units), "float32")
        for t in order:
            h_in = h if recurrent_mask is None else h * recurrent_mask[b:b + 1]
            h_new, c = numpy_step(x[b:b + 1, t], h_in, c, kernel, scale, bias, units,
                                  tanh_output, clip, eps)
            h = h_new
            y[b, t] = h[0]
        h_last[b], c_last[b] = h[0], c[0]
    return y, h_last, c_last


def test_masking_keeps_state_and_zeroes_padded_outputs():
    rng = np.random.default_rng(3)
    layer = LayerNormLSTM(U, return_state=True)
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer(x)
    _randomize(layer, rng)
    lengths = [T, 4, 1]
    mask = _lengths_mask(lengths)
    x_garbage = np.where(mask[..., None], x, rng.normal(size=x.shape) * 100).astype("float32")
    y, h_last, c_last = [to_numpy(v) for v in layer(x_garbage, mask=mask)]
    assert np.all(y[~mask] == 0.0)
    y_ref, h_ref, c_ref = numpy_lstm(x, lengths, layer.get_weights(), U)
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    np.testing.assert_allclose(h_last, h_ref, atol=1e-5)  # state of the last VALID step
    np.testing.assert_allclose(c_last, c_ref, atol=1e-5)


def test_reverse_sequence_reverses_only_the_valid_part():
    x = np.arange(2 * 5 * 2).reshape(2, 5, 2).astype("float32")
    lengths = np.array([3, 5])
    out = to_numpy(reverse_sequence(x, lengths))
    expected = x.copy()
    for b, n in enumerate(lengths):
        expected[b, :n] = x[b, :n][::-1]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(to_numpy(reverse_sequence(out, lengths)), x)  # involution
    np.testing.assert_array_equal(to_numpy(sequence_lengths(_lengths_mask([3, 5], 5))), [3, 5])


def test_backward_layer_reads_right_to_left_over_valid_steps():
    rng = np.random.default_rng(4)
    layer = LayerNormLSTM(U, go_backwards=True, return_state=True)
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer(x)
    _randomize(layer, rng)
    lengths = [T, 3, 1]
    y, h_last, _ = [to_numpy(v) for v in layer(x, mask=_lengths_mask(lengths))]
    y_ref, h_ref, _ = numpy_lstm(x, lengths, layer.get_weights(), U, backwards=True)
    np.testing.assert_allclose(y, y_ref, atol=1e-5)       # output t aligned with input t
    np.testing.assert_allclose(h_last, h_ref, atol=1e-5)  # final state: after the first token
    assert np.all(y[~_lengths_mask(lengths)] == 0.0)


def test_bidirectional_sees_both_directions_and_ignores_padding():
    rng = np.random.default_rng(5)
    bi = BidirectionalLayerNormLSTM(U)
    x = rng.normal(size=(B, T, D)).astype("float32")
    x_last = x.copy()
    x_last[:, -1] += 1.0
    x_first = x.copy()
    x_first[:, 0] += 1.0
    y, y_last, y_first = np.split(to_numpy(bi(np.concatenate([x, x_last, x_first]))), 3)
    assert y.shape == (B, T, 2 * U)
    # The backward half of the FIRST output sees the LAST token.
    assert np.abs(y_last[:, 0, U:] - y[:, 0, U:]).max() > 1e-4
    np.testing.assert_allclose(y_last[:, 0, :U], y[:, 0, :U], atol=1e-6)  # forward is causal
    assert np.abs(y_first[:, -1, :U] - y[:, -1, :U]).max() > 1e-4

    lengths = [T, 4, 2]
    mask = _lengths_mask(lengths)
    x_pad = np.where(mask[..., None], x, 50.0).astype("float32")
    y_pad = to_numpy(bi(x_pad, mask=mask))
    weights = bi.get_weights()
    fw = numpy_lstm(x, lengths, weights[:3], U)[0]
    bw = numpy_lstm(x, lengths, weights[3:], U, backwards=True)[0]
    np.testing.assert_allclose(y_pad, np.concatenate([fw, bw], -1), atol=1e-5)
    assert np.all(y_pad[~mask] == 0.0)


def test_recurrent_dropout_uses_one_mask_for_all_steps():
    rng = np.random.default_rng(6)
    layer = LayerNormLSTM(U, recurrent_dropout=0.5, seed=3)
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer(x)
    _randomize(layer, rng)
    y_ref = numpy_lstm(x, [T] * B, layer.get_weights(), U)[0]
    np.testing.assert_allclose(to_numpy(layer(x)), y_ref, atol=1e-5)  # inference: no dropout
    assert np.abs(to_numpy(layer(x, training=True)) - y_ref).max() > 1e-4

    fixed = (rng.uniform(size=(B, U)) > 0.5).astype("float32") * 2.0
    layer.cell.sample_recurrent_dropout_mask = lambda batch_size: ops.convert_to_tensor(fixed)
    y = to_numpy(layer(x, training=True))
    np.testing.assert_allclose(
        y, numpy_lstm(x, [T] * B, layer.get_weights(), U, recurrent_mask=fixed)[0], atol=1e-5)

    # keras.layers.RNN pre-draws the mask once per call (the training path runs).
    rnn = keras.layers.RNN(layer.cell, return_sequences=True)
    assert tuple(rnn(x, training=True).shape) == (B, T, U)


def test_config_roundtrips():
    x = np.random.default_rng(7).normal(size=(2, T, D)).astype("float32")
    mask = _lengths_mask([T, 3])
    cell = LayerNormLSTMCell(U, output_activation="tanh", cell_clip=5.0, recurrent_dropout=0.1,
                             kernel_initializer=keras.initializers.RandomUniform(-0.1, 0.1))
    config = cell.get_config()
    assert config["kernel_initializer"]["config"]["maxval"] == 0.1
    assert config["output_activation"] == "tanh" and config["cell_clip"] == 5.0
    assert_config_roundtrip(cell, lambda c: c(x[:, 0], c.get_initial_state(batch_size=2))[0])
    layer = LayerNormLSTM(U, go_backwards=True, return_state=True, forget_bias=0.5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert clone.get_config() == layer.get_config()
    assert clone.go_backwards and clone.return_state and clone.cell.forget_bias == 0.5
    bi = BidirectionalLayerNormLSTM(U, layer_norm_epsilon=1e-5, seed=4)
    clone = assert_config_roundtrip(bi, lambda l: l(x, mask=mask))
    assert clone.forward_layer.cell.layer_norm_epsilon == 1e-5
    assert clone.get_config()["output_activation"] is None


def test_saved_keras_model_roundtrip(tmp_path):
    x = np.random.default_rng(8).normal(size=(2, T, D)).astype("float32")
    mask = _lengths_mask([T, 3])
    inputs = keras.Input((None, D), name="x")
    mask_in = keras.Input((None,), dtype="bool", name="mask")
    h = BidirectionalLayerNormLSTM(U, name="bi")(inputs, mask=mask_in)
    h = LayerNormLSTM(U, output_activation="tanh", name="uni")(h, mask=mask_in)
    model = keras.Model([inputs, mask_in], h)
    expected = to_numpy(model([x, mask]))
    path = str(tmp_path / "lstm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded([x, mask])), expected, atol=1e-6)
    assert loaded.get_layer("uni").cell.output_activation is not None


def _cell_steps(cell):
    x = np.random.default_rng(9).normal(size=(2, T, D)).astype("float32")
    state, out = cell.get_initial_state(batch_size=2), {}
    for t in range(3):
        h, state = cell(x[:, t], state)
    out["h"], out["c"] = h, state[1]
    return out


def _sequence(layer):
    x = np.random.default_rng(9).normal(size=(2, T, D)).astype("float32")
    mask = _lengths_mask([T, 3])
    if isinstance(layer, BidirectionalLayerNormLSTM):
        return {"y": layer(x, mask=mask)}
    y, h, c = layer(x, mask=mask)
    return {"y": y, "h": h, "c": c}


@pytest.mark.parametrize("make", [
    lambda d: LayerNormLSTMCell(U, dtype=d),
    lambda d: LayerNormLSTM(U, return_state=True, go_backwards=True, dtype=d),
    lambda d: BidirectionalLayerNormLSTM(U, dtype=d),
])
def test_mixed_precision_policy(make):
    """bfloat16 outputs and h; the cell state c stays float32 (it accumulates over the
    sequence); float32 variables; close to the float32 layer."""
    layer = make("float32")
    call = _cell_steps if isinstance(layer, LayerNormLSTMCell) else _sequence
    float32 = () if isinstance(layer, BidirectionalLayerNormLSTM) else ("c",)
    assert_mixed_precision(make, call, float32=float32, atol=0.1)
