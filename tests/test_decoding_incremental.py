"""Incremental decoding and search inside tf.function / XLA (TensorFlow backend)."""

import numpy as np
import pytest
import tensorflow as tf

from config_trees import model_config, transformer
from deep_nmt_tf.decoding import beam_search, greedy_search
from deep_nmt_tf.models import build_model

SRC = np.array([[5, 6, 7, 8, 9, 2], [9, 10, 2, 0, 0, 0], [11, 2, 0, 0, 0, 0]], "int32")
TGT = np.array([[1, 11, 12, 13, 14, 15], [1, 15, 16, 17, 0, 0], [1, 4, 0, 0, 0, 0]], "int32")


@pytest.fixture(scope="module")
def model():
    import keras

    keras.utils.set_random_seed(3)  # the same weights in every run
    # One encoder layer (its memory is computed once either way), two decoder layers (a cache
    # each): every traced and XLA-compiled graph below holds them.
    return build_model(model_config(transformer(31, 16, num_heads=2, ffn_dim=32,
                                                encoder_layers=1, decoder_layers=2,
                                                norm="post")))


@pytest.fixture(scope="module")
def prefix_logits(model):
    """``[t]``: the teacher-forced logits of the whole prefix ``TGT[:, :t + 1]``, eagerly."""
    return [model({"source_ids": SRC, "target_input_ids": TGT[:, :t + 1]}).numpy()
            for t in range(TGT.shape[1])]


@pytest.fixture(scope="module")
def eager_searches(model):
    """Greedy and beam search of SRC, eagerly (what the traced searches must give)."""
    kwargs = dict(max_length_a=1.0, max_length_b=3)
    return (_numpy(greedy_search(model, SRC, **kwargs)),
            _numpy(beam_search(model, SRC, beam_size=3, n_best=2, length_penalty=0.6,
                               **kwargs)))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_cached_decoding_equals_full_recomputation_in_tf_function(model, prefix_logits,
                                                                 jit_compile):
    """Every step's logits from the cache == the teacher-forced logits of the whole prefix."""
    steps = TGT.shape[1]

    @tf.function(jit_compile=jit_compile, autograph=False)
    def incremental(src, tgt):
        state = model.init_decoder_state(model.encode(src), steps)
        out = []
        for t in range(steps):
            logits, state = model.decode_step(tgt[:, t], tf.constant(t, tf.int32), state)
            out.append(logits)
        return tf.stack(out, axis=1)

    cached = incremental(tf.constant(SRC), tf.constant(TGT)).numpy()
    for t in range(steps):  # Recomputed from scratch for each prefix length.
        np.testing.assert_allclose(cached[:, t], prefix_logits[t][:, t], atol=2e-4, rtol=1e-4)


def _numpy(out):
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_search_in_tf_function_equals_eager(model, eager_searches, jit_compile):
    kwargs = dict(max_length_a=1.0, max_length_b=3)
    eager_greedy, eager_beam = eager_searches
    spec = tf.TensorSpec([None, None], tf.int32)
    greedy = tf.function(lambda s: greedy_search(model, s, **kwargs), input_signature=[spec],
                         jit_compile=jit_compile, autograph=False)
    beam = tf.function(lambda s: beam_search(model, s, beam_size=3, n_best=2,
                                             length_penalty=0.6, **kwargs),
                       input_signature=[spec], jit_compile=jit_compile, autograph=False)
    for got, want in ((_numpy(greedy(SRC)), eager_greedy), (_numpy(beam(SRC)), eager_beam)):
        np.testing.assert_array_equal(got["ids"], want["ids"])
        np.testing.assert_array_equal(got["lengths"], want["lengths"])
        np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-4)


def test_beam_size_as_tensor_equals_static(model):
    kwargs = dict(max_length_a=1.0, max_length_b=3, length_penalty=0.6, n_best=1)
    static = _numpy(beam_search(model, SRC, beam_size=3, **kwargs))
    fn = tf.function(lambda s, k: beam_search(model, s, beam_size=k, **kwargs),
                     autograph=False)
    dynamic = _numpy(fn(tf.constant(SRC), tf.constant(3)))
    np.testing.assert_array_equal(dynamic["ids"], static["ids"])
    np.testing.assert_allclose(dynamic["scores"], static["scores"], atol=1e-5)
    # Beam size 1 as a tensor == beam size 1 static.  (Not necessarily == greedy search: a
    # hypothesis that finished early can win on its length-normalised score, which greedy
    # search never compares; whether it does depends on the random weights.)
    one = _numpy(fn(tf.constant(SRC), tf.constant(1)))
    static_one = _numpy(beam_search(model, SRC, beam_size=1, **kwargs))
    np.testing.assert_array_equal(one["ids"], static_one["ids"])
    np.testing.assert_allclose(one["scores"], static_one["scores"], atol=1e-5)
