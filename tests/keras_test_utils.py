"""Shared checks for Keras layers (keras-hub's test-case habit): config round trip, weights."""

import os

import numpy as np
import keras

#: The JAX re-run of ``tests/test_jax_backend.py`` (``tests/conftest.py``).  JAX compiles each
#: eager op (and each ``keras.ops.scan``, every call) on its first use, so a test may build a
#: smaller model under it (fewer layers, shorter inputs) and assert the same things.
JAX_RERUN = os.environ.get("DEEP_NMT_JAX_RERUN") == "1"

#: XLA options under which XLA's CPU compiler is 2-3x faster on the tests' small programs
#: (LLVM's optimisation passes off, the older CPU emitters): the same computations, slower
#: machine code.  XLA reads ``XLA_FLAGS`` once per process: for subprocesses
#: (:func:`fast_xla_compile_env`).
FAST_XLA_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 "
                          "--xla_llvm_disable_expensive_passes=true "
                          "--xla_cpu_use_fusion_emitters=false")


def fast_xla_compile_env():
    """``{"XLA_FLAGS": ...}`` for a subprocess: this process's XLA flags and
    :data:`FAST_XLA_COMPILE_FLAGS`."""
    return {"XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                FAST_XLA_COMPILE_FLAGS]))}


def assert_config_roundtrip(layer, call_fn, atol=1e-6):
    """Serialises ``layer``, rebuilds it from config, copies weights, compares outputs.

    Args:
      layer: a built layer.
      call_fn: ``call_fn(layer) -> tensor or dict/list of tensors`` (inference mode).
    """
    config = keras.saving.serialize_keras_object(layer)
    clone = keras.saving.deserialize_keras_object(config)
    assert type(clone) is type(layer)
    assert clone.get_config() == layer.get_config()
    expected = call_fn(layer)  # builds lazily-built layers too
    if not clone.built or len(clone.weights) != len(layer.weights):
        call_fn(clone)
    assert len(clone.weights) == len(layer.weights)
    assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in layer.weights]
    clone.set_weights(layer.get_weights())
    got = call_fn(clone)
    for e, g in zip(keras.tree.flatten(expected), keras.tree.flatten(got)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=atol)
    return clone


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _standard(dtype):
    return keras.backend.standardize_dtype(dtype)


def assert_mixed_precision(make, call_fn, float32=(), atol=0.1, policy="mixed_bfloat16"):
    """Runs a layer (or model) under a mixed-precision policy against its float32 twin.

    ``make(dtype)`` builds the layer with that dtype policy; ``call_fn(layer)`` runs it and
    returns a dict of named outputs.  Checks: the mixed layer's floating variables stay
    float32; the outputs whose names start with one of the ``float32`` prefixes are float32
    (what the interface promises), every other floating
    output is in the policy's compute dtype; all are finite and within ``atol`` of the float32
    layer's with the same weights.  Returns the mixed layer's outputs.
    """
    reference, mixed = make("float32"), make(policy)
    expected = call_fn(reference)  # builds lazily-built layers
    if not mixed.built or len(mixed.weights) != len(reference.weights):
        call_fn(mixed)
    mixed.set_weights(reference.get_weights())
    got = call_fn(mixed)
    compute = _standard(keras.DTypePolicy(policy).compute_dtype)
    floating = [w for w in mixed.weights if "float" in _standard(w.dtype)]
    assert floating and all(_standard(w.dtype) == "float32" for w in floating), \
        sorted({_standard(w.dtype) for w in mixed.weights})
    promised = {name for name in got if name.startswith(tuple(float32))}
    for name, value in got.items():
        for tensor, ref in zip(keras.tree.flatten(value), keras.tree.flatten(expected[name])):
            dtype = _standard(tensor.dtype)
            if "float" not in dtype:
                continue
            assert dtype == ("float32" if name in promised else compute), (name, dtype)
            array = to_numpy(keras.ops.cast(tensor, "float32"))
            assert np.isfinite(array).all(), name
            np.testing.assert_allclose(array, to_numpy(ref), atol=atol, err_msg=name)
    return got


def seq2seq_outputs(source_ids, target_ids, steps=2):
    """``call_fn`` for :func:`assert_mixed_precision` on a Seq2SeqModel: teacher-forced logits,
    ``steps`` incremental decoding steps and the diagnostic mixing weights (all float32 by the
    model interface), and the encoder memory (compute dtype)."""

    def call(model):
        encoded = model.encode(source_ids)
        out = {"logits": model({"source_ids": source_ids, "target_input_ids": target_ids}),
               "memory": encoded["memory"]}
        state = model.init_decoder_state(encoded, max_length=target_ids.shape[1])
        for t in range(steps):
            out[f"step_{t}"], state = model.decode_step(target_ids[:, t], np.int32(t), state)
        out.update({f"diagnostic_{k}": v for k, v in model.diagnostic_weights().items()})
        return out

    return call


def assert_model_mixed_precision(make, source_ids, target_ids, atol=0.15):
    """A model under ``mixed_bfloat16`` (float32 logits, decoding steps and mixing weights)
    and, with half-precision variables (the inference policy ``bfloat16``), beam search."""
    from deep_nmt_tf.decoding import beam_search

    got = assert_mixed_precision(make, seq2seq_outputs(source_ids, target_ids),
                                 float32=("logits", "step_", "diagnostic_"), atol=atol)
    assert "logits" in got and "step_1" in got
    for t in range(2):  # incremental decoding agrees with teacher forcing in bfloat16 too
        np.testing.assert_allclose(to_numpy(got[f"step_{t}"]), to_numpy(got["logits"])[:, t],
                                   atol=atol)
    half = make("bfloat16")
    assert {_standard(w.dtype) for w in half.weights if "float" in _standard(w.dtype)} == \
        {"bfloat16"}
    out = beam_search(half, source_ids, beam_size=2, max_length=4)
    assert _standard(out["scores"].dtype) == "float32"
    assert np.isfinite(to_numpy(out["scores"])).all()
