"""fit skips non-finite updates as the custom loop does (deep_nmt_tf.task.skipping): the
optimizer wrapper on TensorFlow and JAX, its checkpoints (and those written before it), and a
fit run that meets a non-finite batch, resumes at the right data position, and stops at a
streak."""

import os
import textwrap

import keras
import numpy as np
import pytest

from test_fit import _prepared_fit_run
from test_training_helpers import run_python

GOOD = np.array([1.0, -2.0, 3.0], "float32")
BAD = np.array([1.0, np.nan, 3.0], "float32")


def _apply(optimizer, variable, grads):
    """Applies each gradient (scaled by the optimizer's current loss scale, as fit's step
    scales the loss)."""
    for g in grads:
        scale = float(keras.ops.convert_to_numpy(optimizer.scale_loss(1.0)))
        optimizer.apply([g * scale], [variable])


@pytest.mark.parametrize("loss_scaling", [False, True], ids=["plain", "loss scaling"])
@pytest.mark.parametrize("accumulation", [None, 2], ids=["k=1", "k=2"])
def test_non_finite_micro_batches_are_skipped_and_counted(loss_scaling, accumulation):
    """Two NaN micro-batches between finite ones leave the weights where Adam fed only the
    finite ones puts them; they are counted (total, and in a row until the next finite one),
    and the data position counts them too."""
    from deep_nmt_tf.task.skipping import SkipNonFiniteUpdates, batches_consumed, skip_counts

    w, ref_w = keras.Variable(np.ones(3, "float32")), keras.Variable(np.ones(3, "float32"))
    optimizer = SkipNonFiniteUpdates(keras.optimizers.Adam(
        0.1, gradient_accumulation_steps=accumulation), loss_scaling=loss_scaling)
    reference = keras.optimizers.Adam(0.1, gradient_accumulation_steps=accumulation)
    optimizer.build([w])
    reference.build([ref_w])
    _apply(optimizer, w, [GOOD, BAD, BAD])
    assert skip_counts(optimizer) == (2, 2)
    _apply(optimizer, w, [GOOD])
    _apply(reference, ref_w, [GOOD, GOOD])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(w),
                               keras.ops.convert_to_numpy(ref_w), rtol=1e-6)
    assert not np.allclose(keras.ops.convert_to_numpy(w), 1.0)  # (updates were applied)
    assert skip_counts(optimizer) == (2, 0)
    assert batches_consumed(optimizer) == 4
    assert int(optimizer.iterations) == int(reference.iterations)  # the schedule's count
    scale = float(keras.ops.convert_to_numpy(optimizer.scale_loss(1.0)))
    assert scale == (2.0 ** 13 if loss_scaling else 1.0)  # halved twice, or never scaled
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, SkipNonFiniteUpdates) and again.loss_scaling == loss_scaling


def test_the_wrapper_skips_on_jax_as_on_tensorflow():
    """JAX's fit calls stateless_apply: the same weights and counters, under jit."""
    code = textwrap.dedent("""
        import jax, keras, numpy as np
        from deep_nmt_tf.task.skipping import SkipNonFiniteUpdates, batches_consumed, skip_counts
        good, bad = np.array([1., -2., 3.], "float32"), np.array([1., np.nan, 3.], "float32")
        for k in (None, 2):
            w = keras.Variable(np.ones(3, "float32"))
            opt = SkipNonFiniteUpdates(keras.optimizers.Adam(0.1, gradient_accumulation_steps=k))
            ref = keras.optimizers.Adam(0.1, gradient_accumulation_steps=k)
            opt.build([w])
            step = jax.jit(opt.stateless_apply)
            state, weights = [v.value for v in opt.variables], [w.value]
            for g in (good, bad, bad, good):
                weights, state = step(state, [g], weights)
            for v, value in zip(opt.variables, state):
                v.assign(value)
            r = keras.Variable(np.ones(3, "float32"))
            ref.build([r])
            ref.apply([good], [r]); ref.apply([good], [r])
            np.testing.assert_allclose(np.asarray(weights[0]), np.asarray(r.value), rtol=1e-6)
            assert skip_counts(opt) == (2, 0) and batches_consumed(opt) == 4, skip_counts(opt)
        print("OK")
    """)
    result = run_python(code, env={"KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def _dense_model(optimizer):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), epochs=3, verbose=0)
    return model


@pytest.mark.parametrize("earlier", ["adam", "loss scale"])
def test_checkpoints_from_before_the_counters_load_with_them_at_zero(tmp_path, earlier):
    """A .weights.h5 of a bare Adam or of Keras' LossScaleOptimizer (fit's float16 before the
    wrapper) restores the update count and Adam's state, with the counters at 0; another
    layout is an error (Keras only warns and leaves the optimizer as built)."""
    from deep_nmt_tf.task.skipping import SkipNonFiniteUpdates, skip_counts

    inner = keras.optimizers.Adam(0.01)
    old = _dense_model(inner if earlier == "adam" else
                       keras.optimizers.LossScaleOptimizer(inner))
    path = str(tmp_path / "old.weights.h5")
    old.save_weights(path)
    new = _dense_model(SkipNonFiniteUpdates(keras.optimizers.Adam(0.01),
                                            loss_scaling=earlier == "loss scale"))
    new.load_weights(path)
    assert int(new.optimizer.iterations) == 3 and skip_counts(new.optimizer) == (0, 0)
    for a, b in zip(old.optimizer.variables[-2:], new.optimizer.variables[-2:]):  # Adam's
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                      keras.ops.convert_to_numpy(b))
    other = _dense_model(SkipNonFiniteUpdates(keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=2)))
    with pytest.raises(ValueError, match="the checkpoint's optimizer has .* variables"):
        other.load_weights(path)


# -- a fit run ---------------------------------------------------------------------------------

class _PoisonBatches(keras.callbacks.Callback):
    """Makes the given training batches (0-based, over the run) non-finite: a weight set to inf
    before the batch, put back after it (as a skipped update leaves it).  It runs after the
    run's own callbacks, so a checkpoint due at the end of a poisoned batch would see the inf:
    the tests poison batches where none is due."""

    def __init__(self, batches):
        super().__init__()
        self.batches, self.seen, self._saved = set(batches), 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen in self.batches:
            weights = self.model.trainable_weights[0]
            self._saved = keras.ops.convert_to_numpy(weights).copy()
            weights.assign(np.full(self._saved.shape, np.inf, "float32"))

    def on_train_batch_end(self, batch, logs=None):
        if self._saved is not None:
            self.model.trainable_weights[0].assign(self._saved)
            self._saved = None
        self.seen += 1


def test_a_fit_run_skips_a_non_finite_micro_batch_and_resumes_at_its_data_position(
        tmp_path, caplog):
    """Micro-batch 2 of 8 (2 per update; the first of update 2) is non-finite: it is skipped
    with a WARNING, the run ends at update 4 with finite weights, and ckpt-4 resumes at update
    4 (the data position counts the skipped micro-batch; the update counter alone says 3)."""
    import logging as std_logging

    from deep_nmt_tf.fit import compiling
    from deep_nmt_tf.fit.run import restore_resume_point, train
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.task.skipping import skip_counts

    run = _prepared_fit_run(tmp_path, train_steps=4, log_every=2, checkpoint_every=2,
                            gradient_accumulation_steps=2)
    with caplog.at_level(std_logging.WARNING, logger="absl"):
        train(run, callbacks=[_PoisonBatches([2])])
    assert "update 2: 1 micro-batch(es) of this log window skipped" in caplog.text
    assert os.path.exists(os.path.join(run, "ckpt-4.weights.h5"))
    config = RunDir(run).load_config([])
    model = compiling.build_fit_model(config)
    compiling.compile_model(model, config)
    assert restore_resume_point(model, RunDir(run)) == 4
    assert skip_counts(model.optimizer) == (1, 0)
    assert int(model.optimizer.iterations) == 3  # 7 micro-batches applied, 3 whole updates
    assert all(np.isfinite(keras.ops.convert_to_numpy(v)).all()
               for v in model.trainable_weights)


def test_a_fit_run_stops_at_a_streak_of_skipped_updates(tmp_path):
    """training.max_consecutive_skipped=3: every batch from the 3rd on non-finite; the log step
    at update 3 sees 1 in a row, the one at update 6 sees 4 and stops the run; nothing is
    saved (no checkpoint was due before it)."""
    from deep_nmt_tf.fit.callbacks import FitDiverged
    from deep_nmt_tf.fit.run import train

    run = _prepared_fit_run(tmp_path, train_steps=20, log_every=3, checkpoint_every=100,
                            max_consecutive_skipped=3)
    with pytest.raises(FitDiverged) as raised:
        train(run, callbacks=[_PoisonBatches(range(2, 20))])
    message = str(raised.value)
    assert message.startswith("training stopped at update 6: the last 4 micro-batches were all "
                              "skipped because their loss or gradients were not finite "
                              "(training.max_consecutive_skipped=3).")
    assert "no checkpoint was written before it (a rerun starts again)" in message
    assert not [n for n in os.listdir(run) if n.endswith(".weights.h5")]
