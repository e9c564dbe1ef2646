"""Every notebook in examples/ runs top to bottom in a fresh kernel (nbclient), on the
TensorFlow and the JAX backend."""

import glob
import os

import pytest

from keras_test_utils import fast_xla_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "examples", "*.ipynb")))


def test_there_are_notebooks():
    assert any(p.endswith("quickstart.ipynb") for p in NOTEBOOKS), NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, backend, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if backend == "jax":
        pytest.importorskip("jax")
    notebook = nbformat.read(path, as_version=4)
    # XLA (JAX's fit and search) compiles with FAST_XLA_COMPILE_FLAGS: the same programs.
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               **fast_xla_compile_env())
    # The native kernel is this interpreter (the package and its dependencies as tests see them).
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name=NATIVE_KERNEL_NAME,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=env)
    finally:  # Kept for a look at what went wrong.
        nbformat.write(notebook, str(tmp_path / os.path.basename(path)))
    outputs = "".join(o.get("text", "") for cell in notebook.cells
                      for o in cell.get("outputs", []))
    assert f"on {backend}" in outputs
    assert "transparent_attention" in outputs and "encoder_dlcl" in outputs
    images = [o for cell in notebook.cells for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the figure cell showed no image"
