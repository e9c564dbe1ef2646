"""Re-runs the pure-Keras layer and model tests under ``KERAS_BACKEND=jax`` without TensorFlow
(the first case of each parametrized test, ``tests/conftest.py``), and checks that
``deep_nmt_tf.layers`` / ``deep_nmt_tf.models`` never import TensorFlow."""

import ast
import glob
import os
import subprocess
import sys

import pytest

from keras_test_utils import fast_xla_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PURE_PACKAGES = ("deep_nmt_tf/layers", "deep_nmt_tf/models", "deep_nmt_tf/decoding")


def _pure_keras_test_files():
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "test_layers_*.py")) +
                   glob.glob(os.path.join(ROOT, "tests", "test_models_*.py")))
    return [os.path.relpath(f, ROOT) for f in files]


def _imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, node.lineno


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_keras_packages_do_not_import_tensorflow(package):
    offenders = []
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
        for module, line in _imports(path):
            if module.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{line}: imports {module}")
    assert not offenders, "\n".join(offenders)


def test_backend_agnostic_test_files_do_not_import_tensorflow():
    offenders = [f"{f}:{line}" for f in _pure_keras_test_files()
                 for module, line in _imports(os.path.join(ROOT, f))
                 if module.split(".")[0] == "tensorflow"]
    assert not offenders, offenders


# Runs pytest with TensorFlow unimportable, as on a machine without it: the layers and models
# need none (and Keras, seeing none, does not import it: 7 s and its memory).
PYTEST_WITHOUT_TENSORFLOW = """
import importlib.abc, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            raise ImportError(f"no {name} on this machine (tests/test_jax_backend.py)")

sys.meta_path.insert(0, NoTensorFlow())
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_layer_and_model_tests_pass_on_jax(tmp_path):
    pytest.importorskip("jax")
    files = _pure_keras_test_files()
    assert files, "no tests/test_layers_*.py or tests/test_models_*.py found"
    # DEEP_NMT_JAX_RERUN: the first case of each parametrized test (tests/conftest.py), some
    # on smaller models (keras_test_utils.JAX_RERUN).  Eager JAX compiles each op on its first
    # use: most of the run is XLA compiling small programs, which FAST_XLA_COMPILE_FLAGS
    # makes about twice as fast.  JAX reuses an op's program for its next call of the same
    # shapes, but a keras.ops.scan or while_loop (a new Python function each call) compiles
    # anew: a compilation cache, this run's own and empty at its start, gives each repeated
    # program of over 0.1 s (an LSTM layer's scan, a search loop) its first compilation.
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", DEEP_NMT_JAX_RERUN="1",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1", **fast_xla_compile_env())
    proc = subprocess.run(
        # -n 0: one process (the outer run's other worker keeps the second core busy).
        [sys.executable, "-c", PYTEST_WITHOUT_TENSORFLOW, "-q", "-p", "no:cacheprovider", "-x",
         "-n", "0",
         *files,
         "-k", "not tensorflow_only",
         # A test marked slow there (none at present) would run on TensorFlow only.
         "-m", "not slow"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"JAX backend run failed (exit {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, tail
