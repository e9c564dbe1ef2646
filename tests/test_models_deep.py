"""Deep-network methods wired into the Transformer: equivalences with the plain model, cached
decoding, parameter counts against the papers, configs, serialisation, no dead config keys
(backend-agnostic; re-run under JAX)."""

import functools
import os
import zlib

import numpy as np
import pytest
import keras

from deep_nmt_tf.config import ConfigError, load_config
from deep_nmt_tf.layers.dlcl import dlcl_initial_weights
from deep_nmt_tf.models import Seq2SeqModel, build_model
from config_trees import config, merge, model_config, stacks, transformer
from keras_test_utils import assert_config_roundtrip, assert_model_mixed_precision, to_numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The other model tests' batch (the JAX re-run compiles each shape's ops once per run).
SRC = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], "int32")
INPUTS = {"source_ids": SRC, "target_input_ids": TGT}
SMALL = transformer(40, 16, num_heads=2, ffn_dim=32, encoder_layers=3, decoder_layers=2)


def _dlcl(encoder=True, decoder=True, **options):
    """DLCL sections of both stacks (enabled as given; the same options in each)."""
    return stacks(encoder={"dlcl": dict(options, enabled=encoder)},
                  decoder={"dlcl": dict(options, enabled=decoder)})


def _shortcuts(placement="self", **options):
    """Lexical shortcuts in both stacks: the decoder's on ``placement``'s attentions, the
    encoder's (self-attention only) unless the placement is ``cross``."""
    return stacks(encoder={"lexical_shortcuts": dict(options,
                                                     enabled=placement in ("self", "both"))},
                  decoder={"lexical_shortcuts": dict(options, enabled=True,
                                                     placement=placement)})


def _model(*trees, **both):
    """The small Transformer with ``trees`` (model sections) merged in; ``both``: keys of both
    stacks."""
    return build_model(model_config(merge(SMALL, stacks(both), *trees)))


def _copy_shared_weights(src, dst):
    """Copies every variable of ``src`` into the variable of ``dst`` with the same path;
    returns the paths of ``dst`` that ``src`` lacks (the method's own weights)."""
    by_path = {v.path: v for v in src.weights}
    extra = []
    for v in dst.weights:
        if v.path in by_path:
            v.assign(by_path[v.path])
        else:
            extra.append(v.path)
    return extra


def _randomise(model, seed=0):
    rs = np.random.RandomState(seed)
    for v in model.weights:
        v.assign((rs.randn(*v.shape) * 0.3).astype("float32"))


def _cached_logits(model, src=SRC, tgt=TGT, encoded=None):
    """Logits of incremental decoding, step by step (``encoded``: ``model.encode(src)``)."""
    encoded = model.encode(src) if encoded is None else encoded
    state = model.init_decoder_state(encoded, max_length=tgt.shape[1])
    out = []
    for t in range(tgt.shape[1]):
        logits, state = model.decode_step(tgt[:, t], np.int32(t), state)
        out.append(to_numpy(logits))
    return np.stack(out, 1)


# --------------------------------------------------------------------------------------------
# Cached decoding equals full recomputation, for every variant and combination
# --------------------------------------------------------------------------------------------

TA = {"transparent_attention": {"enabled": True, "min_probability": 0.05}}
DECODER_4 = stacks(decoder={"num_layers": 4})
VARIANTS = {
    "transparent": TA,
    "dlcl_enc_dec": _dlcl(),
    "dlcl_decoder_window_softmax": _dlcl(encoder=False, window=2, softmax=True,
                                         normalize_embedding=True),
    "dlcl_fixed_one_no_ln": _dlcl(weights="one", layer_norm=False),
    "shortcuts_self": _shortcuts(),
    "shortcuts_cross": _shortcuts("cross"),
    "shortcuts_both": _shortcuts("both"),
    "fusion_both": _shortcuts("both", variant="feature_fusion"),
    "non_lexical": merge(DECODER_4, _shortcuts(source="non_lexical")),
    "non_lexical_fusion": merge(DECODER_4, _shortcuts(variant="feature_fusion",
                                                      source="non_lexical")),
    "all_three": merge(TA, _dlcl(), _shortcuts("both")),
    "all_three_fusion_untied": merge(
        TA, _dlcl(window=2), _shortcuts(variant="feature_fusion"),
        {"tie_source_target_embeddings": False}, stacks(decoder={"tie_softmax": False})),
}


#: The combinations whose model also goes through a config round trip and a .keras file.
SERIALISED = {("all_three", "pre"), ("all_three_fusion_untied", "pre"), ("non_lexical", "pre")}


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decoding_equals_teacher_forcing_and_serialization_round_trip(variant, norm,
                                                                            tmp_path):
    """Cached decoding equals teacher forcing; for :data:`SERIALISED`, the config round trip
    and the .keras file keep the outputs, and the loaded model's cached decoding too."""
    model = _model(VARIANTS[variant], norm=norm)
    _randomise(model, seed=1)  # non-trivial DLCL/transparent weights and open/closed gates
    full = to_numpy(model(INPUTS))
    cached = _cached_logits(model)
    mask = TGT != 0
    np.testing.assert_allclose(cached[mask], full[mask], atol=2e-4, rtol=1e-4)
    if (variant, norm) not in SERIALISED:
        return
    assert_config_roundtrip(model, lambda m: m(INPUTS), atol=1e-5)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(INPUTS)), full, atol=1e-5)
    np.testing.assert_allclose(_cached_logits(loaded)[mask], full[mask], atol=2e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------
# Special cases that reproduce the plain Transformer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["all_three", "all_three_fusion_untied"])
def test_mixed_bfloat16_with_float32_logits_and_mixing_weights(variant):
    """Transparent attention, DLCL and lexical shortcuts together under mixed_bfloat16: float32
    logits (teacher forcing and decoding steps) and mixing matrices; bfloat16 beam search."""
    tree = merge(SMALL, VARIANTS[variant])
    assert_model_mixed_precision(lambda d: build_model(model_config(tree), dtype=d), SRC,
                                 TGT)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_dlcl_with_residual_weights_reproduces_plain_transformer(norm):
    """DLCL's weights of a plain residual stack (W[l, l] = 1, W[l, k<l] = 0, Wang et al.
    section 3) without the DLCL LayerNorms give x_{l+1} = y_l: the ordinary pre-/post-norm
    Transformer, whose own final LayerNorm (pre-norm) follows the last combination.  As a
    configuration: weights 'one' with window 1; as learned weights: the identity matrix."""
    plain = _model(norm=norm, input_dropout=0.0)
    ref = to_numpy(plain(INPUTS))
    fixed = _model(_dlcl(weights="one", window=1, layer_norm=False), norm=norm,
                   input_dropout=0.0)
    assert _copy_shared_weights(plain, fixed) == []  # no extra variables at all
    np.testing.assert_allclose(to_numpy(fixed(INPUTS)), ref, atol=1e-5)
    np.testing.assert_allclose(_cached_logits(fixed)[TGT != 0], ref[TGT != 0], atol=1e-4)

    learned = _model(_dlcl(layer_norm=False), norm=norm)
    extra = _copy_shared_weights(plain, learned)
    assert sorted(extra) == ["seq2seq/decoder/dlcl/weight", "seq2seq/encoder/dlcl/weight"]
    np.testing.assert_allclose(to_numpy(learned.encoder.dlcl.weight_matrix()),
                               dlcl_initial_weights(3, "avg"), atol=1e-7)  # reference init
    assert np.abs(to_numpy(learned(INPUTS)) - ref).max() > 1e-3
    learned.encoder.dlcl.weight.assign(np.eye(4, dtype="float32"))
    learned.decoder.dlcl.weight.assign(np.eye(3, dtype="float32"))
    np.testing.assert_allclose(to_numpy(learned(INPUTS)), ref, atol=1e-5)


def test_dlcl_pre_norm_final_layer_norm_follows_last_combination():
    model = _model(_dlcl(decoder=False), norm="pre")
    _randomise(model, seed=2)
    enc = model.encoder
    out = enc(SRC)
    ys = out["layer_outputs"]
    stored = [enc.dlcl.store(y, k) for k, y in enumerate(ys)]
    top = enc.dlcl.combine(stored, 3)
    np.testing.assert_allclose(to_numpy(out["memory"]), to_numpy(enc.final_norm(top)),
                               atol=1e-5)


def _one_hot_top(model):
    ta = model.transparent_attention
    logits = np.zeros((ta.num_sources, ta.num_outputs), "float32")
    logits[-1, :] = 1e4
    ta.mix_logits.assign(logits)


def test_transparent_attention_on_top_layer_reproduces_standard_attention():
    """Post-norm: the top layer's raw output is the ordinary memory, so a one-hot mix on it
    reproduces the plain model exactly."""
    plain = _model(norm="post")
    ref = to_numpy(plain(INPUTS))
    ta = _model({"transparent_attention": {"enabled": True}}, norm="post")
    assert _copy_shared_weights(plain, ta) == ["seq2seq/transparent_attention/mix_logits"]
    assert ta.transparent_attention.mix_logits.shape == (3 + 1, 2)  # (N+1) x M, M = dec depth
    assert np.abs(to_numpy(ta(INPUTS)) - ref).max() > 1e-3  # uniform mix at initialisation
    _one_hot_top(ta)
    np.testing.assert_allclose(to_numpy(ta(INPUTS)), ref, atol=1e-5)
    np.testing.assert_allclose(_cached_logits(ta)[TGT != 0], ref[TGT != 0], atol=1e-4)


def test_transparent_attention_pre_norm_mixes_raw_layer_outputs():
    """Pre-norm: the sources are un-normalised (the final LayerNorm belongs to the ordinary
    output only), so a one-hot mix on the top layer attends the raw top output y_N, i.e. the
    plain decoder attending y_N rather than LN(y_N)."""
    plain = _model(norm="pre")
    ta = _model({"transparent_attention": {"enabled": True}}, norm="pre")
    _copy_shared_weights(plain, ta)
    _one_hot_top(ta)
    encoded = ta.encode(SRC)
    memories = to_numpy(ta.decoder_memories(encoded))
    assert memories.shape == (2,) + encoded["layer_outputs"][-1].shape
    for j in range(2):
        np.testing.assert_array_equal(memories[j], to_numpy(encoded["layer_outputs"][-1]))
    ref = plain.decoder(TGT, encoded["layer_outputs"][-1], encoded["mask"])
    np.testing.assert_allclose(to_numpy(ta(INPUTS)), to_numpy(ref), atol=1e-5)
    assert np.abs(to_numpy(ta(INPUTS)) - to_numpy(plain(INPUTS))).max() > 1e-3


@pytest.mark.parametrize("placement", ["self", "cross", "both"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_closed_lexical_shortcut_gates_reproduce_standard_attention(placement, norm):
    plain = _model(norm=norm)
    ref = to_numpy(plain(INPUTS))
    sc = _model(_shortcuts(placement), norm=norm)
    extra = _copy_shared_weights(plain, sc)
    n_attn = {"self": 3 + 2, "cross": 2, "both": 3 + 2 + 2}[placement]
    assert len(extra) == 3 * n_attn
    assert np.abs(to_numpy(sc(INPUTS)) - ref).max() > 1e-3
    for layer in _shortcut_layers(sc):
        layer.key_gate_bias.assign(np.full(layer.d_model, -1e9, "float32"))
        layer.value_gate_bias.assign(np.full(layer.d_model, -1e9, "float32"))
    np.testing.assert_allclose(to_numpy(sc(INPUTS)), ref, atol=1e-5)
    np.testing.assert_allclose(_cached_logits(sc)[TGT != 0], ref[TGT != 0], atol=1e-4)


def _shortcut_layers(model):
    found = []
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers_:
            for name in ("self_shortcut", "cross_shortcut"):
                sub = getattr(layer, name, None)
                if sub is not None:
                    found.append(sub)
    return found


def test_shortcut_sources_lexical_and_non_lexical():
    """Lexical: every layer gets y_0.  Non-lexical (Emelin et al. 4.3): layer n (1-based) gets
    layer n-2's output; layer 2 gets y_0 (n-2 = 0) and layer 1, with no antecedent, y_0 too."""
    outputs = ["y0", "y1", "y2", "y3", "y4", "y5"]
    encoder_6 = stacks(encoder={"num_layers": 6})
    lex = _model(encoder_6, _shortcuts())
    non = _model(encoder_6, _shortcuts(source="non_lexical"))
    for stack in (lex.encoder, lex.decoder):
        assert [stack.shortcut_source(outputs, i) for i in range(6)] == ["y0"] * 6
    for stack in (non.encoder, non.decoder):
        assert [stack.shortcut_source(outputs, i) for i in range(6)] == [
            "y0", "y0", "y1", "y2", "y3", "y4"]
    assert non.count_params() == lex.count_params()  # same connections and parameters
    _copy_shared_weights(lex, non)
    assert np.abs(to_numpy(non(INPUTS)) - to_numpy(lex(INPUTS))).max() > 1e-4


def test_non_lexical_cross_placement_is_rejected():
    with pytest.raises(ConfigError, match="non_lexical"):
        config(_shortcuts("both", source="non_lexical"))
    with pytest.raises(ConfigError, match="normalize_embedding"):
        config(_dlcl(decoder=False, layer_norm=False, normalize_embedding=True))
    with pytest.raises(ValueError, match="min_probability"):
        _model(stacks(encoder={"num_layers": 4}),
               {"transparent_attention": {"enabled": True, "min_probability": 0.25}})


# --------------------------------------------------------------------------------------------
# Diagnostics hooks
# --------------------------------------------------------------------------------------------


def test_diagnostic_weights_and_gate_means():
    model = _model(VARIANTS["all_three"])
    diag = {k: to_numpy(v) for k, v in model.diagnostic_weights().items()}
    assert sorted(diag) == ["decoder_dlcl", "encoder_dlcl", "transparent_attention"]
    np.testing.assert_allclose(diag["transparent_attention"], np.full((4, 2), 0.25), atol=1e-6)
    np.testing.assert_allclose(diag["encoder_dlcl"], dlcl_initial_weights(3, "avg"), atol=1e-7)
    np.testing.assert_allclose(diag["decoder_dlcl"], dlcl_initial_weights(2, "avg"), atol=1e-7)
    gates = {k: float(to_numpy(v)) for k, v in model.lexical_shortcut_gates(INPUTS).items()}
    expected = ([f"encoder/layer_{i}/self/{kv}" for i in range(3) for kv in ("key", "value")] +
                [f"decoder/layer_{i}/{a}/{kv}" for i in range(2) for a in ("self", "cross")
                 for kv in ("key", "value")])
    assert sorted(gates) == sorted(expected)
    assert all(0.0 < g < 1.0 for g in gates.values())
    # Closed gates read 0.
    for layer in _shortcut_layers(model):
        layer.key_gate_bias.assign(np.full(layer.d_model, -1e9, "float32"))
    gates = {k: float(to_numpy(v)) for k, v in model.lexical_shortcut_gates(INPUTS).items()}
    assert all(v == 0.0 for k, v in gates.items() if k.endswith("/key"))
    assert _model().lexical_shortcut_gates(INPUTS) == {}
    assert _model().diagnostic_weights() == {}


def test_encode_exposes_layer_outputs_and_decode_from_encoded():
    model = _model(VARIANTS["all_three"])
    encoded = model.encode(SRC)
    assert len(encoded["layer_outputs"]) == 3 + 1
    np.testing.assert_allclose(to_numpy(model.decode(encoded, TGT)), to_numpy(model(INPUTS)),
                               atol=1e-6)


# --------------------------------------------------------------------------------------------
# Serialisation
# --------------------------------------------------------------------------------------------


# (The model's round trip: test_cached_decoding_equals_teacher_forcing_and_serialization_....)


def test_stack_serialization_round_trip():
    model = _model(VARIANTS["all_three"], norm="post")
    _randomise(model, seed=4)
    assert_config_roundtrip(model.encoder, lambda e: e(SRC)["memory"], atol=1e-5)


# --------------------------------------------------------------------------------------------
# Every declared key of the three config sections takes effect (no dead flags)
# --------------------------------------------------------------------------------------------

_ON = merge({"transparent_attention": {"enabled": True}}, _dlcl(), _shortcuts())


def _signature(change, training=False):
    """(parameter count, logits) of a small model with all three methods on and ``change`` (a
    model section) merged in, all weights set from a seed by variable path (so shared
    variables agree across configurations)."""
    cfg = config(merge(SMALL, stacks({"input_dropout": 0.0, "residual_dropout": 0.0}), _ON,
                       change))
    keras.utils.set_random_seed(7)
    model = build_model(cfg)
    for v in model.weights:
        rs = np.random.RandomState(zlib.crc32(v.path.encode()))
        v.assign((rs.randn(*v.shape) * 0.3).astype("float32"))
    keras.utils.set_random_seed(7)
    return model.count_params(), to_numpy(model(INPUTS, training=training))


@functools.lru_cache(maxsize=None)
def _base_signature(training):
    """:func:`_signature` of the unchanged model (the same for every option: once per
    ``training``)."""
    return _signature({}, training)


def _ta(**options):
    return {"transparent_attention": options}


def _lex(**options):
    return stacks({"lexical_shortcuts": options})


@pytest.mark.parametrize("key,value,change,training", [
    ("transparent_attention.enabled", False, _ta(enabled=False), False),
    ("transparent_attention.weight_dropout", 0.0, _ta(weight_dropout=0.0), True),
    ("transparent_attention.min_probability", 0.2, _ta(min_probability=0.2), False),
    ("dlcl.enabled (encoder)", False, stacks(encoder={"dlcl": {"enabled": False}}), False),
    ("dlcl.enabled (decoder)", False, stacks(decoder={"dlcl": {"enabled": False}}), False),
    ("dlcl.weights", "one", _dlcl(weights="one"), False),
    ("dlcl.weights", "avg", _dlcl(weights="avg"), False),
    ("dlcl.init", "one", _dlcl(init="one"), False),
    ("dlcl.layer_norm", False, _dlcl(layer_norm=False), False),
    ("dlcl.normalize_embedding", True, _dlcl(normalize_embedding=True), False),
    ("dlcl.window", 1, _dlcl(window=1), False),
    ("dlcl.softmax", True, _dlcl(softmax=True), False),
    ("lexical_shortcuts.enabled", False, _lex(enabled=False), False),
    ("lexical_shortcuts.variant", "feature_fusion", _lex(variant="feature_fusion"), False),
    ("lexical_shortcuts.placement", "cross", _shortcuts("cross"), False),
    ("lexical_shortcuts.placement", "both", _shortcuts("both"), False),
    ("lexical_shortcuts.source", "non_lexical", _lex(source="non_lexical"), False),
], ids=lambda p: p if isinstance(p, str) else None)
def test_every_option_takes_effect(key, value, change, training):
    base_params, base_out = _base_signature(training)
    params, out = _signature(change, training)
    if key == "dlcl.init":
        # The initial value: compare freshly built weight matrices.
        model = build_model(model_config(merge(SMALL, _dlcl(decoder=False, init=value))))
        np.testing.assert_allclose(to_numpy(model.encoder.dlcl.weight_matrix()),
                                   np.tril(np.ones((4, 4))))
        return
    assert params != base_params or np.abs(out - base_out).max() > 1e-4, key


# --------------------------------------------------------------------------------------------
# Parameter counts against the papers (d_model 512 / 1024; building only, no forward pass)
# --------------------------------------------------------------------------------------------


PRE_NORM = ["model.encoder.transformer.norm=pre", "model.decoder.transformer.norm=pre"]
SMALL_OVERRIDES = ["model.vocab_size=40", "model.d_model=16"] + [
    f"model.{stack}.transformer.{key}" for stack in ("encoder", "decoder")
    for key in ("num_heads=2", "ffn_dim=32")]


def _count(config, *overrides, shortcut_params=False):
    """Parameters of the model of ``configs/<config>``, counted from the variables' shapes:
    built in a stateless scope that leaves every variable uninitialised (no weights drawn)."""
    cfg = load_config(os.path.join(ROOT, "configs", config), overrides=list(overrides))
    with keras.StatelessScope(initialize_variables=False):
        model = build_model(cfg)
    assert model.built and model.weights
    total = model.count_params()
    extra = sum(s.count_params() for s in _shortcut_layers(model))
    # Keras keeps the uninitialised variables in its global state: forget them.
    keras.backend.clear_session(free_memory=False)
    return (total, extra) if shortcut_params else total


def test_lexical_shortcut_parameter_counts_match_emelin_table5():
    """Emelin et al. Table 5 (thousands): base 65,166 -> shortcuts 71,470 -> feature fusion
    84,053; big 218,413 -> feature fusion 293,935.  Their encoder, decoder and softmax share
    one embedding matrix; the vocabulary size is not reported, but with our layer layout
    (biased attention projections, pre-norm with a final LayerNorm per stack, as their code)
    a tied vocabulary of 41,066 reproduces all five totals exactly."""
    vocab = "model.vocab_size=41066"
    base = _count("transformer_base.yaml", vocab, *PRE_NORM)
    shortcuts = _count("transformer_base_lexical_shortcuts.yaml", vocab)
    fusion = _count("transformer_base_feature_fusion.yaml", vocab)
    assert shortcuts - base == 12 * (2 * 512 * 512 + 2 * 512)  # Eq. 5-6 kernels + 2 gate biases
    assert fusion - base == 12 * (6 * 512 * 512 + 2 * 512)  # Eq. 13-14: 3 new D x D blocks each
    assert [round(n / 1000) for n in (base, shortcuts, fusion)] == [65166, 71470, 84053]
    big_fusion, extra = _count("transformer_big_feature_fusion.yaml", vocab,
                               shortcut_params=True)
    assert extra == 12 * (6 * 1024 * 1024 + 2 * 1024)
    assert [round((big_fusion - extra) / 1000), round(big_fusion / 1000)] == [218413, 293935]


def test_deep_encoder_parameter_counts_match_wang_table1():
    """Wang et al. Table 1: 62M (6L), 106M (pre-norm 20L), 121M (post-norm DLCL 25L), 137M
    (pre-norm DLCL 30L).  One shared source/target/softmax embedding (fairseq
    --share-all-embeddings); with a joint vocabulary of 34,000 (32k BPE merges, rare tokens
    filtered) all four totals come out; each extra base encoder layer adds 3,152,384."""
    vocab = "model.vocab_size=34000"
    base_post = _count("transformer_base.yaml", vocab)
    base_pre = _count("transformer_base.yaml", vocab, *PRE_NORM)
    deep20 = _count("transformer_deep20_pre.yaml", vocab)
    dlcl25 = _count("dlcl_post_25l.yaml", vocab)
    dlcl30 = _count("dlcl_pre_30l.yaml", vocab)
    layer = 4 * (512 * 512 + 512) + (2 * 512 * 2048 + 2048 + 512) + 2 * 2 * 512
    assert layer == 3152384
    assert deep20 - base_pre == 14 * layer
    # DLCL: (L+1)^2 weights and L LayerNorms per stack (encoder and decoder).
    assert dlcl30 - base_pre == 24 * layer + (31 ** 2 + 30 * 1024) + (7 ** 2 + 6 * 1024)
    assert dlcl25 - base_post == 19 * layer + (26 ** 2 + 25 * 1024) + (7 ** 2 + 6 * 1024)
    assert [round(n / 1e6) for n in (base_post, base_pre, deep20, dlcl25, dlcl30)] == [
        62, 62, 106, 121, 137]


def test_transparent_attention_adds_n_plus_1_times_m_weights():
    plain = _count("transformer_deep20_post.yaml", *SMALL_OVERRIDES)
    ta = _count("transformer_deep20_post_transparent.yaml", *SMALL_OVERRIDES)
    assert ta - plain == (20 + 1) * 6


# --------------------------------------------------------------------------------------------
# The shipped configs load, build and decode (small dimensions)
# --------------------------------------------------------------------------------------------

DEEP_CONFIGS = ["transformer_deep20_post.yaml", "transformer_deep20_pre.yaml",
                "transformer_deep20_post_transparent.yaml", "dlcl_pre_30l.yaml",
                "dlcl_post_25l.yaml", "transformer_base_lexical_shortcuts.yaml",
                "transformer_base_feature_fusion.yaml", "transformer_big_feature_fusion.yaml"]


@pytest.mark.parametrize("name", DEEP_CONFIGS)
def test_deep_configs_load_build_and_decode(name):
    cfg = load_config(os.path.join(ROOT, "configs", name), overrides=SMALL_OVERRIDES)
    model = build_model(cfg)
    assert isinstance(model, Seq2SeqModel)
    # Teacher forcing and the decoding steps from one encoder pass (the deep stack's; model()
    # is decode(encode()): test_encode_exposes_layer_outputs_and_decode_from_encoded).
    encoded = model.encode(SRC)
    full = to_numpy(model.decode(encoded, TGT))
    np.testing.assert_allclose(_cached_logits(model, encoded=encoded)[TGT != 0],
                               full[TGT != 0], atol=2e-4, rtol=1e-4)
