"""Shared helpers of the decoding/export/tool tests (TensorFlow): a small trained model directory.

``trained_model_dir(tmp_path_factory)`` trains a tiny Transformer for a few steps on a small
synthetic corpus with the real :class:`deep_nmt_tf.training.Trainer` and returns the model
directory (``config.yaml``, ``vocab.txt``, ``data/``, checkpoints ``ckpt-8/16/24``).  It is
built once per test session, by whichever pytest-xdist worker asks first (:func:`build_once`);
tests only read it (a test that changes a run copies it first, ``shutil.copytree``).
"""

import fcntl
import os
import shutil

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_STACK = dict(num_heads=2, ffn_dim=64, norm="pre", input_dropout=0.0, residual_dropout=0.0)
TINY = {
    "model": dict(d_model=32, encoder=dict(transformer=dict(_STACK, num_layers=1)),
                  decoder=dict(transformer=dict(_STACK, num_layers=2))),
    "data": dict(corpus="synthetic", synthetic_train_size=400, synthetic_dev_size=12,
                 synthetic_test_size=12, vocab_size=300, num_buckets=2, shuffle_buffer=100,
                 max_source_length=48, max_target_length=48),
    "training": dict(train_steps=24, batch_tokens=1024,
                     schedule=dict(type="constant", constant=dict(learning_rate=3e-3)),
                     log_every=8, checkpoint_every=8, keep_checkpoints=5, eval_every=0),
    "decoding": dict(beam_size=3, n_best=2, batch_size=8, max_input_length=40),
}
STEPS = (8, 16, 24)


def shared_dir(tmp_path_factory) -> str:
    """The directory every process of this test session shares: the base temporary directory,
    or under pytest-xdist its parent (each worker's base temporary directory is a child of
    it, and a new session gets a new one)."""
    base = tmp_path_factory.getbasetemp()
    return str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def build_once(tmp_path_factory, name: str, build) -> str:
    """``SHARED/name`` (:func:`shared_dir`), made by ``build(path)`` in the first process of
    the session that asks for it; the others wait on a file lock and reuse it.  A build that
    fails leaves nothing behind that counts as built: the next caller tries again (and fails
    its own tests the same way)."""
    path = os.path.join(shared_dir(tmp_path_factory), name)
    ready = path + ".ready"
    if os.path.exists(ready):
        return path
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(ready):
                shutil.rmtree(path, ignore_errors=True)  # what a failed build left
                build(path)
                with open(ready, "w"):
                    pass
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def trained_run(tmp_path_factory, name: str, tree: dict, source: str) -> str:
    """A run directory of the config ``tree`` trained by the real
    :class:`deep_nmt_tf.training.Runner`, once per test session (:func:`build_once`)."""

    def build(model_dir):
        from deep_nmt_tf.config import config_from_dict
        from deep_nmt_tf.training import Runner

        Runner(config_from_dict(tree, source=source), model_dir).run()

    return build_once(tmp_path_factory, name, build)


def trained_model_dir(tmp_path_factory) -> str:
    """Path of the session's tiny trained model directory (built on first use by the real
    :class:`deep_nmt_tf.training.Trainer`; a failing trainer fails the tests that need it)."""
    return trained_run(tmp_path_factory, "deep_nmt_trained_model", TINY, "<tiny test config>")


def test_trained_model_dir_layout(tmp_path_factory):
    model_dir = trained_model_dir(tmp_path_factory)
    files = os.listdir(model_dir)
    assert "config.yaml" in files
    assert f"ckpt-{STEPS[-1]}.index" in files
    from deep_nmt_tf.checkpointing import list_checkpoints

    steps = [int(p.rsplit("-", 1)[1]) for p in list_checkpoints(model_dir)]
    assert steps == list(STEPS)
    assert np.all(np.diff(steps) > 0)
