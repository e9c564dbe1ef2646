"""DeepNorm (Wang et al. 2022) and Admin (Liu et al. 2020): constants, initialisation scale,
residual form, the config's combinations, cached decoding and serialisation (backend-agnostic;
re-run under JAX)."""

import math

import numpy as np
import pytest
import keras

from deep_nmt_tf.config import ConfigError, config_from_dict
from deep_nmt_tf.layers import (BlockScaled, Residual, TransformerDecoderLayer,
                                TransformerEncoderLayer, admin_omega, deepnorm_constants,
                                resolve_deep_residual)
from deep_nmt_tf.models import build_model
from keras_test_utils import assert_config_roundtrip, to_numpy

D = 16
# The other model tests' batch (the JAX re-run compiles each shape's ops once per run).
SRC = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], "int32")


def _ln(x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def _tree(encoder_layers=3, decoder_layers=2, method="deepnorm", decoder_method=None,
          encoder_extra=None, decoder=None, **scaling):
    enc = {"num_layers": encoder_layers, "num_heads": 2, "ffn_dim": 32,
           "residual_scaling": {"method": method, **scaling}}
    enc.update(encoder_extra or {})
    dec = decoder or {"type": "transformer", "transformer": {
        "num_layers": decoder_layers, "num_heads": 2, "ffn_dim": 32,
        "residual_scaling": {"method": decoder_method or method}}}
    return {"model": {"vocab_size": 40, "d_model": D,
                      "tie_source_target_embeddings": decoder is None,
                      "encoder": {"type": "transformer", "transformer": enc},
                      "decoder": dec},
            "data": {"corpus": "synthetic"}}


def _config(**kwargs):
    return config_from_dict(_tree(**kwargs), source="<test>")


# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------


def test_deepnorm_constants_follow_the_paper_not_torchscale():
    n, m = 18, 4
    alpha, beta = deepnorm_constants(n, m, "encoder")
    assert alpha == pytest.approx(0.81 * (n ** 4 * m) ** (1 / 16))
    assert beta == pytest.approx(0.87 * (n ** 4 * m) ** (-1 / 16))   # torchscale: 1.15
    alpha, beta = deepnorm_constants(n, m, "decoder")
    assert (alpha, beta) == (pytest.approx((3 * m) ** 0.25), pytest.approx((12 * m) ** -0.25))
    assert deepnorm_constants(6, 6, "encoder")[0] == pytest.approx(0.81 * 6 ** (5 / 16))
    with pytest.raises(ValueError, match="side"):
        deepnorm_constants(6, 6, "middle")


def test_admin_omega_is_the_profiling_free_o_log_n_value():
    for n in (1, 2, 12, 36):
        assert admin_omega(n) == pytest.approx(math.sqrt((n + 1) / math.log(n + 1) - 1))
    with pytest.raises(ValueError):
        admin_omega(0)


def test_resolve_uses_formulas_only_for_unset_constants():
    r = resolve_deep_residual("deepnorm", "encoder", 18, 18, 4)
    assert (r["residual_scale"], r["init_scale"]) == pytest.approx(
        deepnorm_constants(18, 4, "encoder"))
    assert r["learnable_residual_scale"] is False
    r = resolve_deep_residual("deepnorm", "decoder", 4, 18, 4, alpha=3.0)
    assert r["residual_scale"] == 3.0
    assert r["init_scale"] == pytest.approx((12 * 4) ** -0.25)
    with pytest.raises(ValueError, match="set alpha and beta"):
        resolve_deep_residual("deepnorm", "encoder", 6, 6, None)
    assert resolve_deep_residual("deepnorm", "encoder", 6, None, None, alpha=2.0,
                                 beta=0.5)["init_scale"] == 0.5
    r = resolve_deep_residual("admin", "encoder", 18)
    assert r["residual_scale"] == pytest.approx(admin_omega(36))
    assert r["learnable_residual_scale"] is True and r["init_scale"] == 1.0
    assert resolve_deep_residual("admin", "decoder", 4)["residual_scale"] == pytest.approx(
        admin_omega(12))
    assert resolve_deep_residual("none", "encoder", 6) is None


# --------------------------------------------------------------------------------------------
# Residual form and initialisation
# --------------------------------------------------------------------------------------------


def test_residual_post_norm_with_a_constant_alpha():
    rs = np.random.RandomState(0)
    x, y = rs.randn(2, 3, D).astype("float32"), rs.randn(2, 3, D).astype("float32")
    res = Residual("post", scale=2.5)
    np.testing.assert_allclose(to_numpy(res.outputs(x, y)), _ln(2.5 * x + y), atol=1e-5)
    assert not res.trainable_weights or all("omega" not in w.path for w in res.weights)
    plain = Residual("post")
    np.testing.assert_allclose(to_numpy(plain.outputs(x, y)), _ln(x + y), atol=1e-5)


def test_residual_admin_omega_is_a_learnable_vector():
    rs = np.random.RandomState(1)
    x, y = rs.randn(2, 3, D).astype("float32"), rs.randn(2, 3, D).astype("float32")
    res = Residual("post", scale=1.7, learnable_scale=True)
    res.build((None, None, D))
    omega = [w for w in res.trainable_weights if w.path.endswith("omega")]
    assert len(omega) == 1 and tuple(omega[0].shape) == (D,)
    np.testing.assert_allclose(to_numpy(omega[0]), np.full(D, 1.7), atol=1e-7)
    w = rs.rand(D).astype("float32") + 0.5
    omega[0].assign(w)
    np.testing.assert_allclose(to_numpy(res.outputs(x, y)), _ln(w * x + y), atol=1e-5)
    clone = assert_config_roundtrip(res, lambda layer: layer.outputs(x, y))
    assert clone.learnable_scale and clone.scale == 1.7


def test_residual_scale_needs_post_norm():
    with pytest.raises(ValueError, match="post"):
        Residual("pre", scale=2.0)
    with pytest.raises(ValueError, match="post"):
        Residual("pre", learnable_scale=True)


def test_block_scaled_scales_only_its_blocks_and_serialises():
    init = BlockScaled("ones", [1.0, 1.0, 0.25])
    values = to_numpy(init((2, 6)))
    np.testing.assert_allclose(values, [[1, 1, 1, 1, 0.25, 0.25]] * 2)
    clone = keras.initializers.deserialize(keras.initializers.serialize(init))
    np.testing.assert_allclose(to_numpy(clone((2, 6))), values)
    with pytest.raises(ValueError, match="blocks"):
        BlockScaled("ones", [1.0, 2.0])((2, 5))


def _std(weight):
    return float(np.std(to_numpy(weight)))


def test_deepnorm_beta_scales_ffn_value_and_output_projections_only():
    """Glorot-uniform draws with and without beta: the FFN, value and output kernels shrink by
    beta; the query and key kernels (and the cross-attention query) keep their scale."""
    beta, d, f = 0.25, 64, 256
    plain = TransformerDecoderLayer(d, 4, f)
    scaled = TransformerDecoderLayer(d, 4, f, residual_scale=2.0, init_scale=beta)
    for layer in (plain, scaled):
        layer.build((None, None, d))

    def ratio(get):
        return _std(get(scaled)) / _std(get(plain))

    third = slice(None), slice(2 * d, 3 * d)
    assert ratio(lambda m: m.ffn.kernel1) == pytest.approx(beta, rel=0.08)
    assert ratio(lambda m: m.ffn.kernel2) == pytest.approx(beta, rel=0.08)
    assert ratio(lambda m: m.self_attention.output_kernel) == pytest.approx(beta, rel=0.08)
    assert ratio(lambda m: to_numpy(m.self_attention.qkv_kernel)[third]) == pytest.approx(
        beta, rel=0.08)
    assert ratio(lambda m: to_numpy(m.self_attention.qkv_kernel)[:, :2 * d]) == pytest.approx(
        1.0, rel=0.08)
    assert ratio(lambda m: to_numpy(m.cross_attention.kv_kernel)[:, d:]) == pytest.approx(
        beta, rel=0.08)
    assert ratio(lambda m: to_numpy(m.cross_attention.kv_kernel)[:, :d]) == pytest.approx(
        1.0, rel=0.08)
    assert ratio(lambda m: m.cross_attention.q_kernel) == pytest.approx(1.0, rel=0.08)
    assert all(r.scale == 2.0 for r in (scaled.self_sublayer, scaled.cross_sublayer,
                                        scaled.ffn_sublayer))


def test_layers_with_residual_scaling_round_trip():
    x = np.random.RandomState(2).randn(2, 4, D).astype("float32")
    enc = TransformerEncoderLayer(D, 2, 32, residual_scale=1.5, learnable_residual_scale=True)
    assert_config_roundtrip(enc, lambda layer: layer(x))
    dec = TransformerDecoderLayer(D, 2, 32, residual_scale=2.0, init_scale=0.5)
    assert_config_roundtrip(dec, lambda layer: layer(x, x))


# --------------------------------------------------------------------------------------------
# Models from the config
# --------------------------------------------------------------------------------------------


def _sublayers(stack):
    for layer in stack.layers_:
        for name in ("attention_sublayer", "self_sublayer", "cross_sublayer", "ffn_sublayer"):
            if hasattr(layer, name):
                yield getattr(layer, name)


def test_deepnorm_model_gets_each_sides_constants():
    model = build_model(_config(encoder_layers=5, decoder_layers=3))
    model(dict(source_ids=SRC, target_input_ids=TGT))
    enc_alpha, enc_beta = deepnorm_constants(5, 3, "encoder")
    dec_alpha, dec_beta = deepnorm_constants(5, 3, "decoder")
    assert [r.scale for r in _sublayers(model.encoder)] == pytest.approx([enc_alpha] * 10)
    assert [r.scale for r in _sublayers(model.decoder)] == pytest.approx([dec_alpha] * 9)
    assert [layer.init_scale for layer in model.encoder.layers_] == pytest.approx([enc_beta] * 5)
    assert [layer.init_scale for layer in model.decoder.layers_] == pytest.approx([dec_beta] * 3)
    assert not [w for w in model.weights if "omega" in w.path]


def test_admin_model_has_one_omega_per_residual_sublayer():
    model = build_model(_config(encoder_layers=3, decoder_layers=2, method="admin"))
    model(dict(source_ids=SRC, target_input_ids=TGT))
    for stack, per_layer in ((model.encoder, 2), (model.decoder, 3)):
        omegas = [r.omega for r in _sublayers(stack)]
        assert len(omegas) == per_layer * stack.num_layers
        n = per_layer * stack.num_layers
        for w in omegas:
            assert tuple(w.shape) == (D,)
            np.testing.assert_allclose(to_numpy(w), np.full(D, admin_omega(n)), rtol=1e-6)
    trainable = {id(w) for w in model.trainable_weights}
    assert all(id(r.omega) in trainable for s in (model.encoder, model.decoder)
               for r in _sublayers(s))


def test_explicit_constants_override_the_formulas():
    model = build_model(_config(alpha=3.0, beta=0.5))
    model(dict(source_ids=SRC, target_input_ids=TGT))
    assert {r.scale for r in _sublayers(model.encoder)} == {3.0}
    assert {layer.init_scale for layer in model.encoder.layers_} == {0.5}


@pytest.mark.parametrize("method", ["deepnorm", "admin"])
def test_cached_decoding_equals_teacher_forcing(method):
    model = build_model(_config(method=method))
    model(dict(source_ids=SRC, target_input_ids=TGT))
    rs = np.random.RandomState(3)
    for v in model.weights:
        if not v.path.endswith("omega"):
            v.assign((rs.randn(*v.shape) * 0.3).astype("float32"))
    full = to_numpy(model(dict(source_ids=SRC, target_input_ids=TGT)))
    state = model.init_decoder_state(model.encode(SRC), max_length=TGT.shape[1])
    for t in range(TGT.shape[1]):
        logits, state = model.decode_step(TGT[:, t], np.int32(t), state)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=2e-4, rtol=1e-4)


def test_deepnorm_with_transparent_attention_and_shortcuts_builds():
    tree = _tree(method="admin", encoder_extra={"lexical_shortcuts": {"enabled": True}})
    tree["model"]["transparent_attention"] = {"enabled": True}
    model = build_model(config_from_dict(tree, source="<test>"))
    logits = model(dict(source_ids=SRC, target_input_ids=TGT))
    assert np.isfinite(to_numpy(logits)).all()


@pytest.mark.parametrize("kwargs", [
    dict(method="deepnorm", encoder_extra={"lexical_shortcuts": {
        "enabled": True, "variant": "feature_fusion"}}),
    dict(method="deepnorm", decoder_method="none"),  # one stack scaled, the other plain
    dict(method="none", decoder_method="admin"),
])
def test_the_combinations_the_config_reference_calls_defined_build(kwargs):
    """docs/CONFIG.md, "Combining the deep methods": what it calls defined builds and runs."""
    from deep_nmt_tf.config.reference import COMBINATIONS

    assert dict(COMBINATIONS)["DeepNorm or Admin in one stack only"].startswith("yes")
    model = build_model(config_from_dict(_tree(**kwargs), source="<test>"))
    assert np.isfinite(to_numpy(model(dict(source_ids=SRC, target_input_ids=TGT)))).all()


def test_model_config_round_trip_keeps_the_scaling():
    model = build_model(_config(method="admin"))
    model(dict(source_ids=SRC, target_input_ids=TGT))
    config = model.encoder.get_config()
    assert config["residual_scaling"]["learnable_residual_scale"] is True
    clone = type(model.encoder).from_config(config)
    assert clone.residual_scaling == model.encoder.residual_scaling


# --------------------------------------------------------------------------------------------
# The combinations the config refuses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(encoder_extra={"norm": "pre"}), "not defined with .*norm: pre"),
    (dict(method="admin", encoder_extra={"dlcl": {"enabled": True}}), "not defined with DLCL"),
    (dict(method="none", alpha=2.0), "alpha: set, but .*method is 'none'"),
    (dict(method="admin", beta=0.5), "beta: is not a constant of Admin"),
    (dict(omega=2.0), "omega: is not a constant of DeepNorm"),
    (dict(decoder={"type": "rnmt_plus", "rnmt_plus": {"num_layers": 2}}),
     "set alpha and beta explicitly"),
])
def test_undefined_combinations_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        _config(**kwargs)


def test_deepnorm_beside_an_rnmt_decoder_with_explicit_constants():
    cfg = _config(alpha=2.0, beta=0.4,
                  decoder={"type": "rnmt_plus", "rnmt_plus": {"num_layers": 2}})
    assert cfg.model.encoder.get().residual_scaling.alpha == 2.0
