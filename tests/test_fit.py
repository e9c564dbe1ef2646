"""Keras ``compile``/``fit`` (deep_nmt_tf.fit): the loss, schedules and optimizer options from a
config, what fit refuses, fit on TensorFlow in process and on JAX in a subprocess, and a model
trained with fit on JAX translated by ``deep-nmt-translate`` on TensorFlow (in
process)."""

import json
import os
import textwrap

import keras
import numpy as np
import pytest

from config_trees import constant
from keras_test_utils import fast_xla_compile_env
from test_training_helpers import (NO_DROPOUT, VOCAB, make_batches, run_python, run_tool,
                                   tiny_config)


def _token_ids(num_batches=8, batch_size=16, seed=0):
    """The copy task of test_training_helpers as a TokenIds (rows without </s>)."""
    from deep_nmt_tf.data.token_ids import TokenIds

    rows = []
    for batch in make_batches(num_batches, batch_size, seed):
        for src in batch["source_ids"]:
            toks = [int(t) for t in src if t > 2]
            rows.append(toks)
    return TokenIds.from_rows(rows, rows, VOCAB)


# -- the loss --------------------------------------------------------------------------------

@pytest.mark.parametrize("normalization", ["token", "sentence"])
def test_keras_loss_is_the_custom_loops_sum_over_its_denominator(normalization):
    from deep_nmt_tf.task.losses import (LabelSmoothedCrossEntropy, cross_entropy_sums,
                                         loss_denominator)

    rng = np.random.RandomState(0)
    logits = rng.randn(3, 5, 11).astype("float32")
    labels = np.array([[4, 5, 2, 0, 0], [6, 2, 0, 0, 0], [7, 8, 9, 10, 2]], np.int32)
    sums = cross_entropy_sums(logits, labels, 0.1)
    want = float(sums.loss) / float(loss_denominator(sums, normalization))
    loss = LabelSmoothedCrossEntropy(0.1, normalization)
    assert float(loss(labels, logits)) == pytest.approx(want, rel=1e-5)
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert again.get_config() == loss.get_config()


# -- schedules, optimizer, refusals ----------------------------------------------------------

def test_update_count_schedule_reads_the_schedule_at_updates():
    from deep_nmt_tf.task.schedules import InverseSqrtSchedule, UpdateCountSchedule

    inner = InverseSqrtSchedule(1e-3, 4, 1e-7)
    wrapped = UpdateCountSchedule(inner, 3)
    for calls in range(12):
        assert float(wrapped(calls)) == pytest.approx(float(inner(calls // 3)))
    again = UpdateCountSchedule.from_config(wrapped.get_config())
    assert float(again(7)) == pytest.approx(float(wrapped(7)))


def test_compile_model_maps_the_training_keys_to_keras_options():
    from deep_nmt_tf import fit
    from deep_nmt_tf.task.losses import LabelSmoothedCrossEntropy
    from deep_nmt_tf.task.schedules import UpdateCountSchedule

    config = tiny_config(clip_norm=0.5, gradient_accumulation_steps=2, label_smoothing=0.2,
                         weight_decay=1e-4)
    model = fit.build_fit_model(config)
    fit.compile_model(model, config)
    from deep_nmt_tf.task.skipping import SkipNonFiniteUpdates

    assert isinstance(model.optimizer, SkipNonFiniteUpdates)  # skips non-finite updates
    assert not model.optimizer.loss_scaling  # (float32)
    opt = model.optimizer.inner_optimizer
    assert opt.global_clipnorm == pytest.approx(0.5)
    assert opt.gradient_accumulation_steps == 2
    assert isinstance(opt._learning_rate, UpdateCountSchedule)
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert model.loss.label_smoothing == pytest.approx(0.2)
    assert any(v.regularizer is not None for v in model.trainable_variables)


@pytest.mark.parametrize("key,override", [
    ("training.adaptive_clipping.enabled", {"adaptive_clipping": {"enabled": True}}),
    ("training.grad_norm_ratio_every", {"grad_norm_ratio_every": 5}),
    ("training.spike_rollbacks", {"spike_rollbacks": 1}),
])
def test_fit_refuses_what_it_cannot_do_naming_the_key(key, override):
    from deep_nmt_tf import fit
    from deep_nmt_tf.config import ConfigError

    config = tiny_config(**override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        fit.check_fit_config(config)


# -- fit on TensorFlow, in process -----------------------------------------------------------

def _first_and_last_loss(history):
    losses = history.history["loss"]
    return losses[0], losses[-1]


def test_fit_loss_falls_on_tensorflow():
    from deep_nmt_tf import fit
    from deep_nmt_tf.data.batching import TokenBatches

    config = tiny_config(train_steps=60, schedule=constant(1e-2), batch_tokens=256,
                         model=NO_DROPOUT)
    model = fit.build_fit_model(config)
    fit.compile_model(model, config)
    batches = TokenBatches.from_config(config, _token_ids(), num_batches=15)
    history = model.fit(batches, epochs=4, shuffle=False, verbose=0)
    first, last = _first_and_last_loss(history)
    assert np.isfinite(last) and last < 0.8 * first, history.history


# -- fit on JAX (subprocess), translated on TensorFlow ---------------------------------------

TINY_RUN = """
model:
  d_model: 32
  encoder:
    type: transformer
    transformer: {num_layers: 1, num_heads: 2, ffn_dim: 64, norm: pre,
                  input_dropout: 0.0, residual_dropout: 0.0}
  decoder:
    type: transformer
    transformer: {num_layers: 1, num_heads: 2, ffn_dim: 64, norm: pre,
                  input_dropout: 0.0, residual_dropout: 0.0}
data:
  corpus: synthetic
  synthetic_train_size: 600
  synthetic_dev_size: 16
  synthetic_test_size: 8
  vocab_size: 120
  max_source_length: 24
  max_target_length: 24
  num_buckets: 2
training:
  train_steps: 40
  batch_tokens: 768
  schedule:
    type: constant
    constant: {learning_rate: 5.0e-3, warmup_steps: 0}
  label_smoothing: 0.1
  log_every: 10
  checkpoint_every: 20
  eval_every: 0
decoding:
  beam_size: 1
  batch_size: 8
"""

# Trains with deep_nmt_tf.fit.run.train under JAX as on a machine without TensorFlow (importing
# it fails), then decodes the test sentences greedily in process; prints JSON: the per-epoch
# losses, the hypotheses, whether TensorFlow was imported.
JAX_SCRIPT = textwrap.dedent("""
    import importlib.abc, json, sys

    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
                raise ImportError(f"no {name} on this machine (test)")

    sys.meta_path.insert(0, NoTensorFlow())
    import keras, numpy as np
    from deep_nmt_tf.fit.run import train
    from deep_nmt_tf.data.token_ids import Detokenizer, TokenIds
    from deep_nmt_tf.decoding import greedy_search
    from deep_nmt_tf.fit.compiling import build_fit_model
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.constants import EOS_ID

    assert keras.backend.backend() == "jax"
    model_dir = sys.argv[1]
    losses = []
    cb = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: losses.append(float(logs["loss"])))
    train(model_dir, callbacks=[cb])
    run = RunDir(model_dir)
    config = run.load_config()
    model = build_fit_model(config)
    model.load_weights(run.list_keras_weights()[-1])
    test = TokenIds.load(run.token_file("test"))
    rows = [list(test.source(i)) + [EOS_ID] for i in range(len(test))]
    width = max(len(r) for r in rows)
    src = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    d = config.decoding
    out = greedy_search(model, src, max_length_a=d.max_length_a, max_length_b=d.max_length_b)
    ids = keras.ops.convert_to_numpy(out["ids"])[:, 0]
    hyps = Detokenizer(config.data.vocab).batch(ids)
    print("RESULT " + json.dumps({"losses": losses, "hyps": hyps,
                                  "tensorflow": "tensorflow" in sys.modules,
                                  "devices": len(keras.distribution.list_devices())}))
""")


@pytest.mark.slow
def test_fit_on_jax_then_translate_on_tensorflow_gives_the_same_output(tmp_path):
    pytest.importorskip("jax")
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(TINY_RUN)
    run_dir = str(tmp_path / "run")
    out = run_tool("preprocess", f"--config={config_path}", f"--model_dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    # Two CPU devices: fit trains data-parallel (keras.distribution.DataParallel), as on GPUs;
    # XLA compiles its steps and the search with FAST_XLA_COMPILE_FLAGS.
    xla_flags = fast_xla_compile_env()["XLA_FLAGS"]
    proc = run_python(JAX_SCRIPT.replace("sys.argv[1]", repr(run_dir)),
                      env={"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                           "XLA_FLAGS": f"{xla_flags} --xla_force_host_platform_device_count=2",
                           "XDG_CACHE_HOME": str(tmp_path / "cache"),
                           "DEEP_NMT_COMPILATION_CACHE": "on",
                           # JAX keeps only compilations of over 1 s by default, and this tiny
                           # model's may take less on a quiet machine: keep every one, so
                           # that the cache check below does not depend on the machine's load.
                           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"},
                      timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert not result["tensorflow"], "fit on JAX imported TensorFlow"
    assert result["devices"] == 2
    losses = result["losses"]
    assert len(losses) == 4 and losses[-1] < 0.85 * losses[0], losses
    assert sorted(os.listdir(run_dir))[:2] == ["ckpt-20.weights.h5", "ckpt-40.weights.h5"]
    # The compiled steps were kept for the next run (JAX's persistent compilation cache).
    assert os.listdir(tmp_path / "cache" / "deep_nmt_tf" / "jax_compilation_cache")

    # deep-nmt-translate in this process (TensorFlow; its subprocess runs:
    # tests/test_tools_translate_eval.py), in float32 as the search above: on a CPU with
    # bfloat16 instructions the tool's default is bfloat16, whose ids may differ.
    from absl import flags
    from deep_nmt_tf.tools import translate as translate_tool

    test_source = os.path.join(run_dir, "data", "test.src")
    output = tmp_path / "test.hyp"
    flags.FLAGS.unparse_flags()
    translate_tool.main(flags.FLAGS(["translate", f"--model_dir={run_dir}",
                                     f"--input={test_source}", f"--output={output}",
                                     "--beam_size=1", "--precision=float32"]))
    assert output.read_text(encoding="utf-8").splitlines() == result["hyps"]
    assert any(h.strip() for h in result["hyps"])


# -- divergence: nothing non-finite is saved --------------------------------------------------

def test_a_fit_run_that_diverges_stops_without_saving_and_names_the_last_good_checkpoint(
        tmp_path, caplog):
    """Weights poisoned with NaN after update 5 (a non-finite update would do the same: fit
    applies it): the run stops at the next log step, 6, without writing ckpt-6 (nor the end's),
    so the rotation (2 kept) keeps ckpt-2 and ckpt-4; FitDiverged names ckpt-4, which a rerun
    with finite weights resumes from."""
    import logging as std_logging

    from deep_nmt_tf.fit.callbacks import FitDiverged
    from deep_nmt_tf.fit.run import train

    run = _prepared_fit_run(tmp_path, train_steps=10, log_every=2, checkpoint_every=2,
                            keep_checkpoints=2)
    updates = []

    def poison(batch, logs):
        updates.append(batch)
        if len(updates) == 5:
            weights = cb.model.trainable_weights[0]
            weights.assign(keras.ops.full(weights.shape, float("nan")))

    cb = keras.callbacks.LambdaCallback(on_train_batch_end=poison)
    with caplog.at_level(std_logging.ERROR, logger="absl"):
        with pytest.raises(FitDiverged) as raised:
            train(run, callbacks=[cb])
    assert len(updates) == 6  # stopped at the log step after the poisoned update
    message = str(raised.value)
    assert message.startswith("training stopped at update 6: the model's weights are not "
                              "finite.")
    assert f"the last good checkpoint is {os.path.join(run, 'ckpt-4.weights.h5')}" in message
    assert sorted(n for n in os.listdir(run) if n.endswith(".weights.h5")) == [
        "ckpt-2.weights.h5", "ckpt-4.weights.h5"]
    assert "Update 6: the model's weights are not finite; stopping without saving" in \
        caplog.text
    assert train(run, overrides=["training.train_steps=6"])["loss"] > 0  # resumes from ckpt-4
    assert os.path.exists(os.path.join(run, "ckpt-6.weights.h5"))


# -- SIGTERM and Ctrl-C: a checkpoint at the update reached -----------------------------------

def _prepared_fit_run(tmp_path, **training):
    """A tiny run directory prepared for fit (deep-nmt-preprocess's token ids)."""
    from deep_nmt_tf.config import config_from_dict
    from deep_nmt_tf.data.preprocess import preprocess_run
    from test_decoding_helpers import TINY

    run = str(tmp_path / "run")
    model = dict(TINY["model"], decoder=TINY["model"]["encoder"])
    tree = dict(TINY, model=model, training=dict(TINY["training"], **training))
    preprocess_run(config_from_dict(tree, source="<fit run>"), run)
    return run


@pytest.mark.parametrize("sig,every", [("SIGTERM", 100), ("SIGINT", 4)],
                         ids=["SIGTERM", "SIGINT at a checkpoint step"])
def test_a_signal_stops_fit_after_the_update_with_a_checkpoint(tmp_path, sig, every):
    """The signal, sent after update 3's callbacks (the run's own first), is seen at the end of
    update 4, the update in progress: the run saves ckpt-4 there (once, also where a periodic
    checkpoint falls) and stops; a rerun resumes from it."""
    import signal

    from deep_nmt_tf.fit.run import train
    from deep_nmt_tf.health import TrainingInterrupted

    number = getattr(signal, sig)
    previous = signal.getsignal(number)
    if previous == signal.SIG_IGN:  # (pytest as a background job: SIGINT ignored, left alone)
        signal.signal(number, signal.default_int_handler)
    try:
        run = _prepared_fit_run(tmp_path, train_steps=20, log_every=2, checkpoint_every=every)
        batches = []

        def send(batch, logs):
            batches.append(batch)
            if len(batches) == 3:
                os.kill(os.getpid(), number)

        with pytest.raises(TrainingInterrupted) as stopped:
            train(run, callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=send)])
        saved = os.path.join(run, "ckpt-4.weights.h5")
        assert str(stopped.value) == (f"interrupted by {sig} at step 4; saved {saved}. Run the "
                                      "same command again to resume from it.")
        assert len(batches) == 4 and os.path.exists(saved)
        assert signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler,
                                            previous)  # restored
        assert train(run, overrides=["training.train_steps=5"])["loss"] > 0  # resumes at 4
        assert sorted(n for n in os.listdir(run) if n.endswith(".weights.h5")) == [
            "ckpt-4.weights.h5", "ckpt-5.weights.h5"]
    finally:
        signal.signal(number, previous)


def test_fit_warns_when_the_loss_explodes_as_the_custom_loop_does(caplog):
    """training.loss_explosion_factor: the log line whose loss is 10x the lowest so far gets
    the custom loop's WARNING (HealthMonitor), once per further factor."""
    import logging as std_logging
    import types

    from deep_nmt_tf.fit.callbacks import ProgressLogger

    logger = ProgressLogger(100, loss_explosion_factor=10.0, stream=open(os.devnull, "w"))
    logger.set_model(types.SimpleNamespace(optimizer=types.SimpleNamespace(learning_rate=1e-3)))
    with caplog.at_level(std_logging.WARNING, logger="absl"):
        for epoch, loss in enumerate([4.0, 2.0, 9.0, 25.0, 30.0]):
            logger._batches = 10 * (epoch + 1)
            logger.on_epoch_end(epoch, {"loss": loss})
    warnings = [r.getMessage() for r in caplog.records if "the loss is exploding" in
                r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(
        "step 40: the loss is exploding: 25 is 12.5x the lowest so far (2 at step 20")
