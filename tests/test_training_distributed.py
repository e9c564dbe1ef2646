"""MirroredStrategy on two logical CPUs gives the same updates as the default strategy.

TensorFlow must be told to split the CPU into two logical devices before it initialises, so the
checks run in a fresh Python process (independent of test order).
"""

import textwrap

import pytest

from test_training_helpers import run_python

SCRIPT = textwrap.dedent("""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import keras
    import numpy as np

    from config_trees import constant
    from deep_nmt_tf.training import Runner, make_strategy
    from test_training_helpers import (NO_DROPOUT, make_batches, make_trainer_class,
                                       optimizer_state, tiny_config, weights)

    mirrored = make_strategy("mirrored")
    assert mirrored.num_replicas_in_sync == 2, mirrored.num_replicas_in_sync

    # 1. What Keras 3 does with per-replica gradients in replica context: it sums them.
    with mirrored.scope():
        w = keras.Variable(np.zeros([2], np.float32))
        sgd = keras.optimizers.SGD(1.0)
        sgd.build([w])

    @tf.function
    def sgd_step():
        def fn():
            ctx = tf.distribute.get_replica_context()
            g = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32) * tf.ones([2])
            sgd.apply([g], [w])
        mirrored.run(fn)

    sgd_step()
    np.testing.assert_allclose(w.numpy(), [-3.0, -3.0])  # -(1 + 2): summed, not averaged
    print("keras sums gradients across replicas: ok")

    # 2. The trainer: one global batch per update, default strategy vs two replicas.
    batches = make_batches(4, batch_size=8, seed=21)
    common = dict(train_steps=2, adam_epsilon=1.0, schedule=constant(0.5), checkpoint_every=1,
                  clip_norm=0.3, weight_decay=1e-3)

    runners = {{}}

    def eagerly(function, *args, **kwargs):
        # The step's code without tracing it: for the default strategy's references (its
        # compiled step is every other training test's) and the resume below (what it checks
        # happens around the step).  Under the strategy, the steps compared are compiled.
        tf.config.run_functions_eagerly(True)
        try:
            return function(*args, **kwargs)
        finally:
            tf.config.run_functions_eagerly(False)

    def run(strategy, split, model_dir, setup=None, hooks=(), **extra):
        cls = make_trainer_class(batches, split=split)
        runner = Runner(tiny_config(NO_DROPOUT, **{{**common, **extra}}), model_dir,
                        strategy=strategy, trainer=cls)
        trainer = runners[model_dir] = runner.trainer
        if setup is not None:
            setup(trainer)
        logs = []
        hooks = [lambda t, s, l: logs.append(l)] + list(hooks)
        if strategy is mirrored:
            runner.run(hooks=hooks)
        else:
            eagerly(runner.run, hooks=hooks)
        runners[model_dir] = runner
        return trainer, logs

    default, logs_d = run(make_strategy("default"), 1, "{tmp}/default")
    replicas, logs_m = run(mirrored, 2, "{tmp}/mirrored")
    accumulated, logs_a = run(mirrored, 4, "{tmp}/accumulated", gradient_accumulation_steps=2)
    # training.static_shapes: the micro-batches enter per-shape traced functions as
    # distributed values (taken from the distributed iterator outside the function).
    per_shape, logs_s = run(mirrored, 4, "{tmp}/static", gradient_accumulation_steps=2,
                            static_shapes=True)
    for other, logs in ((replicas, logs_m), (accumulated, logs_a), (per_shape, logs_s)):
        for a, b in zip(logs_d, logs):
            for key in ("loss", "num_tokens", "num_sentences", "grad_norm", "learning_rate"):
                np.testing.assert_allclose(a[key], b[key], rtol=2e-6, err_msg=key)
        for a, b in zip(weights(default), weights(other)):
            np.testing.assert_allclose(a, b, atol=2e-6)
        for a, b in zip(optimizer_state(default), optimizer_state(other)):
            np.testing.assert_allclose(a, b, atol=2e-6)
    print("mirrored == default: ok")

    # Evaluation (on the first device, in cross-replica context) works under the strategy.
    replicas_run, default_run = runners["{tmp}/mirrored"], runners["{tmp}/default"]
    ev_m = replicas_run.evaluate(write_summaries=False)
    ev_d = eagerly(default_run.evaluate, write_summaries=False)
    assert sorted(ev_m) == ["bleu", "loss", "nll", "perplexity"], ev_m
    np.testing.assert_allclose(ev_m["loss"], ev_d["loss"], rtol=1e-5)
    print("evaluation under mirrored: ok")

    # 3. Stop after 1 step, resume under the strategy (the consumed batches are skipped).
    cls = make_trainer_class(batches, split=2)
    eagerly(Runner(tiny_config(NO_DROPOUT, **common), "{tmp}/resumed", strategy=mirrored,
                   trainer=cls).run, max_steps=1)
    runner = Runner(tiny_config(NO_DROPOUT, **common), "{tmp}/resumed", strategy=mirrored,
                    trainer=cls)
    resumed = runner.trainer
    assert int(resumed.step.numpy()) == 1 and int(resumed.data_position.numpy()) == 1
    eagerly(runner.run)
    for a, b in zip(weights(resumed), weights(replicas)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    print("mirrored resume: ok")

    # 4. A checkpoint written under MirroredStrategy resumes under the default strategy.
    cls = make_trainer_class(batches, split=1)
    restored = Runner(tiny_config(NO_DROPOUT, **common), "{tmp}/mirrored", trainer=cls).trainer
    assert int(restored.step.numpy()) == 2
    for a, b in zip(weights(restored), weights(replicas)):
        np.testing.assert_array_equal(a, b)
    print("mirrored checkpoint restores: ok")

    # 5. Mixed precision under the strategy: the same updates (to bfloat16/float16 rounding).
    # float16: the first step overflows on both (scale 2^127), then a scale that overflows on
    # neither (the per-replica gradients are smaller: near the limit the decisions may differ).
    def overflow(trainer):
        if trainer.loss_scaling is not None:
            trainer.loss_scaling.optimizer.dynamic_scale.assign(2.0 ** 127)

    def then_fit(trainer, step, logs):
        if trainer.loss_scaling is not None and step == 1:
            assert logs["overflow"] == 1.0 and logs["loss_scale"] == 2.0 ** 127, logs
            assert float(trainer.loss_scaling.current_scale()) == 2.0 ** 126  # halved
            trainer.loss_scaling.optimizer.dynamic_scale.assign(2.0 ** 8)

    for precision in ("mixed_bfloat16", "mixed_float16"):
        extra = dict(precision=precision, train_steps=4, setup=overflow, hooks=[then_fit])
        default, logs_d = run(make_strategy("default"), 1, "{tmp}/d_" + precision, **extra)
        replicas, logs_m = run(mirrored, 2, "{tmp}/m_" + precision, **extra)
        for a, b in zip(logs_d, logs_m):
            assert a["skipped"] == b["skipped"], (a, b)
            for key in ("loss", "grad_norm", "loss_scale", "overflow_updates"):
                if key in a:
                    np.testing.assert_allclose(a[key], b[key], rtol=2e-2, err_msg=key)
        for a, b in zip(weights(default), weights(replicas)):
            np.testing.assert_allclose(a, b, atol=2e-2)
        assert int(replicas.skipped_updates.numpy()) == int(default.skipped_updates.numpy())
    print("mixed precision under mirrored: ok")
""")


@pytest.mark.slow
def test_mirrored_strategy_matches_default(tmp_path):
    proc = run_python(SCRIPT.format(tmp=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    assert "mirrored == default: ok" in proc.stdout
    assert "evaluation under mirrored: ok" in proc.stdout
    assert "mirrored resume: ok" in proc.stdout
    assert "mirrored checkpoint restores: ok" in proc.stdout
    assert "mixed precision under mirrored: ok" in proc.stdout
