"""Shared pytest setup.

The Keras backend defaults to TensorFlow; ``tests/test_jax_backend.py`` re-runs the pure-Keras
layer and model tests (``tests/test_layers_*.py``, ``tests/test_models_*.py``) in a subprocess
with ``KERAS_BACKEND=jax``.  Those files must not import TensorFlow.
"""

import os
import shutil
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# fit on JAX keeps no compiled steps in ~/.cache from the tests (test_fit.py checks the cache
# in a directory of its own).
os.environ.setdefault("DEEP_NMT_COMPILATION_CACHE", "off")
# The package's per-machine caches (deep_nmt_tf.hardware.cache_home(): the bfloat16 matmul
# measurement, XLA's compiled searches) go to a directory of this test run, made by the first
# process (the controller of the xdist workers, which inherit it) and removed at its end: a
# test never reads what the user's tools or an earlier run left there, and never leaves a
# measurement taken under the suite's load for the user's tools to trust.  CI starts cold too.
_OWN_CACHE = "DEEP_NMT_TEST_CACHE_HOME" not in os.environ
if _OWN_CACHE:
    os.environ["DEEP_NMT_TEST_CACHE_HOME"] = tempfile.mkdtemp(prefix="deep_nmt_tf-tests-")
os.environ["XDG_CACHE_HOME"] = os.environ["DEEP_NMT_TEST_CACHE_HOME"]

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_unconfigure(config):
    """Removes this run's cache directory (the process that made it: not an xdist worker)."""
    if _OWN_CACHE:
        shutil.rmtree(os.environ["DEEP_NMT_TEST_CACHE_HOME"], ignore_errors=True)


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


#: Seconds each of the slowest test files took (each test's setup, call and teardown, summed
#: per file) in one full run on 2 cores (2026-11-27, the 2-core Zen 3, a niced training
#: beside): the order only (see below), so a stale or missing entry costs minutes, not
#: correctness.
FILE_SECONDS = {
    "test_robustness.py": 223, "test_jax_backend.py": 195, "test_training_trainer.py": 176,
    "test_training_distributed.py": 163, "test_experiments.py": 156, "test_models_deep.py": 135,
    "test_training_rnmt.py": 134, "test_export_saved_model.py": 128, "test_diagnostics.py": 109,
    "test_training_hybrid.py": 77, "test_notebooks.py": 73, "test_robustness_edges.py": 72,
    "test_training_multi_worker.py": 67, "test_search_cache.py": 64,
    "test_training_precision.py": 63, "test_data_tokenizers.py": 61,
    "test_tools_diagnostics.py": 57, "test_checkpoint_store.py": 53, "test_extending.py": 44,
    "test_fit.py": 40, "test_tools_quiet.py": 35, "test_export_ctranslate2.py": 35,
    "test_tools_benchmark.py": 34, "test_file_translation.py": 32, "test_models_hybrid.py": 30,
    "test_data_corpora.py": 29, "test_decoding_incremental.py": 27, "test_data_pipeline.py": 25,
    "test_training_tool.py": 24, "test_tools_translate_eval.py": 24,
}


def _longest_files_first(items):
    """pytest.ini hands whole files to the two workers (``--dist loadfile``) in collection
    order (``--no-loadscope-reorder``; xdist's own order, most tests first, leaves the files
    of single long tests to the end): the longest files first, so that the short ones fill
    the end (longest processing time first)."""
    def seconds(item):
        return FILE_SECONDS.get(os.path.basename(item.nodeid.split("::")[0]), 0)

    items.sort(key=lambda item: -seconds(item))  # stable: a file's tests keep their order


def pytest_collection_modifyitems(config, items):
    """The longest test files first (:func:`_longest_files_first`).  The JAX re-run
    (``DEEP_NMT_JAX_RERUN=1``, set by ``tests/test_jax_backend.py``) keeps one case of each
    parametrized test, its first, and leaves out the tests marked ``jax_rerun_skip``: every
    test function runs on the second backend, while the combinations of options (and the
    compositions of parts checked on their own) run once, on TensorFlow.
    JAX executes each eager op through its own XLA compilation, so a case costs 3-10x its
    TensorFlow time there; some tests use smaller models then (``keras_test_utils.JAX_RERUN``:
    fewer layers, the same assertions)."""
    if os.environ.get("DEEP_NMT_JAX_RERUN") != "1":
        _longest_files_first(items)
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
