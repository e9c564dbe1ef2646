"""Transformer model: cached decoding, masks, serialisation (backend-agnostic; re-run under JAX)."""

import numpy as np
import pytest
import keras

from deep_nmt_tf.models import Seq2SeqModel, build_model
from config_trees import merge, model_config, stacks, transformer
from keras_test_utils import assert_config_roundtrip, assert_model_mixed_precision, to_numpy

SRC = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], "int32")


def _model(tie=True, encoder_layers=2, **both):
    """A small Transformer; ``both``: keys of both stacks; ``tie``: the source/target embedding
    and the softmax weights tied."""
    tree = transformer(40, 16, num_heads=2, ffn_dim=32, encoder_layers=encoder_layers,
                       decoder_layers=2, **both)
    if not tie:
        tree = merge(tree, {"tie_source_target_embeddings": False},
                     stacks(decoder={"tie_softmax": False}))
    return build_model(model_config(tree))


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("tie", [True, False])
def test_cached_decoding_equals_teacher_forcing(norm, tie):
    model = _model(norm=norm, tie=tie)
    full = to_numpy(model({"source_ids": SRC, "target_input_ids": TGT}))
    state = model.init_decoder_state(model.encode(SRC), max_length=TGT.shape[1])
    for t in range(TGT.shape[1]):
        logits, state = model.decode_step(TGT[:, t], np.int32(t), state)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=1e-4)


def test_source_padding_does_not_change_outputs():
    model = _model()
    padded = np.concatenate([SRC, np.zeros((2, 3), "int32")], axis=1)
    a = to_numpy(model({"source_ids": SRC, "target_input_ids": TGT}))
    b = to_numpy(model({"source_ids": padded, "target_input_ids": TGT}))
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_tying_shares_one_matrix():
    tied = _model()
    untied = _model(tie=False)
    extra = untied.count_params() - tied.count_params()
    assert extra == 40 * 16 + (16 * 40 + 40)  # target embedding + softmax kernel/bias


def test_dropout_only_in_training():
    model = _model(input_dropout=0.5, residual_dropout=0.5)
    inputs = {"source_ids": SRC, "target_input_ids": TGT}
    a, b = to_numpy(model(inputs)), to_numpy(model(inputs))
    np.testing.assert_array_equal(a, b)
    c = to_numpy(model(inputs, training=True))
    assert np.abs(a - c).max() > 1e-3


def test_model_serialization_and_keras_file(tmp_path):
    model = _model(norm="pre")
    inputs = {"source_ids": SRC, "target_input_ids": TGT}
    assert_config_roundtrip(model, lambda m: m(inputs), atol=1e-5)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(inputs)), to_numpy(model(inputs)), atol=1e-5)


def test_encoder_round_trip_and_layer_outputs():
    model = _model(encoder_layers=3)
    enc = model.encoder
    out = enc(SRC)
    assert len(out["layer_outputs"]) == 4
    assert to_numpy(out["mask"]).tolist() == (SRC != 0).tolist()
    assert_config_roundtrip(enc, lambda e: e(SRC)["memory"], atol=1e-5)


def test_build_model_requires_vocab_size():
    with pytest.raises(ValueError, match="vocab_size"):
        Seq2SeqModel(model_config(merge({"vocab_size": 0, "d_model": 16},
                                        stacks({"num_heads": 2}))))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_model_runs_in_mixed_bfloat16_with_float32_logits(norm):
    tree = transformer(40, 16, num_heads=2, ffn_dim=32, encoder_layers=2, decoder_layers=2,
                       norm=norm)
    assert_model_mixed_precision(lambda d: build_model(model_config(tree), dtype=d), SRC, TGT)
