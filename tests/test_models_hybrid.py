"""Hybrid models (Chen et al. 2018 section 6): Transformer/RNMT+ encoder-decoder mixes, cascaded
and multi-column encoders.  Cached decoding, beam search vs teacher forcing, the multi-column
merge, serialisation, config validation (backend-agnostic: no TensorFlow import; re-run under
JAX)."""

import os
import re

import numpy as np
import pytest
import keras

from deep_nmt_tf.config import ConfigError, config_from_dict, load_config
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.decoding import beam_search
from deep_nmt_tf.models import build_model
from deep_nmt_tf.models.hybrid import CascadedEncoder, MultiColumnEncoder
from deep_nmt_tf.models.rnmt import RNMTPlusDecoder, RNMTPlusEncoder
from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder
from config_trees import architecture as architecture_tree
from config_trees import config, merge, stack
from keras_test_utils import (JAX_RERUN, assert_config_roundtrip, assert_model_mixed_precision,
                              to_numpy)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], "int32")
V, D = 40, 8
#: Layers of each stack (a cascade's stages too): 1 on the JAX re-run, where every LSTM
#: layer's scan compiles on each call.
LAYERS = 1 if JAX_RERUN else 2

HYBRIDS = {  # architecture -> (encoder class, decoder class)
    "transformer_rnmt": (TransformerEncoder, RNMTPlusDecoder),
    "rnmt_transformer": (RNMTPlusEncoder, TransformerDecoder),
    "cascaded": (CascadedEncoder, RNMTPlusDecoder),
    "multi_column": (MultiColumnEncoder, RNMTPlusDecoder),
}


def _config(architecture, dropout=0.2, columns=("rnmt_plus", "transformer")):
    """A small model of ``architecture``: ``LAYERS`` + ``LAYERS`` layers (a cascade's stages:
    ``LAYERS`` each), 6-unit LSTMs, untied embeddings, ``dropout`` everywhere."""
    transformer = {"num_layers": LAYERS, "num_heads": 2, "ffn_dim": 16,
                   "input_dropout": dropout, "residual_dropout": dropout,
                   "attention_dropout": dropout}
    rnmt = {"num_layers": LAYERS, "units": 6, "embedding_dropout": dropout, "dropout": dropout}
    decoder = {"transformer": dict(transformer, tie_softmax=architecture == "rnmt_transformer"),
               "rnmt_plus": dict(rnmt, attention_dropout=dropout, attention_heads=2,
                                 attention_dim=D)}
    return config(merge({"vocab_size": V, "d_model": D, "tie_source_target_embeddings": False},
                        architecture_tree(architecture, {"transformer": transformer,
                                                         "rnmt_plus": rnmt}, decoder,
                                          cascade_layers=LAYERS, columns=columns)))


@pytest.fixture(scope="module", params=sorted(HYBRIDS))
def hybrid(request):
    keras.utils.set_random_seed(3)
    model = build_model(_config(request.param))
    return request.param, model, to_numpy(model({"source_ids": SRC, "target_input_ids": TGT}))


# On JAX the stacks are checked in mixed bfloat16 on their own (test_models_transformer.py,
# test_models_rnmt.py); a hybrid's eager JAX run compiles every op again (90 s).
@pytest.mark.jax_rerun_skip
@pytest.mark.parametrize("architecture", sorted(HYBRIDS))
def test_hybrid_runs_in_mixed_bfloat16(architecture):
    assert_model_mixed_precision(lambda d: build_model(_config(architecture), dtype=d), SRC,
                                 TGT, atol=0.2)


def test_hybrid_builds_and_cached_decoding_equals_teacher_forcing(hybrid):
    arch, model, full = hybrid
    enc_cls, dec_cls = HYBRIDS[arch]
    assert isinstance(model.encoder, enc_cls) and isinstance(model.decoder, dec_cls)
    assert full.shape == (2, 5, V) and np.isfinite(full).all()
    state = model.init_decoder_state(model.encode(SRC), max_length=TGT.shape[1])
    for t in range(TGT.shape[1]):
        logits, state = model.decode_step(TGT[:, t], np.int32(t), state)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=1e-5)


def test_hybrid_beam_search_scores_like_teacher_forcing(hybrid):
    _, model, _ = hybrid
    out = beam_search(model, SRC, beam_size=2, n_best=1, length_penalty=0.6,
                      max_length_a=1.0, max_length_b=2)
    ids, lengths = to_numpy(out["ids"]), to_numpy(out["lengths"])
    reported = to_numpy(out["log_probs"]).reshape(-1)
    limits = [4 + 2, 2 + 2]
    rows = []
    for b in range(2):
        tokens = list(ids[b, 0][:lengths[b, 0]])
        rows.append(tokens + ([EOS_ID] if lengths[b, 0] < limits[b] else []))
    width = max(len(t) for t in rows)
    tgt_in = np.full((2, width), PAD_ID, "int32")
    for i, tokens in enumerate(rows):
        tgt_in[i, :len(tokens)] = [BOS_ID] + tokens[:-1]
    logits = to_numpy(model({"source_ids": SRC, "target_input_ids": tgt_in}))
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    expected = [sum(logp[i, t, tok] for t, tok in enumerate(tokens))
                for i, tokens in enumerate(rows)]
    np.testing.assert_allclose(reported, expected, atol=1e-4)


def test_hybrid_source_padding_does_not_change_logits(hybrid):
    _, model, full = hybrid
    padded = np.concatenate([SRC, np.zeros((2, 2), "int32")], axis=1)
    got = to_numpy(model({"source_ids": padded, "target_input_ids": TGT}))
    np.testing.assert_allclose(got, full, atol=1e-5)


def test_multi_column_merge_normalises_each_column_then_projects_to_decoder_dim():
    keras.utils.set_random_seed(4)
    model = build_model(_config("multi_column",
                                columns=("rnmt_plus", "transformer", "rnmt_plus")))
    enc = model.encoder
    assert [type(c) for c in enc.columns] == [RNMTPlusEncoder, TransformerEncoder,
                                             RNMTPlusEncoder]
    out = enc(SRC, training=False)
    memory = to_numpy(out["memory"])
    assert memory.shape == (2, 5, model.decoder.memory_dim) == (2, 5, D)
    assert len(out["column_outputs"]) == 3
    mask = SRC != PAD_ID
    for column, norm, normed in zip(enc.columns, enc.column_norms, out["column_outputs"]):
        raw = to_numpy(column(SRC, training=False)["memory"])
        normed = to_numpy(normed)
        # Each column's own LayerNorm (fresh: scale 1, offset 0): zero mean, unit variance.
        mean, var = raw.mean(-1, keepdims=True), raw.var(-1, keepdims=True)
        want = (raw - mean) / np.sqrt(var + enc.layer_norm_epsilon)
        want = want * to_numpy(norm.gamma) + to_numpy(norm.beta)
        np.testing.assert_allclose(normed, want, atol=1e-4)
        np.testing.assert_allclose(normed[mask].mean(-1), 0.0, atol=1e-4)
    # memory = LayerNorm(concat(columns) @ W + b).
    concat = np.concatenate([to_numpy(c) for c in out["column_outputs"]], axis=-1)
    assert concat.shape[-1] == sum(c.output_dim for c in enc.columns)
    proj = concat @ to_numpy(enc.projection.kernel) + to_numpy(enc.projection.bias)
    want = (proj - proj.mean(-1, keepdims=True)) / np.sqrt(
        proj.var(-1, keepdims=True) + enc.layer_norm_epsilon)
    np.testing.assert_allclose(memory, want, atol=1e-4)
    np.testing.assert_array_equal(to_numpy(out["mask"]), mask)


def test_cascaded_encoder_has_no_positions_and_normalised_input():
    keras.utils.set_random_seed(5)
    model = build_model(_config("cascaded", dropout=0.0))
    enc = model.encoder
    rnmt, transformer = enc.stages
    assert rnmt.name == "stage_0" and len(transformer.layers_) == LAYERS
    assert all(v.path.startswith("seq2seq/encoder/stage_0/") for v in rnmt.weights)
    out = enc(SRC, training=False)
    # layer_outputs: RNMT+ (embedding + its layers), the normalised RNMT+ memory, the
    # Transformer stage's layers.
    assert len(out["layer_outputs"]) == (1 + LAYERS) + 1 + LAYERS
    x0 = to_numpy(out["layer_outputs"][3])[SRC != PAD_ID]
    np.testing.assert_allclose(x0.mean(-1), 0.0, atol=1e-4)


def test_hybrid_encoders_serialise():
    keras.utils.set_random_seed(6)
    for arch in ("cascaded", "multi_column"):
        model = build_model(_config(arch))
        assert_config_roundtrip(model.encoder, lambda enc: enc(SRC)["memory"], atol=1e-5)


def _cascade(**transformer):
    return {"encoder": stack("cascaded", stages=[stack("rnmt_plus"),
                                                 stack("transformer", **transformer)])}


@pytest.mark.parametrize("model,key", [
    (merge(_cascade(num_heads=2), {"transparent_attention": {"enabled": True}}),
     "model.transparent_attention.enabled"),
    ({"encoder": stack("multi_column", columns=[])}, "model.encoder.multi_column.columns"),
    ({"encoder": stack("multi_column", columns=[stack("rnmt_plus"), {"type": "lstm"}])},
     "model.encoder.multi_column.columns[1].type"),
    ({"tie_source_target_embeddings": True, "encoder": stack("transformer", num_heads=2)},
     "model.tie_source_target_embeddings"),
    (merge({"d_model": 12}, _cascade(num_heads=5)),
     "model.encoder.cascaded.stages[1].transformer.num_heads"),
    (_cascade(num_layers=0, num_heads=2),
     "model.encoder.cascaded.stages[1].transformer.num_layers"),
])
def test_hybrid_config_errors_name_the_key(model, key):
    base = {"vocab_size": V, "d_model": D, "tie_source_target_embeddings": False,
            "decoder": stack("rnmt_plus")}
    with pytest.raises(ConfigError, match=re.escape(key)):
        config(merge(base, model))


HYBRID_CONFIGS = {"hybrid_transformer_enc_rnmt_dec.yaml": ("transformer", "rnmt_plus"),
                  "hybrid_rnmt_enc_transformer_dec.yaml": ("rnmt_plus", "transformer"),
                  "cascaded_rnmt_transformer.yaml": ("cascaded", "rnmt_plus"),
                  "multicolumn_rnmt_transformer.yaml": ("multi_column", "rnmt_plus")}


@pytest.mark.parametrize("name", sorted(HYBRID_CONFIGS))
def test_shipped_hybrid_configs_resolve(name):
    cfg = load_config(os.path.join(ROOT, "configs", name))
    assert (cfg.model.encoder.type, cfg.model.decoder.type) == HYBRID_CONFIGS[name]


@pytest.mark.parametrize("training,key", [
    (dict(warm_start={"checkpoint": ["a", "b"], "source": ["encoder"] * 3}),
     "training.warm_start.source"),
    (dict(warm_start={"checkpoint": ["a", "b"], "target": ["x", "y", "z"]}),
     "training.warm_start.target"),
    (dict(warm_start={"checkpoint": ["a", ""]}), "training.warm_start.checkpoint"),
    (dict(freeze=["encoder", ""]), "training.freeze"),
    (dict(freeze=[3]), r"training.freeze\[0\]"),
])
def test_warm_start_and_freeze_config_errors_name_the_key(training, key):
    with pytest.raises(ConfigError, match=key):
        config_from_dict({"model": {"vocab_size": V}, "data": {"corpus": "synthetic"},
                          "training": training})


def test_warm_start_lists_and_scalars_resolve():
    from deep_nmt_tf.config import config_to_dict

    cfg = config_from_dict({"data": {"corpus": "synthetic"}, "training": {
        "warm_start": {"checkpoint": "runs/a", "target": "encoder/stages/0"},
        "freeze": "encoder/stages/0"}})
    ws = cfg.training.warm_start
    assert (ws.checkpoint, ws.source, ws.target) == (("runs/a",), ("encoder",),
                                                      ("encoder/stages/0",))
    assert cfg.training.freeze == ("encoder/stages/0",)
    again = config_from_dict(config_to_dict(cfg))  # lists in the resolved dict round-trip
    assert again.training == cfg.training
