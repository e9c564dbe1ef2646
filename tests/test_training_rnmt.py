"""RNMT+ on the TensorFlow side: paper-size configs build with the published parameter counts,
the recipe is wired through the config (Eq. 1 schedule, adaptive clipping, sentence-level loss),
and the model trains on the demo corpus under MirroredStrategy, then decodes and exports."""

import gc
import os
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.config import ConfigError, load_config
from deep_nmt_tf.models import build_model
from deep_nmt_tf.task import schedules
from deep_nmt_tf.training import Runner, optimizers
from config_trees import config, constant
from deep_nmt_tf.training.adaptive_clipping import AdaptiveClippingTransform
from deep_nmt_tf.task.rnmt_schedule import RNMTPlusSchedule
from test_training_helpers import (NO_DROPOUT, ROOT, make_batches, make_trainer_class, run_python,
                                   tiny_config, weights)

CONFIGS = os.path.join(ROOT, "configs")


# --------------------------------------------------------------------------------------------
# Paper sizes (build only)
# --------------------------------------------------------------------------------------------

# Bapna et al. 2018, Table 3 (32k vocabulary): RNMT+ (512) with 6/12/16/20 encoder layers and
# RNMT+ (1024) (= Chen et al.'s model), in millions of parameters.
PAPER_SIZES = [("rnmt_plus.yaml", 379), ("rnmt_plus_512.yaml", 128),
               ("rnmt_plus_512_enc12.yaml", 165), ("rnmt_plus_512_enc16.yaml", 191),
               ("rnmt_plus_512_enc20.yaml", 216)]


def _params(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def _built_without_values(cfg):
    """The model of ``cfg`` built, its variables created with their shapes but not drawn
    (Keras defers a variable's initialisation in a stateless scope): drawing a paper-size
    model's 100-400 million random values takes seconds, and only the shapes are counted.
    ``keras.backend.clear_session`` forgets the variables left to initialise."""
    with keras.StatelessScope(initialize_variables=False):
        return build_model(cfg)


@pytest.mark.parametrize("name,millions", PAPER_SIZES)
def test_paper_configs_build_with_published_parameter_counts(name, millions):
    cfg = load_config(os.path.join(CONFIGS, name), overrides=["model.vocab_size=32000"])
    model = _built_without_values(cfg)
    count = _params(model)
    assert round(count / 1e6) == millions, count
    if name == "rnmt_plus_512.yaml":
        # Transparent attention adds one (N x 1) mix: the 512-wide embeddings cannot be mixed
        # with the 1024-wide bidirectional outputs, so the sources are the N layer outputs.
        cfg_t = load_config(os.path.join(CONFIGS, "rnmt_plus_512_transparent.yaml"),
                            overrides=["model.vocab_size=32000"])
        model_t = _built_without_values(cfg_t)
        assert _params(model_t) == count + cfg.model.encoder.get().num_layers
        del model_t
    del model
    keras.backend.clear_session()
    gc.collect()


# --------------------------------------------------------------------------------------------
# Recipe keys
# --------------------------------------------------------------------------------------------


#: A tiny RNMT+ (2 + 3 layers, no dropout), in the current layout.
RNMT_MODEL = {"vocab_size": 24, "d_model": 16, "tie_source_target_embeddings": False,
              "encoder": {"type": "rnmt_plus", "rnmt_plus": {
                  "num_layers": 2, "units": 8, "embedding_dropout": 0.0, "dropout": 0.0}},
              "decoder": {"type": "rnmt_plus", "rnmt_plus": {
                  "num_layers": 3, "units": 16, "embedding_dropout": 0.0, "dropout": 0.0,
                  "attention_dropout": 0.0, "attention_heads": 2}}}


def _rnmt_config(**training):
    train = dict(train_steps=6, schedule=constant(3e-3), log_every=1, checkpoint_every=100,
                 eval_every=0, label_smoothing=0.1, seed=7)
    train.update(training)
    return config(RNMT_MODEL, train, decoding={"max_length_a": 1.0, "max_length_b": 3})


def _rnmt_plus(**options):
    return {"type": "rnmt_plus", "rnmt_plus": options}


def eq1_with_floor(t, n, p, s, e, base=1e-4, floor=5e-5):
    """NOTES.md's Eq. 1, then held at the floor."""
    lr = base * min(1 + t * (n - 1) / (n * p), n, n * (2 * n) ** ((s - n * t) / (e - s)))
    return max(lr, floor)


def test_rnmt_plus_schedule_from_config_matches_eq1():
    cfg = _rnmt_config(schedule=_rnmt_plus(learning_rate=1e-4, warmup_steps=500,
                                           decay_start=600000, decay_end=1200000,
                                           min_learning_rate=5e-5))
    n = 16
    sched = schedules.build_schedule(cfg, num_replicas=n)
    assert isinstance(sched, RNMTPlusSchedule) and sched.num_replicas == n
    for t in (0, 250, 4000, n * 500, 20000, 600000 // n, 50000, 1200000 // n, 10 ** 6):
        assert float(sched(t)) == pytest.approx(eq1_with_floor(t, n, 500, 600000, 1200000),
                                                rel=1e-5), t
    assert float(sched(20000)) == pytest.approx(n * 1e-4)                 # plateau
    assert float(sched(10 ** 6)) == pytest.approx(5e-5)                   # floor
    # Every key takes effect: the floor and the base rate.
    cfg2 = _rnmt_config(schedule=_rnmt_plus(learning_rate=2e-4, warmup_steps=10,
                                            decay_start=100, decay_end=300,
                                            min_learning_rate=1e-5))
    sched2 = schedules.build_schedule(cfg2, num_replicas=1)
    assert float(sched2(0)) == pytest.approx(2e-4)
    assert float(sched2(10 ** 5)) == pytest.approx(1e-5)
    with pytest.raises(ConfigError, match="training.schedule.rnmt_plus.decay_end"):
        _rnmt_config(schedule=_rnmt_plus(decay_start=100, decay_end=100))


def test_adaptive_clipping_transform_from_config():
    assert not any(isinstance(t, AdaptiveClippingTransform)
                   for t in optimizers.build_gradient_transforms(_rnmt_config()))
    cfg = _rnmt_config(adaptive_clipping={"enabled": True, "decay": 0.99, "num_stddevs": 3.0,
                                          "warmup_steps": 5, "norm_floor": 0.1,
                                          "min_stddev": 0.01}, clip_norm=1.0)
    transforms = optimizers.build_gradient_transforms(cfg)
    clippers = [t for t in transforms if isinstance(t, AdaptiveClippingTransform)]
    assert len(clippers) == 1
    # It must see the norm before global-norm clipping: it runs first.
    assert transforms[0] is clippers[0]
    clippers[0].build([])
    c = clippers[0].clipper
    assert (c.decay, c.num_stddevs, c.warmup_steps, c.norm_floor, c.min_stddev) == (
        0.99, 3.0, 5, 0.1, 0.01)
    default = [t for t in optimizers.build_gradient_transforms(
        _rnmt_config(adaptive_clipping={"enabled": True})) if
        isinstance(t, AdaptiveClippingTransform)][0]
    default.build([])
    assert default.clipper.warmup_steps == 277  # Lingvo's implicit warm-up at decay 0.995
    with pytest.raises(ConfigError, match="adaptive_clipping.decay"):
        _rnmt_config(adaptive_clipping={"enabled": True, "decay": 1.0})


@pytest.mark.slow
def test_adaptive_clipping_skips_an_injected_outlier_in_the_trainer(tmp_path):
    """With adaptive clipping on, a 1000x loss (gradient) spike is skipped and leaves the
    weights alone; the ordinary steps are applied; the skip is counted and logged."""
    # The tiny Transformer: the clipping is the model's gradient's (tracing the RNMT+ step,
    # its LSTM loops and their gradients, takes 4-6 times as long).
    cfg = tiny_config(NO_DROPOUT, train_steps=10, log_every=1, checkpoint_every=100,
                      adaptive_clipping={"enabled": True, "warmup_steps": 6})
    base = make_trainer_class(make_batches(4, batch_size=6, seed=3))
    spike_at = 8  # 1-based step

    class SpikeTrainer(base):
        def compute_loss(self, batch, training):
            sums = super().compute_loss(batch, training)
            scale = tf.where(tf.equal(self.step, spike_at - 1), 1000.0, 1.0)
            return sums._replace(loss=sums.loss * scale)

    runner = Runner(cfg, str(tmp_path / "run"), trainer=SpikeTrainer)
    trainer = runner.trainer
    logs, before = [], {}

    def hook(t, step, step_logs):
        logs.append(step_logs)
        if step == spike_at - 1:
            before["weights"] = weights(t)

    runner.run(hooks=[hook])
    skipped = [i + 1 for i, l in enumerate(logs) if l["skipped"]]
    assert skipped == [spike_at], [(l["grad_norm"], l["skipped"]) for l in logs]
    assert int(trainer.skipped_updates.numpy()) == 1
    assert logs[spike_at - 1]["adaptive_clip_skipped_steps"] == 1.0
    assert logs[spike_at - 1]["grad_norm"] > 100 * logs[spike_at - 2]["grad_norm"]
    # The skipped update changed nothing; the updates after it trained on.
    assert int(trainer.optimizer.iterations.numpy()) == cfg.training.train_steps - 1


# --------------------------------------------------------------------------------------------
# Demo corpus, two replicas, then decoding and export
# --------------------------------------------------------------------------------------------

TRAIN_SCRIPT = textwrap.dedent("""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import numpy as np
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.training import Runner, make_strategy
    from deep_nmt_tf.training.adaptive_clipping import AdaptiveClippingTransform
    from deep_nmt_tf.task.rnmt_schedule import RNMTPlusSchedule

    strategy = make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    overrides = [
        "model.d_model=48", "model.encoder.rnmt_plus.units=32",
        "model.decoder.rnmt_plus.units=48", "model.decoder.rnmt_plus.attention_dim=48",
        "model.encoder.rnmt_plus.num_layers=2", "model.decoder.rnmt_plus.num_layers=3",
        "data.synthetic_train_size=1500", "data.synthetic_dev_size=16",
        "data.synthetic_test_size=8", "data.vocab_size=150", "data.max_dev_sentences=8",
        "data.shuffle_buffer=256", "training.train_steps={steps}", "training.batch_tokens=1200",
        "training.schedule.rnmt_plus.learning_rate=5e-3",
        "training.schedule.rnmt_plus.warmup_steps=5",
        "training.schedule.rnmt_plus.decay_start=60",
        "training.schedule.rnmt_plus.decay_end=200",
        "training.schedule.rnmt_plus.min_learning_rate=1e-3",
        "training.log_every=10", "training.checkpoint_every=1000", "training.eval_every=0",
        "decoding.beam_size=3", "decoding.batch_size=8", "decoding.max_length_b=5",
        "decoding.max_length_a=1.0"]
    config = load_config("configs/rnmt_plus_demo.yaml", overrides)
    runner = Runner(config, "{model_dir}", strategy=strategy)
    trainer = runner.trainer
    assert isinstance(trainer.schedule, RNMTPlusSchedule) and trainer.schedule.num_replicas == 2
    assert any(isinstance(t, AdaptiveClippingTransform) for t in trainer.gradient_transforms)
    logs = []
    runner.run(hooks=[lambda t, s, l: logs.append(l)])
    losses = [l["loss"] for l in logs]
    assert np.isfinite(losses).all(), losses
    first, last = losses[0], np.mean(losses[-5:])
    print("LOSS", first, last, "skipped", int(trainer.skipped_updates.numpy()))
    assert last < first - 0.5, losses  # from ~log(vocabulary) at the start
    assert "adaptive_clip_log_grad_norm_mean" in logs[-1]
    print("trained: ok")

    # Beam search and the SavedModel export, unchanged, on the trained RNMT+ model.
    from deep_nmt_tf.export import export_model_dir, load_saved_model
    from deep_nmt_tf.inference import Translator
    # Without XLA (the compiled search has its own tests, test_export_saved_model.py).
    translator = Translator.from_model_dir("{model_dir}", jit_compile=False)
    test_source = translator.config.data.test_source  # resolved (synthetic corpus files)
    sentences = [l.rstrip("\\n") for l in open(test_source, encoding="utf-8")][:4]
    nbest = translator.translate(sentences)
    assert len(nbest) == 4 and all(len(h) >= 1 for h in nbest)
    want = [t.decode("utf-8") for t in translator.translate_batch(sentences)["translations"]]
    path = export_model_dir("{model_dir}", "{export_dir}", jit_compile=False)
    loaded = load_saved_model(path)
    out = loaded.signatures["serving_default"](text=tf.constant(sentences))
    got = [t.decode("utf-8") for t in out["translations"].numpy()]
    print("TRANSLATIONS", want, got)
    assert got == want, (got, want)
    print("exported: ok")
""")


@pytest.mark.slow
def test_rnmt_trains_on_demo_corpus_under_mirrored_strategy_and_exports(tmp_path):
    script = TRAIN_SCRIPT.format(steps=12, model_dir=str(tmp_path / "run"),
                                 export_dir=str(tmp_path / "export"))
    proc = run_python(script, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "trained: ok" in proc.stdout, proc.stdout[-3000:]
    assert "exported: ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_gate_gradient_has_no_per_gate_slice_gradients():
    """The four gates are unstacked, not sliced: on TensorFlow each slice's gradient was a
    full-size StridedSliceGrad (1,201 per RNMT+ training step, BENCHMARKS.md)."""
    from deep_nmt_tf.layers.lstm import LayerNormLSTMCell

    cell = LayerNormLSTMCell(8)
    cell.build((3, 5))
    z = tf.random.normal((3, 32))
    c = tf.random.normal((3, 8))

    @tf.function
    def grad(z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            h, c1 = cell._gates_to_state(z, c)
            loss = tf.reduce_sum(h) + tf.reduce_sum(c1)
        return tape.gradient(loss, z)

    assert grad(z).shape == (3, 32)
    graph = grad.get_concrete_function(z).graph.as_graph_def()
    ops_used = {n.op for n in graph.node} | {n.op for f in graph.library.function
                                              for n in f.node_def}
    assert "StridedSliceGrad" not in ops_used
