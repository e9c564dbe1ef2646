"""Shared helpers of the decoding/export/tool tests (TensorFlow): a small trained model directory.

``trained_model_dir(tmp_path_factory)`` trains a tiny Transformer for a few steps on a small
synthetic corpus with the real :class:`deep_nmt_tf.training.Trainer` and returns the model
directory (``config.yaml``, ``vocab.txt``, ``data/``, checkpoints ``ckpt-8/16/24``).  It is
built once per test session (cached under the session's base temporary directory).  If the
trainer is not usable (it is developed in parallel), the same layout is produced with a minimal
training loop instead, and a warning says so.
"""

import os
import subprocess
import sys
import warnings

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


def _train_with_trainer(model_dir):
    from deep_nmt_tf.training import Trainer

    Trainer(tiny_config(), model_dir).train()


def _train_fallback(model_dir):
    """The trainer's layout without the trainer: config.yaml, vocab, model checkpoints."""
    import keras
    import tensorflow as tf

    from deep_nmt_tf.config import save_config
    from deep_nmt_tf.data.pipeline import make_train_dataset, prepare_data
    from deep_nmt_tf.data.vocab import Tokenizer
    from deep_nmt_tf.models import build_model

    keras.utils.set_random_seed(42)
    config = prepare_data(tiny_config(), model_dir)
    save_config(config, os.path.join(model_dir, "config.yaml"))
    tokenizer = Tokenizer(config.data.vocab, lowercase=config.data.lowercase)
    model = build_model(config)
    optimizer = keras.optimizers.Adam(3e-3)
    step = tf.Variable(0, dtype=tf.int64)
    from deep_nmt_tf.checkpointing import model_trackable

    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model_trackable(model), step=step), model_dir, max_to_keep=5,
        step_counter=step)

    @tf.function
    def train_step(batch):
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            labels = batch["target_output_ids"]
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            mask = tf.cast(labels != 0, tf.float32)
            loss = tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    for batch in make_train_dataset(config, tokenizer).take(STEPS[-1]):
        train_step(batch)
        step.assign_add(1)
        if int(step.numpy()) in STEPS:
            manager.save(checkpoint_number=int(step.numpy()))


def trained_model_dir(tmp_path_factory) -> str:
    """Path of the session's tiny trained model directory (built on first use)."""
    model_dir = str(tmp_path_factory.getbasetemp() / "deep_nmt_trained_model")
    ready = os.path.join(model_dir, "READY")
    if os.path.exists(ready):
        return model_dir
    try:
        _train_with_trainer(model_dir)
        how = "trainer"
    except Exception as e:  # noqa: BLE001 - the trainer is developed in parallel.
        warnings.warn(f"deep_nmt_tf.training.Trainer unusable ({type(e).__name__}: {e}); "
                      "building the test model directory with a minimal training loop")
        import shutil

        shutil.rmtree(model_dir, ignore_errors=True)
        os.makedirs(model_dir)
        _train_fallback(model_dir)
        how = "fallback"
    with open(ready, "w") as f:
        f.write(how + "\n")
    return model_dir


def run_python(code: str, timeout: int = 300, env=None) -> subprocess.CompletedProcess:
    """Runs ``python -c code`` in a fresh process (repo root as cwd); returns the result."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def test_trained_model_dir_layout(tmp_path_factory):
    model_dir = trained_model_dir(tmp_path_factory)
    files = os.listdir(model_dir)
    assert "config.yaml" in files
    assert f"ckpt-{STEPS[-1]}.index" in files
    from deep_nmt_tf.checkpointing import list_checkpoints

    steps = [int(p.rsplit("-", 1)[1]) for p in list_checkpoints(model_dir)]
    assert steps == list(STEPS)
    assert np.all(np.diff(steps) > 0)
