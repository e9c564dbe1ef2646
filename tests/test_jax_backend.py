"""Re-runs the pure-Keras layer and model tests under ``KERAS_BACKEND=jax`` (the first case of
each parametrized test, ``tests/conftest.py``), and checks that ``deep_nmt_tf.layers`` /
``deep_nmt_tf.models`` never import TensorFlow."""

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


@pytest.mark.slow
def test_layer_and_model_tests_pass_on_jax():
    pytest.importorskip("jax")
    files = _pure_keras_test_files()
    assert files, "no tests/test_layers_*.py or tests/test_models_*.py found"
    # DEEP_NMT_JAX_RERUN: the first case of each parametrized test (tests/conftest.py), some
    # on smaller models (keras_test_utils.JAX_RERUN).  Eager JAX compiles each op on its first
    # use: most of the run is XLA compiling small programs, which FAST_XLA_COMPILE_FLAGS
    # makes about twice as fast.
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", DEEP_NMT_JAX_RERUN="1",
               **fast_xla_compile_env())
    proc = subprocess.run(
        # -n 0: one process (the outer run's other worker keeps the second core busy).
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-n", "0",
         *files,
         "-k", "not tensorflow_only",
         # A test marked slow there (none at present) would run on TensorFlow only.
         "-m", "not slow"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"JAX backend run failed (exit {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, tail
