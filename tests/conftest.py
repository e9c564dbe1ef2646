"""Shared pytest setup.

The Keras backend defaults to TensorFlow; ``tests/test_jax_backend.py`` re-runs the pure-Keras
layer and model tests (``tests/test_layers_*.py``, ``tests/test_models_*.py``) in a subprocess
with ``KERAS_BACKEND=jax``.  Those files must not import TensorFlow.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# fit on JAX keeps no compiled steps in ~/.cache from the tests (test_fit.py checks the cache
# in a directory of its own).
os.environ.setdefault("DEEP_NMT_COMPILATION_CACHE", "off")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    import keras

    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield


@pytest.fixture(autouse=True)
def _restore_absl_log_level():
    """Tools run in-process parse absl flags, which set the ``absl`` logger's level (WARNING
    by default): restore it so a later test's log capture does not depend on the test order."""
    import logging

    logger = logging.getLogger("absl")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.fixture
def backend():
    import keras

    return keras.backend.backend()



def pytest_collection_modifyitems(config, items):
    """The JAX re-run (``DEEP_NMT_JAX_RERUN=1``, set by ``tests/test_jax_backend.py``) keeps one
    case of each parametrized test, its first, and leaves out the tests marked
    ``jax_rerun_skip``: every test function runs on the second backend, while the combinations
    of options (and the compositions of parts checked on their own) run once, on TensorFlow.
    JAX executes each eager op through its own XLA compilation, so a case costs 3-10x its
    TensorFlow time there; some tests use smaller models then (``keras_test_utils.JAX_RERUN``:
    fewer layers, the same assertions)."""
    if os.environ.get("DEEP_NMT_JAX_RERUN") != "1":
        return
    seen, kept, dropped = set(), [], []
    for item in items:
        key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
        skip = key in seen or item.get_closest_marker("jax_rerun_skip") is not None
        (dropped if skip else kept).append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
