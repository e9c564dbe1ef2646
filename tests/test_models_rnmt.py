"""RNMT+ encoder, decoder and model: cached decoding, bidirectionality, transparent attention,
search, serialisation (backend-agnostic: no TensorFlow import; re-run under JAX).

Under JAX every eager ``keras.ops.scan`` is traced and compiled anew, so the tests keep the
number of forward passes small (variations are batched into one call where possible).
"""

import glob
import os

import numpy as np
import pytest
import keras
from keras import ops

from deep_nmt_tf.config import ConfigError, load_config
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.decoding import beam_search
from deep_nmt_tf.models import Seq2SeqModel, build_model
from deep_nmt_tf.models.rnmt import RNMTPlusDecoder, RNMTPlusEncoder, rnmt_embedding
from config_trees import model_config, stack
from keras_test_utils import (JAX_RERUN, assert_config_roundtrip, assert_model_mixed_precision,
                              to_numpy)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], "int32")
V, D, U = 40, 8, 6  # vocabulary, d_model (embedding / memory width), LSTM units
#: Encoder and decoder layers of the shared model and the mixed-precision models: on the JAX
#: re-run one BiLSTM and two decoder layers (each LSTM layer's scan compiles on every call).
ENCODER_LAYERS, DECODER_LAYERS = (1, 2) if JAX_RERUN else (2, 3)


def _model_config(transparent=False, encoder_units=U, encoder_layers=2, decoder_layers=3,
                  tie=False):
    """RNMT+ with dropout 0.2 everywhere; ``tie``: tied source/target embeddings."""
    dropout = {"embedding_dropout": 0.2, "dropout": 0.2}
    return model_config({
        "vocab_size": V, "d_model": D, "tie_source_target_embeddings": tie,
        "transparent_attention": {"enabled": transparent},
        "encoder": stack("rnmt_plus", num_layers=encoder_layers, units=encoder_units,
                         **dropout),
        "decoder": stack("rnmt_plus", num_layers=decoder_layers, units=U, attention_heads=2,
                         attention_dim=D, attention_dropout=0.2, **dropout)})


def _inputs(src=SRC, tgt=TGT):
    return {"source_ids": src, "target_input_ids": tgt}


@pytest.fixture(scope="module")
def model_and_logits():
    """Encoder 2 x BiLSTM, decoder 3 layers (a residual at the third; on the JAX re-run 1 and
    2 layers), dropout 0.2 everywhere, untied embeddings; and its inference logits on
    (SRC, TGT)."""
    keras.utils.set_random_seed(5)
    model = build_model(_model_config(encoder_layers=ENCODER_LAYERS,
                                      decoder_layers=DECODER_LAYERS))
    return model, to_numpy(model(_inputs()))


def _check_cached_decoding(model, full):
    state = model.init_decoder_state(model.encode(SRC), max_length=TGT.shape[1])
    shapes = keras.tree.map_structure(lambda x: tuple(x.shape), state)
    for t in range(TGT.shape[1]):
        logits, state = model.decode_step(TGT[:, t], np.int32(t), state)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=1e-5)
        # Every state leaf is batch-major and keeps its shape (beam search tiles/gathers dim 0).
        assert keras.tree.map_structure(lambda x: tuple(x.shape), state) == shapes
    assert all(leaf.shape[0] == 2 for leaf in keras.tree.flatten(state))


def test_cached_decoding_equals_teacher_forcing(model_and_logits):
    model, full = model_and_logits
    assert isinstance(model.encoder, RNMTPlusEncoder)
    assert isinstance(model.decoder, RNMTPlusDecoder)
    assert full.shape == (2, 5, V) and full.dtype == np.float32
    _check_cached_decoding(model, full)


@pytest.mark.parametrize("transparent", [False, True])
def test_mixed_bfloat16_with_float32_logits(transparent):
    """The recurrences run in bfloat16 (cell states float32); float32 logits and decoding
    steps; bfloat16 beam search."""
    assert_model_mixed_precision(
        lambda d: build_model(_model_config(transparent=transparent, encoder_units=D // 2,
                                            encoder_layers=ENCODER_LAYERS,
                                            decoder_layers=DECODER_LAYERS), dtype=d),
        SRC, TGT)


@pytest.mark.parametrize("encoder_units", [U, D // 2])
def test_transparent_attention_mixes_before_the_projection(encoder_units):
    """M = 1 mix; the encoder projection is applied to the mix (Bapna et al. 2018); the
    embedding output is a source only when it has the layers' width (E == 2U).  Decoding with
    the mixed memory (and tied source/target embeddings) still equals teacher forcing."""
    model = build_model(_model_config(transparent=True, encoder_units=encoder_units, tie=True))
    assert model.encoder.embedding is model.decoder.embedding
    ta = model.transparent_attention
    assert ta.num_outputs == 1
    with_embedding = D == 2 * encoder_units
    assert ta.num_sources == model.model_config.encoder.get().num_layers + int(with_embedding)
    encoded = model.encode(SRC)
    memories = model.decoder_memories(encoded)
    assert tuple(memories.shape) == (1, 2, 5, D)
    sources = encoded["layer_outputs"] if with_embedding else encoded["layer_outputs"][1:]
    mix = sum(w * to_numpy(x) for w, x in zip(to_numpy(ta.mix_weights())[:, 0], sources))
    expected = to_numpy(model.encoder.projection(mix))
    np.testing.assert_allclose(to_numpy(memories)[0], expected, atol=1e-5)
    # Zero-initialised weights: a uniform mix.
    np.testing.assert_allclose(to_numpy(ta.mix_weights()), 1.0 / ta.num_sources, atol=1e-6)
    if not with_embedding:
        full = to_numpy(model.decode(encoded, TGT))
        _check_cached_decoding(model, full)


def test_encoder_sees_both_directions_and_ignores_padding():
    enc = RNMTPlusEncoder(rnmt_embedding(V, D), num_layers=2, units=U, output_dim=10,
                          residual_start=1, dropout=0.0, embedding_dropout=0.0)
    row = SRC[0]
    last_changed, first_changed = row.copy(), row.copy()
    last_changed[3] = 20  # the last real token before </s>
    first_changed[0] = 20
    batch = np.stack([row, last_changed, first_changed, SRC[1]])
    out = enc(batch)
    memory = to_numpy(out["memory"])
    assert memory.shape == (4, 5, 10)
    assert np.abs(memory[1, 0] - memory[0, 0]).max() > 1e-4  # the first output sees the last
    assert np.abs(memory[2, -1] - memory[0, -1]).max() > 1e-4  # and the last the first token
    assert to_numpy(out["mask"]).tolist() == (batch != 0).tolist()
    assert [x.shape[-1] for x in out["layer_outputs"]] == [D, 2 * U, 2 * U]
    for x in out["layer_outputs"][1:]:  # padded positions of the layer outputs are 0
        assert np.abs(to_numpy(x)[3, 3:]).max() == 0.0
    # Residual from the second layer (residual_start=1): x_2 - x_1 is layer 2's output alone.
    x1, x2 = (to_numpy(x) for x in out["layer_outputs"][1:])
    y2 = to_numpy(enc.layers_[1](out["layer_outputs"][1], mask=batch != 0))
    np.testing.assert_allclose(x2 - x1, y2, atol=1e-5)
    # Extra padding changes nothing at the real positions.
    padded = np.concatenate([batch, np.zeros((4, 3), "int32")], axis=1)
    memory_padded = to_numpy(enc(padded)["memory"])[:, :5]
    np.testing.assert_allclose(memory_padded[batch != 0], memory[batch != 0], atol=1e-5)


def test_source_padding_does_not_change_logits(model_and_logits):
    model, full = model_and_logits
    padded = np.concatenate([SRC, np.zeros((2, 3), "int32")], axis=1)
    np.testing.assert_allclose(to_numpy(model(_inputs(src=padded))), full, atol=1e-5)


def test_dropout_only_in_training(model_and_logits):
    """Training applies embedding, layer-output and attention dropout (the attention masks are
    drawn before the scan, so this also runs under JAX); inference has none (the other tests
    compare inference passes with each other and with step-by-step decoding)."""
    model, full = model_and_logits
    assert model.decoder.attention.dropout > 0
    train = to_numpy(model(_inputs(), training=True))
    assert np.isfinite(train).all() and np.abs(full - train).max() > 1e-3


def test_beam_search_scores_like_teacher_forcing(model_and_logits):
    """The shared beam search runs RNMT+ unchanged (state tiled and reordered along dim 0);
    each of the n-best hypotheses' log-probability equals the teacher-forced scoring of its
    tokens (plus EOS when it ended with one).  (Greedy search is beam size 1 of the same loop
    over the same decoder interface.)"""
    model, _ = model_and_logits
    kwargs = dict(max_length_a=1.0, max_length_b=3)
    limits = [4 + 3, 2 + 3]  # floor(a * n + b), n = tokens other than PAD/EOS
    out = beam_search(model, SRC, beam_size=3, n_best=2, length_penalty=0.6, **kwargs)
    ids, lengths = to_numpy(out["ids"]), to_numpy(out["lengths"])
    reported = to_numpy(out["log_probs"]).reshape(-1)
    rows = []
    for b in range(2):
        for k in range(2):
            tokens = list(ids[b, k][:lengths[b, k]])
            rows.append((b, tokens + ([EOS_ID] if lengths[b, k] < limits[b] else [])))
    width = max(len(tokens) for _, tokens in rows)
    src = np.stack([SRC[b] for b, _ in rows])
    tgt_in = np.full((len(rows), width), PAD_ID, "int32")
    for i, (_, tokens) in enumerate(rows):
        tgt_in[i, :len(tokens)] = [BOS_ID] + tokens[:-1]
    logits = to_numpy(model(_inputs(src=src, tgt=tgt_in)))  # one scoring pass (causal)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    expected = [sum(logp[i, t, tok] for t, tok in enumerate(tokens))
                for i, (_, tokens) in enumerate(rows)]
    np.testing.assert_allclose(reported, expected, atol=1e-4)


def test_decoder_memory_forms_and_causality():
    dec = RNMTPlusDecoder(rnmt_embedding(V, D), num_layers=2, units=U, attention_heads=2,
                          residual_start=1, dropout=0.0, embedding_dropout=0.0,
                          attention_dropout=0.0)
    memory = keras.random.normal((2, 5, D), seed=1)
    assert dec._memory(ops.expand_dims(memory, 0)).shape == memory.shape
    assert dec._memory([memory]) is memory and dec._memory(memory) is memory
    with pytest.raises(ValueError, match="one memory"):
        dec._memory(ops.stack([memory, memory]))
    with pytest.raises(ValueError, match="lexical shortcuts"):
        dec(TGT, memory, SRC != 0, memory_embeddings=memory)
    # Causal: changing the input at position 3 leaves positions 0-2 alone.
    changed = TGT.copy()
    changed[:, 3] = 7
    both = to_numpy(dec(np.concatenate([TGT, changed]), ops.concatenate([memory, memory]),
                        np.concatenate([SRC, SRC]) != 0))
    a, b = both[:2], both[2:]
    np.testing.assert_allclose(b[:, :3], a[:, :3], atol=1e-6)
    assert np.abs(b[:, 3] - a[:, 3]).max() > 1e-5


def test_layer_serialization_round_trips():
    enc = RNMTPlusEncoder(rnmt_embedding(V, D), num_layers=1, units=U, output_dim=10,
                          dropout=0.1, embedding_dropout=0.2, residual_start=3, cell_clip=5.0,
                          forget_bias=0.5)
    assert_config_roundtrip(enc, lambda e: e(SRC)["memory"], atol=1e-6)
    dec = RNMTPlusDecoder(rnmt_embedding(V, D), num_layers=2, units=U, attention_heads=3,
                          attention_dim=9, memory_dim=10, residual_start=1, dropout=0.1,
                          embedding_dropout=0.2, attention_dropout=0.3, cell_clip=0.0)
    dec.build((None, None))
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(dec))
    clone.build((None, None))
    assert type(clone) is RNMTPlusDecoder and clone.get_config() == dec.get_config()
    assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in dec.weights]
    # (Outputs after a round trip: test_model_serialization_and_keras_file.)


def test_model_serialization_and_keras_file(tmp_path):
    model = build_model(_model_config(transparent=True, encoder_layers=1, decoder_layers=2))
    expected = to_numpy(model(_inputs()))
    clone = Seq2SeqModel.from_config(model.get_config())
    clone.build()
    assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in model.weights]
    assert clone.get_config() == model.get_config()
    path = str(tmp_path / "rnmt.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.decoder, RNMTPlusDecoder)
    np.testing.assert_allclose(to_numpy(loaded(_inputs())), expected, atol=1e-5)


def test_residual_start_must_skip_a_width_change():
    with pytest.raises(ValueError, match="residual_start"):
        RNMTPlusEncoder(rnmt_embedding(V, D), num_layers=2, units=U, residual_start=0)
    RNMTPlusEncoder(rnmt_embedding(V, D), num_layers=2, units=D // 2, residual_start=0)
    # The RNMT+ softmax reads [decoder output; context]: its decoder has no tie_softmax key.
    with pytest.raises(ConfigError, match="model.decoder.rnmt_plus.tie_softmax: unknown key"):
        load_config(None, overrides=["model.decoder.type=rnmt_plus",
                                     "model.decoder.rnmt_plus.tie_softmax=true"])


def test_demo_config_builds_the_rnmt_model():
    cfg = load_config(os.path.join(ROOT, "configs", "rnmt_plus_demo.yaml"),
                      overrides=["model.vocab_size=50"])
    model = build_model(cfg)
    assert isinstance(model, Seq2SeqModel) and isinstance(model.encoder, RNMTPlusEncoder)
    m, e, d = cfg.model, cfg.model.encoder.rnmt_plus, cfg.model.decoder.rnmt_plus
    assert model.encoder.units == e.units and model.decoder.units == d.units
    assert model.encoder.output_dim == m.d_model == model.decoder.memory_dim
    assert model.decoder.attention.num_heads == d.attention_heads
    assert model.decoder.attention_dim == d.attention_dim
    assert len(model.encoder.layers_) == e.num_layers
    assert 1 + len(model.decoder.upper_layers) == d.num_layers
    assert model.encoder.residual_start == e.residual_start
    assert model.decoder.residual_start == d.residual_start
    assert (model.encoder.dropout, model.decoder.dropout) == (e.dropout, d.dropout)
    assert model.encoder.embedding_dropout == e.embedding_dropout
    assert model.decoder.embedding_dropout == d.embedding_dropout
    assert model.decoder.attention.dropout == d.attention_dropout
    assert model.decoder.bottom_cell.cell_clip == d.cell_clip
    assert model.decoder.bottom_cell.forget_bias == d.forget_bias
    assert model.encoder.embedding is not model.decoder.embedding  # untied in the config
    assert not model.encoder.embedding.scale  # RNMT+ embeddings are not scaled by sqrt(d)


def test_shipped_rnmt_configs_resolve():
    paths = sorted(glob.glob(os.path.join(ROOT, "configs", "rnmt_plus*.yaml")))
    names = {os.path.basename(p) for p in paths}
    expected = {"rnmt_plus.yaml", "rnmt_plus_512.yaml", "rnmt_plus_512_transparent.yaml",
                "rnmt_plus_demo.yaml"}
    for n in (12, 16, 20):
        expected |= {f"rnmt_plus_512_enc{n}.yaml", f"rnmt_plus_512_enc{n}_transparent.yaml"}
    assert expected <= names
    for path in paths:
        cfg = load_config(path)
        assert (cfg.model.encoder.type, cfg.model.decoder.type) == ("rnmt_plus", "rnmt_plus")
        assert cfg.training.schedule.type == "rnmt_plus"
        assert cfg.training.loss_normalization == "sentence"
        assert cfg.training.adaptive_clipping.enabled
        assert cfg.model.transparent_attention.enabled == path.endswith("_transparent.yaml")
