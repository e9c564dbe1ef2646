"""Shared helpers of the decoding/export/tool tests (TensorFlow): a small trained model directory.

``trained_model_dir(tmp_path_factory)`` trains a tiny Transformer for a few steps on a small
synthetic corpus with the real :class:`deep_nmt_tf.training.Trainer` and returns the model
directory (``config.yaml``, ``vocab.txt``, ``data/``, checkpoints ``ckpt-8/16/24``).  It is
built once per test session (cached under the session's base temporary directory).
"""

import os

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


def tiny_config():
    from deep_nmt_tf.config import config_from_dict

    return config_from_dict(TINY, source="<tiny test config>")


def trained_model_dir(tmp_path_factory) -> str:
    """Path of the session's tiny trained model directory (built on first use by the real
    :class:`deep_nmt_tf.training.Trainer`; a failing trainer fails the tests that need it)."""
    from deep_nmt_tf.training import Runner

    model_dir = str(tmp_path_factory.getbasetemp() / "deep_nmt_trained_model")
    ready = os.path.join(model_dir, "READY")
    if os.path.exists(ready):
        return model_dir
    Runner(tiny_config(), model_dir).run()
    with open(ready, "w") as f:
        f.write("trainer\n")
    return model_dir


def test_trained_model_dir_layout(tmp_path_factory):
    model_dir = trained_model_dir(tmp_path_factory)
    files = os.listdir(model_dir)
    assert "config.yaml" in files
    assert f"ckpt-{STEPS[-1]}.index" in files
    from deep_nmt_tf.checkpointing import list_checkpoints

    steps = [int(p.rsplit("-", 1)[1]) for p in list_checkpoints(model_dir)]
    assert steps == list(STEPS)
    assert np.all(np.diff(steps) > 0)
