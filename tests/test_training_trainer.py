"""The training loop: learning, accumulation, exact resume after a kill, config checks."""

import logging
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.checkpoints import CheckpointStore
from deep_nmt_tf.config import ConfigError
from deep_nmt_tf.decoding.search import search
from deep_nmt_tf.training import Runner, metrics, optimizers
from deep_nmt_tf.task import losses as losses_lib
from config_trees import constant, merge, stacks
from test_training_helpers import (NO_DROPOUT, copy_batch, make_batches, make_trainer_class,
                                   optimizer_state, run_python, split_batch, tiny_config,
                                   weights)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained 30 steps on the copy task (module-scoped: reused by several tests)."""
    model_dir = str(tmp_path_factory.mktemp("trained"))
    cls = make_trainer_class(make_batches(6, batch_size=16))
    runner = Runner(tiny_config(train_steps=30, eval_every=15, log_every=10, checkpoint_every=10,
                                keep_checkpoints=2, schedule=constant(1e-2), clip_norm=5.0,
                                adaptive_clipping={"enabled": True}), model_dir, trainer=cls)
    before = runner.evaluate(write_summaries=False)
    logs = runner.run()
    return runner.trainer, before, logs, runner


def test_training_reduces_loss_and_writes_outputs(trained):
    trainer, before, logs, runner = trained
    assert int(trainer.step.numpy()) == 30
    assert int(trainer.optimizer.iterations.numpy()) == 30
    assert int(trainer.data_position.numpy()) == 30
    assert logs["eval_loss"] < before["loss"] - 0.5, (before, logs)
    assert logs["loss"] < before["loss"] - 0.3, (before, logs)
    assert 0.0 <= logs["eval_bleu"] <= 100.0
    assert logs["skipped_updates"] == 0 and logs["tokens_per_second"] > 0
    files = os.listdir(trainer.model_dir)
    assert "config.yaml" in files
    assert sorted(f for f in files if f.endswith(".index")) == ["ckpt-20.index", "ckpt-30.index"]
    # The config's gradient transforms ran (adaptive clipping first) and are checkpointed.
    assert logs["adaptive_clip_skipped_steps"] == 0 and "grad_clipped" in logs
    names = [n for n, _ in tf.train.list_variables(runner.checkpoints.latest())]
    assert any(n.startswith("transform_0_adaptive_clipping/") for n in names)
    for sub in ("train", "eval"):
        assert any(f.startswith("events.out.tfevents")
                   for f in os.listdir(os.path.join(trainer.model_dir, sub)))
    # TensorBoard scalars were written under their names.
    tags = set()
    event_file = [f for f in os.listdir(os.path.join(trainer.model_dir, "train"))][0]
    for record in tf.compat.v1.train.summary_iterator(
            os.path.join(trainer.model_dir, "train", event_file)):
        tags.update(v.tag for v in record.summary.value)
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_second"} <= tags


def test_greedy_decode_incremental_equals_recomputation(trained):
    trainer = trained[0]
    source = tf.constant(make_batches(1, batch_size=6, seed=5)[0]["source_ids"])

    class FullRecompute:  # The model without its incremental-decoding interface.
        def __init__(self, model):
            self.model = model

        def __call__(self, inputs, training=False):
            return self.model(inputs, training=training)

        # Adapter: the decoding interface by re-running the teacher-forced model on the whole
        # target-input buffer at every step (positions after `step` are masked: causal).
        def encode(self, source_ids, training=False):
            return {"source_ids": source_ids}

        def init_decoder_state(self, encoded, max_length):
            source = encoded["source_ids"]
            return {"source_ids": source,
                    "buffer": tf.zeros([tf.shape(source)[0], max_length], tf.int32)}

        def decode_step(self, tokens, step, state):
            column = tf.range(tf.shape(state["buffer"])[1])[None, :] == step
            buffer = tf.where(column, tokens[:, None], state["buffer"])
            logits = self({"source_ids": state["source_ids"], "target_input_ids": buffer})
            return logits[:, step], dict(state, buffer=buffer)

    def greedy_decode(model, source, max_length):
        return search(model, source, beam_size=1, max_length_a=0.0, max_length_b=max_length,
                      max_length=max_length)["ids"][:, 0]

    fast = greedy_decode(trainer.model, source, 9).numpy()
    slow = greedy_decode(FullRecompute(trainer.model), source, 9).numpy()
    np.testing.assert_array_equal(fast, slow)
    assert fast.shape[0] == 6 and fast.shape[1] <= 9
    assert metrics.strip_ids([5, 6, 2, 7, 0]) == [5, 6]


def test_restore_model_weights_for_inference(trained):
    trainer = trained[0]
    from deep_nmt_tf.models import build_model

    model = build_model(trainer.config)
    path = CheckpointStore(trainer.model_dir).restore_model(model)
    assert path.endswith("ckpt-30")
    for a, b in zip(model.variables, trainer.model.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_gradient_accumulation_equals_one_big_batch_and_jit_compile_the_same_steps(tmp_path):
    """2 accumulated micro-batches == 1 batch of their union (per-token normalisation); the
    one-batch run with ``training.jit_compile`` (XLA) takes the same steps."""
    batches = make_batches(3, batch_size=8, seed=3)
    # Large Adam epsilon: the update is smooth in the gradient, so float round-off stays tiny.
    common = dict(train_steps=3, adam_epsilon=1.0, schedule=constant(0.5), checkpoint_every=100,
                  weight_decay=1e-3, clip_norm=0.5)
    one = Runner(tiny_config(NO_DROPOUT, **common), str(tmp_path / "one"),
                 trainer=make_trainer_class(batches, split=1))
    logs_one = []
    one.run(hooks=[lambda t, s, logs: logs_one.append(logs)])
    one = one.trainer
    xla = Runner(tiny_config(NO_DROPOUT, jit_compile=True, **common), str(tmp_path / "xla"),
                 trainer=make_trainer_class(batches, split=1))
    losses = {True: [], False: [logs["loss"] for logs in logs_one]}
    xla.run(hooks=[lambda t, s, logs: losses[True].append(logs["loss"])])
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
    two = Runner(tiny_config(NO_DROPOUT, gradient_accumulation_steps=2, **common),
                 str(tmp_path / "two"), trainer=make_trainer_class(batches, split=2))
    logs_two = []
    two.run(hooks=[lambda t, s, logs: logs_two.append(logs)])
    two = two.trainer
    assert int(two.data_position.numpy()) == 6 and int(two.optimizer.iterations.numpy()) == 3
    for a, b in zip(logs_one, logs_two):
        for key in ("loss", "nll", "num_tokens", "num_sentences", "grad_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, err_msg=key)
    for a, b in zip(weights(one), weights(two)):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_static_shapes_step_equals_the_dynamic_one(tmp_path):
    """training.static_shapes: micro-batches of different widths, each its own traced call,
    accumulated into the same updates as the one-function step."""
    rng = np.random.RandomState(3)  # Three batch sizes, each batch read twice in 6 updates:
    batches = [copy_batch(rng, size) for size in (4, 8, 12)]  # 6 micro-batch shapes at most
    common = dict(train_steps=6, adam_epsilon=1.0, schedule=constant(0.5), checkpoint_every=100,
                  gradient_accumulation_steps=2)
    cls = make_trainer_class(batches, split=2)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("tensorflow").addHandler(handler)  # TensorFlow's retracing warnings
    runs = {}
    for static in (False, True):
        runner = Runner(tiny_config(NO_DROPOUT, static_shapes=static, **common),
                        str(tmp_path / str(static)), trainer=cls)
        logs = []
        runner.run(hooks=[lambda t, s, l: logs.append(l)])
        runs[static] = runner.trainer, logs
    logging.getLogger("tensorflow").removeHandler(handler)
    (dynamic, logs_d), (static, logs_s) = runs[False], runs[True]
    assert int(static.data_position.numpy()) == 12 and int(static.optimizer.iterations.numpy()) == 6
    for a, b in zip(logs_d, logs_s):
        for key in ("loss", "num_tokens", "num_sentences", "grad_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, err_msg=key)
    for a, b in zip(weights(dynamic), weights(static)):
        np.testing.assert_allclose(a, b, atol=2e-6)
    # One trace per micro-batch shape (split pieces have their own widths).
    widths = {tuple(p["source_ids"].shape) + tuple(p["target_input_ids"].shape)
              for b in batches for p in split_batch(b, 2)}
    traces = (static._update_fn.experimental_get_tracing_count() +
              static._accumulate_fn.experimental_get_tracing_count())
    assert 1 < traces <= 2 * len(widths)
    warned = [r.getMessage() for r in records]  # The retracing is intended: no warning.
    assert not [m[:160] for m in warned if "triggered tf.function retracing" in m and "_batch" in m]


def test_sentence_normalisation_and_skipped_updates(tmp_path):
    class SkipFirst(optimizers.GradientTransform):
        """Discards the first update (as adaptive clipping would)."""

        def build(self, variables):
            self.seen = tf.Variable(0, dtype=tf.int64)

        def checkpoint_items(self):
            return {"seen": self.seen}

        def __call__(self, grads, variables, stats):
            stats["skip_update"] = tf.equal(self.seen, 0)
            self.seen.assign_add(1)
            return grads

    cls = make_trainer_class()
    runner = Runner(tiny_config(train_steps=1, loss_normalization="sentence"), str(tmp_path),
                    trainer=cls, gradient_transforms=[SkipFirst()])
    trainer = runner.trainer
    start = weights(trainer)
    logs = []
    runner.run(hooks=[lambda t, s, l: logs.append(l)])
    assert logs[0]["skipped"] == 1.0
    assert int(trainer.skipped_updates.numpy()) == 1 and int(trainer.step.numpy()) == 1
    assert int(trainer.optimizer.iterations.numpy()) == 0
    trainable = {id(v) for v in trainer.model.trainable_variables}
    for v, w in zip(trainer.model.variables, start):
        if id(v) in trainable:
            np.testing.assert_array_equal(v.numpy(), w)
    # The transform's variable is checkpointed.
    names = [n for n, _ in tf.train.list_variables(runner.checkpoints.latest())]
    assert any(n.startswith("transform_0_seen") for n in names)
    # The sentence-normalised gradient is the token-normalised one times tokens / sentences.
    batch = cls.train_batches[0]
    tokens = float((batch["target_output_ids"] != 0).sum())
    sentences = float(len(batch["target_output_ids"]))
    ref = Runner(tiny_config(train_steps=1), str(tmp_path / "token"), trainer=cls,
                 gradient_transforms=[SkipFirst()])
    ref_logs = []
    ref.run(hooks=[lambda t, s, l: ref_logs.append(l)])
    np.testing.assert_allclose(logs[0]["grad_norm"],
                               ref_logs[0]["grad_norm"] * tokens / sentences, rtol=1e-5)


KILLED_RUN = textwrap.dedent("""
    import os, signal
    from deep_nmt_tf.training import Runner
    from test_training_helpers import make_batches, make_trainer_class, tiny_config

    def kill_after_step(trainer, step, logs):
        if step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)

    cls = make_trainer_class(make_batches(5, seed=11), split=2)
    Runner({config}, {model_dir!r}, trainer=cls).run(hooks=[kill_after_step])
    raise SystemExit("not killed")
""")


@pytest.mark.slow
def test_killed_run_resumes_exactly(tmp_path):
    """SIGKILL after step 6 (last checkpoint: 4), resume to 8 == uninterrupted 8 steps."""
    config = "tiny_config(train_steps=8, checkpoint_every=4, gradient_accumulation_steps=2)"
    killed_dir = str(tmp_path / "killed")
    proc = run_python(KILLED_RUN.format(kill_at=6, config=config, model_dir=killed_dir))
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert tf.train.latest_checkpoint(killed_dir).endswith("ckpt-4")

    cls = make_trainer_class(make_batches(5, seed=11), split=2)
    runner = Runner(eval(config), killed_dir, trainer=cls)
    resumed = runner.trainer
    assert int(resumed.step.numpy()) == 4 and int(resumed.data_position.numpy()) == 8
    runner.run()
    runner = Runner(eval(config), str(tmp_path / "straight"), trainer=cls)
    straight = runner.trainer
    runner.run()
    assert int(resumed.step.numpy()) == int(straight.step.numpy()) == 8
    assert int(resumed.optimizer.iterations.numpy()) == 8
    for a, b in zip(weights(resumed), weights(straight)):  # includes the dropout seed states
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    for a, b in zip(optimizer_state(resumed), optimizer_state(straight)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_changed_model_config_is_refused(tmp_path):
    cls = make_trainer_class()
    # (from_generator datasets cannot be checkpointed: the trainer falls back to re-reading.)
    Runner(tiny_config(train_steps=1), str(tmp_path), trainer=cls,
           checkpoint_iterator=True).run()
    with pytest.raises(ConfigError,
                       match=r"model\.d_model: 16 -> 32.*transformer\.ffn_dim: 32 -> 64"):
        Runner(tiny_config(merge({"d_model": 32}, stacks({"ffn_dim": 64})), train_steps=2),
               str(tmp_path), trainer=cls)
    # Training keys may change: continue to step 2.
    runner = Runner(tiny_config(train_steps=2, schedule=constant(1e-3)), str(tmp_path), trainer=cls,
                    checkpoint_iterator=True)
    trainer = runner.trainer
    assert int(trainer.step.numpy()) == 1
    runner.run()
    assert int(trainer.step.numpy()) == 2
    from deep_nmt_tf.config import load_config

    saved = load_config(os.path.join(str(tmp_path), "config.yaml"))
    assert saved.training.train_steps == 2
    assert saved.training.schedule.get().learning_rate == 1e-3


def test_adaptive_clipping_turned_on_at_a_resume_starts_fresh(tmp_path, caplog):
    """The rescue after a loss spike: resume a run trained without adaptive clipping with it on.
    The checkpoint has no clipper state: the model, optimizer and counters are restored, the
    clipper starts empty (logged), and the next checkpoint holds it, which the resume after
    restores (strictly: a changed model still fails)."""
    cls = make_trainer_class()
    model_dir = str(tmp_path)
    Runner(tiny_config(train_steps=2), model_dir, trainer=cls).run()
    on = {"enabled": True, "warmup_steps": 1}
    with caplog.at_level(logging.INFO):
        runner = Runner(tiny_config(train_steps=3, adaptive_clipping=on), model_dir, trainer=cls)
    assert int(runner.trainer.step.numpy()) == 2
    assert int(runner.trainer.optimizer.iterations.numpy()) == 2
    assert "no state for transform_0_adaptive_clipping" in caplog.text
    runner.run()
    latest = runner.checkpoints.latest()
    assert latest.endswith("ckpt-3")
    assert any(n.startswith("transform_0_adaptive_clipping/")
               for n, _ in tf.train.list_variables(latest))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = Runner(tiny_config(train_steps=4, adaptive_clipping=on), model_dir, trainer=cls)
    assert "no state for" not in caplog.text
    clipper = again.trainer.gradient_transforms[0].clipper
    assert int(again.trainer.step.numpy()) == 3
    assert any(float(v.numpy()) != 0.0 for v in clipper.variables)  # restored, not empty


@pytest.mark.slow
def test_grad_norm_ratio_and_mixing_weights_are_logged(tmp_path):
    deep = merge(NO_DROPOUT, {"transparent_attention": {"enabled": True}},
                 stacks({"lexical_shortcuts": {"enabled": True}}, encoder={"num_layers": 2},
                        decoder={"dlcl": {"enabled": True}}))
    cls = make_trainer_class()
    runner = Runner(tiny_config(deep, train_steps=1, grad_norm_ratio_every=1, eval_every=1),
                    str(tmp_path / "diag"), trainer=cls)
    trainer = runner.trainer
    # Reference: Bapna et al.'s ratio at the initial weights on the first batch.
    batch = {k: tf.constant(v) for k, v in cls.train_batches[0].items()}
    seed_states = [(v, v.numpy()) for v in trainer.model.non_trainable_variables]
    with tf.GradientTape() as tape:
        encoded = trainer.model.encode(batch["source_ids"], training=True)
        h1, hn = encoded["layer_outputs"][1], encoded["layer_outputs"][-1]
        logits = trainer.model.decode(encoded, batch["target_input_ids"], training=True)
        loss = losses_lib.cross_entropy_sums(logits, batch["target_output_ids"], 0.1).loss
    g1, gn = tape.gradient(loss, [h1, hn])
    expected = float(tf.norm(g1) / tf.norm(gn))
    for v, value in seed_states:  # Leave the dropout RNG as the trainer found it.
        v.assign(value)
    logs = []
    runner.run(hooks=[lambda t, s, l: logs.append(l)])
    np.testing.assert_allclose(logs[0]["grad_norm_ratio"], expected, rtol=1e-5)

    # The diagnostic does not change the update.
    plain = Runner(tiny_config(deep, train_steps=1), str(tmp_path / "plain"), trainer=cls)
    plain.run()
    plain = plain.trainer
    for a, b in zip(weights(trainer), weights(plain)):
        np.testing.assert_array_equal(a, b)

    tags = {}
    for sub in ("train", "eval"):
        tags[sub] = set()
        for f in os.listdir(os.path.join(trainer.model_dir, sub)):
            for record in tf.compat.v1.train.summary_iterator(
                    os.path.join(trainer.model_dir, sub, f)):
                tags[sub].update(v.tag for v in record.summary.value)
    assert {"grad_norm_ratio", "transparent_attention/decoder_layer_0/source_2",
            "decoder_dlcl/row_1/input_0", "weights/transparent_attention",
            "weights/decoder_dlcl"} <= tags["train"]
    assert "gates/encoder/layer_1/self/key" in tags["eval"]
