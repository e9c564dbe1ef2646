"""The runner drives any trainer with the declared interface (Orbit's shape): a stub trainer
that implements only :class:`deep_nmt_tf.training.interface.TrainerInterface` is built, logged,
checkpointed, resumed and stopped by the runner; the trainer module does not import the runner."""

import ast
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.checkpointing import model_trackable
from deep_nmt_tf.training import PeriodicAction, Runner, TrainerInterface
from test_training_helpers import ROOT, tiny_config


class StubTrainer:
    """Only the declared interface: a one-weight model moved by a fixed step per update, fed
    with the numbers 0, 1, 2 ... (``data_position`` of them consumed)."""

    SUM_KEYS = ("loss_sum", "nll_sum", "num_tokens", "num_sentences", "source_tokens")
    built = []

    def __init__(self, config, run_dir, strategy):
        self.config = config
        self.accumulation_steps = 1
        with strategy.scope():
            self.model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            self.optimizer = keras.optimizers.SGD(0.5)
            self.optimizer.build(self.model.trainable_variables)
            counter = dict(dtype=tf.int64, trainable=False)
            self.step = tf.Variable(0, **counter)
            self.skipped_updates = tf.Variable(0, **counter)
            self.data_position = tf.Variable(0, **counter)
        self.seen = []
        StubTrainer.built.append(self)

    def checkpoint_items(self):
        return dict(model=model_trackable(self.model), optimizer=self.optimizer, step=self.step,
                    skipped_updates=self.skipped_updates, data_position=self.data_position)

    def distributed_iterator(self, skip=0):
        return iter(tf.data.Dataset.range(10 ** 6).skip(skip))

    def train_step(self, iterator, diagnostics=False):
        value = int(next(iterator))
        self.seen.append(value)
        kernel = self.model.trainable_variables[0]
        self.optimizer.apply([tf.ones_like(kernel)], [kernel])
        self.step.assign_add(1)
        self.data_position.assign_add(1)
        loss = float(value)
        return {"loss_sum": tf.constant(2.0 * loss), "nll_sum": tf.constant(loss),
                "num_tokens": tf.constant(2.0), "num_sentences": tf.constant(1.0),
                "source_tokens": tf.constant(3.0), "grad_norm": tf.constant(1.0),
                "skipped": tf.constant(0.0), "learning_rate": tf.constant(0.5)}


def _config(**training):
    keys = dict(train_steps=6, log_every=2, checkpoint_every=3, keep_checkpoints=5, eval_every=0)
    keys.update(training)
    return tiny_config(**keys)


def test_a_stub_trainer_with_only_the_declared_interface_is_run_checkpointed_and_resumed(
        tmp_path):
    assert not hasattr(StubTrainer, "evaluate") and not hasattr(StubTrainer, "train")
    model_dir = str(tmp_path / "run")
    runner = Runner(_config(), model_dir, trainer=StubTrainer)
    assert isinstance(runner.trainer, TrainerInterface) and runner.evaluator is None
    steps = []
    summary = runner.run(hooks=[lambda trainer, step, logs: steps.append((step, logs["loss"]))])
    assert [s for s, _ in steps] == [1, 2, 3, 4, 5, 6]
    assert [loss for _, loss in steps] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # loss_sum / tokens
    # The last log window (steps 5 and 6): per-token loss, throughput of 5 tokens per update.
    assert summary["loss"] == pytest.approx(4.5) and summary["nll"] == pytest.approx(2.25)
    assert summary["tokens_per_second"] > 0 and summary["grad_norm"] == 1.0
    assert sorted(f for f in os.listdir(model_dir) if f.endswith(".index")) == [
        "ckpt-3.index", "ckpt-6.index"]
    assert os.path.exists(os.path.join(model_dir, "config.yaml"))
    # A new runner resumes the stub where it stopped: counters, weights and data position.
    weights = runner.trainer.model.get_weights()
    longer = Runner(_config(train_steps=8), model_dir, trainer=StubTrainer)
    assert int(longer.trainer.step.numpy()) == 6 and longer.resume[0].endswith("ckpt-6")
    for a, b in zip(longer.trainer.model.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    longer.run()
    assert longer.trainer.seen == [6, 7]  # the consumed numbers were skipped


def test_an_action_stops_the_run_without_an_exception_and_a_checkpoint_is_written(tmp_path):
    model_dir = str(tmp_path / "run")
    runner = Runner(_config(train_steps=50, checkpoint_every=10), model_dir, trainer=StubTrainer)

    def budget(step, logs):
        if step == 4:
            runner.request_stop("a test's budget")

    runner.run(hooks=[PeriodicAction("budget", 1, budget)])
    assert runner.stopped == "a test's budget"
    assert int(runner.trainer.step.numpy()) == 4
    assert sorted(f for f in os.listdir(model_dir) if f.endswith(".index")) == ["ckpt-4.index"]
    assert runner.checkpoint_here().endswith("ckpt-4")  # the one written there
    runner.run(max_steps=5)
    assert runner.stopped is None and int(runner.trainer.step.numpy()) == 5


def test_a_trainer_without_the_interface_is_refused_naming_what_it_lacks(tmp_path):
    class Broken:
        def __init__(self, config, run_dir, strategy):
            self.config = config

    with pytest.raises(TypeError, match="lacks model, optimizer, step.*train_step"):
        Runner(_config(), str(tmp_path / "broken"), trainer=Broken)


def test_the_trainer_module_does_not_import_the_runner():
    path = os.path.join(ROOT, "deep_nmt_tf", "training", "trainer.py")
    imported = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    assert not {"deep_nmt_tf.training.runner", "deep_nmt_tf.training.Runner"} & imported, imported
    source = open(path, encoding="utf-8").read()
    assert "self.runner" not in source and "runner_lib" not in source  # no reference back
