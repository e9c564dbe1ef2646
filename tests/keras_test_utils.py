"""Shared checks for Keras layers (keras-hub's test-case habit): config round trip, weights."""

import numpy as np
import keras


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
