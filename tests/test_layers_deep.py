"""Deep-network layers: transparent attention, DLCL, lexical shortcuts (backend-agnostic; re-run
under JAX).  Each layer is checked against a NumPy transcription of its paper's equations, for
its special cases, its parameter count and its config round trip."""

import numpy as np
import pytest

from deep_nmt_tf.layers.dlcl import DynamicLinearCombination, dlcl_initial_weights, dlcl_mask
from deep_nmt_tf.layers.lexical_shortcuts import LexicalShortcut
from deep_nmt_tf.layers.transparent_attention import TransparentAttention
from keras_test_utils import JAX_RERUN, assert_config_roundtrip, assert_mixed_precision, to_numpy

D = 8


def _xs(n, b=2, t=3, d=D, seed=0):
    rs = np.random.RandomState(seed)
    return [rs.randn(b, t, d).astype("float32") * (k + 1) for k in range(n)]


def _ln(x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------------------------
# Transparent attention
# --------------------------------------------------------------------------------------------


def test_transparent_attention_starts_uniform_and_matches_eq2():
    mix = TransparentAttention(num_sources=4, num_outputs=3)
    srcs = _xs(4)
    out = to_numpy(mix(srcs))
    assert out.shape == (3, 2, 3, D)
    np.testing.assert_allclose(to_numpy(mix.mix_weights()), np.full((4, 3), 0.25), atol=1e-7)
    for j in range(3):
        np.testing.assert_allclose(out[j], np.mean(srcs, axis=0), atol=1e-5)
    # Eq. 1-2 with arbitrary weights; list and stacked inputs agree.
    w = np.random.RandomState(1).randn(4, 3).astype("float32")
    mix.mix_logits.assign(w)
    s = np.exp(w) / np.exp(w).sum(0, keepdims=True)
    ref = np.einsum("nm,nbsd->mbsd", s, np.stack(srcs))
    np.testing.assert_allclose(to_numpy(mix(srcs)), ref, atol=1e-5)
    np.testing.assert_allclose(to_numpy(mix(np.stack(srcs))), ref, atol=1e-5)


def test_transparent_attention_one_hot_selects_a_source():
    mix = TransparentAttention(num_sources=5, num_outputs=2)
    srcs = _xs(5)
    logits = np.zeros((5, 2), "float32")
    logits[4, 0] = 1e4   # module 0: the top layer only
    logits[0, 1] = 1e4   # module 1: the embeddings only
    mix.build()
    mix.mix_logits.assign(logits)
    out = to_numpy(mix(srcs))
    np.testing.assert_array_equal(out[0], srcs[4])
    np.testing.assert_array_equal(out[1], srcs[0])


def test_transparent_attention_dropout_on_logits_in_training_only():
    mix = TransparentAttention(num_sources=6, num_outputs=4, weight_dropout=0.5)
    mix.build()
    w = np.random.RandomState(2).randn(6, 4).astype("float32")
    mix.mix_logits.assign(w)
    s = np.exp(w) / np.exp(w).sum(0, keepdims=True)
    np.testing.assert_allclose(to_numpy(mix.mix_weights(training=False)), s, atol=1e-6)
    dropped = to_numpy(mix.mix_weights(training=True))
    np.testing.assert_allclose(dropped.sum(0), np.ones(4), atol=1e-5)  # still a distribution
    assert np.abs(dropped - s).max() > 1e-3
    srcs = _xs(6)
    np.testing.assert_array_equal(to_numpy(mix(srcs)), to_numpy(mix(srcs, training=False)))


def test_transparent_attention_min_probability():
    mix = TransparentAttention(num_sources=4, num_outputs=2, min_probability=0.1)
    mix.build()
    mix.mix_logits.assign(np.array([[50.0, 0], [0, 0], [0, 0], [0, 0]], "float32"))
    s = to_numpy(mix.mix_weights())
    assert s.min() >= 0.1 - 1e-6
    np.testing.assert_allclose(s.sum(0), [1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(s[:, 0], [0.7, 0.1, 0.1, 0.1], atol=1e-5)
    with pytest.raises(ValueError, match="min_probability"):
        TransparentAttention(num_sources=21, num_outputs=6, min_probability=0.1)


def test_transparent_attention_params_and_config_roundtrip():
    mix = TransparentAttention(num_sources=21, num_outputs=6, weight_dropout=0.2,
                               min_probability=0.01)
    srcs = _xs(21, t=2)
    mix(srcs)
    assert mix.count_params() == 21 * 6
    mix.mix_logits.assign(np.random.RandomState(3).randn(21, 6).astype("float32"))
    assert_config_roundtrip(mix, lambda m: m(srcs))


def _randomized(layer, seed=11):
    layer.set_weights([np.random.RandomState(seed).randn(*w.shape).astype("float32")
                       for w in layer.get_weights()])
    return layer


def test_transparent_attention_mixed_bfloat16_keeps_float32_mixing_weights():
    """The logits and the softmax-normalised mix stay float32; the mixed sources do not."""
    assert_mixed_precision(
        lambda d: _randomized(_built(TransparentAttention(4, 2, dtype=d))),
        lambda m: {"mix": m(_xs(4)), "weights": m.mix_weights()}, float32=("weights",),
        atol=0.1)


def _built(layer, *args):
    layer.build(*args)
    return layer


# --------------------------------------------------------------------------------------------
# DLCL
# --------------------------------------------------------------------------------------------


def test_dlcl_masks_and_initialisation_follow_the_reference():
    avg = dlcl_initial_weights(3, "avg")
    np.testing.assert_allclose(avg, [[1, 0, 0, 0], [.5, .5, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0],
                                     [.25, .25, .25, .25]], atol=1e-7)
    np.testing.assert_array_equal(dlcl_initial_weights(3, "one"), np.tril(np.ones((4, 4))))
    np.testing.assert_array_equal(dlcl_mask(3, window=2), [[1, 0, 0, 0], [1, 1, 0, 0],
                                                          [0, 1, 1, 0], [0, 0, 1, 1]])
    np.testing.assert_allclose(dlcl_initial_weights(3, "avg", window=2)[3], [0, 0, .5, .5])
    layer = DynamicLinearCombination(3, D)
    layer.build()
    np.testing.assert_allclose(to_numpy(layer.weight_matrix()), avg, atol=1e-7)
    one = DynamicLinearCombination(3, D, init="one")
    one.build()
    np.testing.assert_allclose(to_numpy(one.weight_matrix()), np.tril(np.ones((4, 4))))


def _dlcl_reference(ys, w, norm, layer_norm=True, normalize_embedding=False):
    """Eq. 8/9 for the last row (LayerNorm gamma=1, beta=0 as initialised)."""
    row = len(ys) - 1
    if norm == "pre":
        stored = [(_ln(y) if layer_norm and (k > 0 or normalize_embedding) else y)
                  for k, y in enumerate(ys)]
        return sum(w[row, k] * stored[k] for k in range(row + 1))
    acc = sum(w[row, k] * ys[k] for k in range(row + 1))
    return _ln(acc) if layer_norm and (row > 0 or normalize_embedding) else acc


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("layer_norm,normalize_embedding", [(True, False), (True, True),
                                                            (False, False)])
def test_dlcl_matches_eq8_eq9(norm, layer_norm, normalize_embedding):
    layer = DynamicLinearCombination(3, D, norm=norm, layer_norm=layer_norm,
                                     normalize_embedding=normalize_embedding)
    ys = _xs(4)
    layer.build()
    w = np.tril(np.random.RandomState(4).randn(4, 4)).astype("float32")
    layer.weight.assign(w)
    np.testing.assert_allclose(to_numpy(layer(ys)),
                               _dlcl_reference(ys, w, norm, layer_norm, normalize_embedding),
                               atol=1e-4)
    # Intermediate rows (the inputs of layers 1..3) as the stacks use them.
    stored = [layer.store(y, k) for k, y in enumerate(ys)]
    for row in range(3):
        np.testing.assert_allclose(to_numpy(layer.combine(stored[: row + 1], row)),
                                   _dlcl_reference(ys[: row + 1], w, norm, layer_norm,
                                                   normalize_embedding), atol=1e-4)


def test_dlcl_masked_entries_never_contribute():
    layer = DynamicLinearCombination(3, D, norm="pre", window=2, softmax=True)
    layer.build()
    ys = _xs(4)
    before = to_numpy(layer(ys))
    w = to_numpy(layer.weight)
    w_bad = w + 1e3 * (1.0 - dlcl_mask(3, window=2))  # write into every masked entry
    layer.weight.assign(w_bad)
    np.testing.assert_array_equal(to_numpy(layer(ys)), before)
    eff = to_numpy(layer.weight_matrix())
    np.testing.assert_array_equal(eff * (1 - dlcl_mask(3, window=2)), np.zeros((4, 4)))
    np.testing.assert_allclose(eff.sum(1), np.ones(4), atol=1e-6)  # softmax rows


@pytest.mark.parametrize("weights,expected", [("one", np.tril(np.ones((4, 4)))),
                                              ("avg", dlcl_initial_weights(3, "avg"))])
def test_dlcl_fixed_weights_have_no_variable(weights, expected):
    layer = DynamicLinearCombination(3, D, weights=weights, layer_norm=False)
    ys = _xs(4)
    layer(ys)
    assert len(layer.weights) == 0
    np.testing.assert_allclose(to_numpy(layer.weight_matrix()), expected, atol=1e-7)
    np.testing.assert_allclose(to_numpy(layer(ys)), _dlcl_reference(ys, expected, "pre", False),
                               atol=1e-5)


def test_dlcl_residual_special_case():
    """W[l, l] = 1, window 1, no DLCL LayerNorm: x_{l+1} = y_l (a plain residual stack)."""
    for norm in ("pre", "post"):
        layer = DynamicLinearCombination(3, D, norm=norm, weights="one", window=1,
                                         layer_norm=False)
        ys = _xs(4)
        stored = [layer.store(y, k) for k, y in enumerate(ys)]
        for row in range(4):
            np.testing.assert_array_equal(to_numpy(layer.combine(stored, row)), ys[row])


def test_dlcl_parameter_count_and_config_roundtrip():
    # 30 layers (Wang et al.'s deepest); 6 on the JAX re-run, where each of the (row, input)
    # weights the combinations read compiles its own op.
    n = 6 if JAX_RERUN else 30
    layer = DynamicLinearCombination(n, D, norm="pre", normalize_embedding=True, window=4,
                                     softmax=True)
    ys = _xs(n + 1, t=2)
    layer(ys)
    # weights + one LN per stored output
    assert layer.count_params() == (n + 1) * (n + 1) + (n + 1) * 2 * D
    layer.weight.assign(np.random.RandomState(5).randn(n + 1, n + 1).astype("float32"))
    assert_config_roundtrip(layer, lambda l: l(ys), atol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_dlcl_history_rows_equal_combine(norm):
    """The running history (what the stacks use) gives every row exactly as combine()."""
    layer = DynamicLinearCombination(3, D, norm=norm, window=2)
    layer.build()
    layer.weight.assign(np.tril(np.random.RandomState(4).randn(4, 4)).astype("float32"))
    ys = _xs(4)
    stored = [layer.store(y, k) for k, y in enumerate(ys)]
    history = layer.start(ys[0])
    for row in range(4):
        np.testing.assert_allclose(to_numpy(history.next_input()),
                                   to_numpy(layer.combine(stored[: row + 1], row)), atol=1e-6)
        if row < 3:
            history.add(ys[row + 1])
    with pytest.raises(ValueError, match="already added"):
        history.add(ys[0])


def test_dlcl_mixed_bfloat16_keeps_float32_weights():
    assert_mixed_precision(
        lambda d: _randomized(_built(DynamicLinearCombination(3, D, norm="post", dtype=d))),
        lambda l: {"top": l(_xs(4)), "weights": l.weight_matrix()}, float32=("weights",),
        atol=0.1)


def test_dlcl_rejects_normalize_embedding_without_layer_norm():
    with pytest.raises(ValueError, match="normalize_embedding"):
        DynamicLinearCombination(3, D, layer_norm=False, normalize_embedding=True)


# --------------------------------------------------------------------------------------------
# Lexical shortcuts
# --------------------------------------------------------------------------------------------


def _shortcut_inputs(seed=6):
    rs = np.random.RandomState(seed)
    e, h, k, v = (rs.randn(2, 4, D).astype("float32") for _ in range(4))
    return e, h, k, v


def test_lexical_shortcut_matches_eq5_to_eq12():
    sc = LexicalShortcut(D)
    e, h, k, v = _shortcut_inputs()
    sc(e, h, k, v)
    rs = np.random.RandomState(7)
    sc.key_gate_bias.assign(rs.randn(D).astype("float32"))
    sc.value_gate_bias.assign(rs.randn(D).astype("float32"))
    w = to_numpy(sc.source_kernel)
    k_sc, v_sc = e @ w[:, :D], e @ w[:, D:]
    rk = _sigmoid(k_sc + k + to_numpy(sc.key_gate_bias))
    rv = _sigmoid(v_sc + v + to_numpy(sc.value_gate_bias))
    gk, gv, (gate_k, gate_v) = sc(e, h, k, v, return_gates=True)
    np.testing.assert_allclose(to_numpy(gk), rk * k_sc + (1 - rk) * k, atol=1e-5)
    np.testing.assert_allclose(to_numpy(gv), rv * v_sc + (1 - rv) * v, atol=1e-5)
    np.testing.assert_allclose(to_numpy(gate_k), rk, atol=1e-6)
    np.testing.assert_allclose(to_numpy(gate_v), rv, atol=1e-6)


def test_feature_fusion_matches_eq13_eq14():
    sc = LexicalShortcut(D, variant="feature_fusion")
    e, h, _, _ = _shortcut_inputs()
    # The attention's own key/value projection of H (with bias) is the H -> hidden-half block.
    rs = np.random.RandomState(8)
    wk_h, wv_h, bk, bv = rs.randn(D, D), rs.randn(D, D), rs.randn(D), rs.randn(D)
    k, v = (h @ wk_h + bk).astype("float32"), (h @ wv_h + bv).astype("float32")
    gk, gv = (to_numpy(t) for t in sc(e, h, k, v))
    ws, wh = to_numpy(sc.source_kernel), to_numpy(sc.hidden_kernel)
    # Assemble W^K = [[E->sc, E->hidden], [H->sc, H->hidden]] ([2D, 2D]) and likewise W^V.
    w_key = np.block([[ws[:, :D], ws[:, D:2 * D]], [wh[:, :D], wk_h]])
    w_val = np.block([[ws[:, 2 * D:3 * D], ws[:, 3 * D:]], [wh[:, D:], wv_h]])
    eh = np.concatenate([e, h], -1)
    k_sc, k_h = np.split(eh @ w_key + np.concatenate([np.zeros(D), bk]), 2, -1)
    v_sc, v_h = np.split(eh @ w_val + np.concatenate([np.zeros(D), bv]), 2, -1)
    rk, rv = _sigmoid(k_sc + k_h), _sigmoid(v_sc + v_h)  # gate biases start at zero
    np.testing.assert_allclose(gk, rk * k_sc + (1 - rk) * k_h, atol=1e-4)
    np.testing.assert_allclose(gv, rv * v_sc + (1 - rv) * v_h, atol=1e-4)


@pytest.mark.parametrize("variant", ["shortcuts", "feature_fusion"])
def test_lexical_shortcut_gate_extremes(variant):
    sc = LexicalShortcut(D, variant=variant)
    e, h, k, v = _shortcut_inputs()
    sc(e, h, k, v)
    k_sc, k_h, v_sc, v_h = (to_numpy(t) for t in sc.shortcut_key_value(e, h, k, v))
    for bias, exp_k, exp_v in ((-1e9, k_h, v_h), (1e9, k_sc, v_sc)):
        sc.key_gate_bias.assign(np.full(D, bias, "float32"))
        sc.value_gate_bias.assign(np.full(D, bias, "float32"))
        gk, gv = sc(e, h, k, v)
        np.testing.assert_array_equal(to_numpy(gk), exp_k)
        np.testing.assert_array_equal(to_numpy(gv), exp_v)
    if variant == "shortcuts":  # closed gate: exactly the attention's own keys and values
        np.testing.assert_array_equal(k_h, k)
        np.testing.assert_array_equal(v_h, v)


@pytest.mark.parametrize("variant,extra", [("shortcuts", 2 * 512 * 512 + 2 * 512),
                                           ("feature_fusion", 6 * 512 * 512 + 2 * 512)])
def test_lexical_shortcut_parameter_count(variant, extra):
    sc = LexicalShortcut(512, variant=variant)
    sc.build()
    assert sc.count_params() == extra


def test_lexical_shortcut_initialisation_scale():
    """Glorot-uniform over the reference's logical matrices ([D, D]; fused [2D, 2D])."""
    sc = LexicalShortcut(256)
    sc.build()
    w = to_numpy(sc.source_kernel)
    assert np.abs(w).max() <= np.sqrt(6.0 / 512) + 1e-6
    assert np.abs(w).max() > 0.9 * np.sqrt(6.0 / 512)
    ff = LexicalShortcut(256, variant="feature_fusion")
    ff.build()
    for w in (to_numpy(ff.source_kernel), to_numpy(ff.hidden_kernel)):
        assert np.sqrt(6.0 / 1024) * 0.9 < np.abs(w).max() <= np.sqrt(6.0 / 1024) + 1e-6
    np.testing.assert_array_equal(to_numpy(sc.key_gate_bias), np.zeros(256))


@pytest.mark.parametrize("variant", ["shortcuts", "feature_fusion"])
def test_lexical_shortcut_config_roundtrip(variant):
    sc = LexicalShortcut(D, variant=variant, gate_bias_initializer="ones")
    e, h, k, v = _shortcut_inputs()
    assert_config_roundtrip(sc, lambda s: s(e, h, k, v))


@pytest.mark.parametrize("variant", ["shortcuts", "feature_fusion"])
def test_lexical_shortcut_mixed_bfloat16(variant):
    e, h, k, v = _shortcut_inputs()
    assert_mixed_precision(
        lambda d: _built(LexicalShortcut(D, variant=variant, dtype=d)),
        lambda s: dict(zip(("k", "v", "gates"), s(e, h, k, v, return_gates=True))), atol=0.15)
