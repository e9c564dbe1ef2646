"""Hybrids on the TensorFlow side (Chen et al. 2018 section 6): each hybrid trains with falling
loss; warm start loads exactly the named variables from an earlier run's checkpoint; a frozen
encoder stays bit-identical while the rest trains; mismatches and bad paths fail naming the
key.  Tiny models (d_model 16, 1-2 layers), few steps."""

import os

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.config import ConfigError
from config_trees import architecture, constant, merge
from test_training_helpers import ROOT, make_batches, make_trainer_class, tiny_config

# (tf.data's note that run_functions_eagerly leaves its functions compiled: see source_run.)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Even though the `tf.config.experimental_run_functions")


def _model(name, encoder_layers=2, encoder_units=8):
    """A tiny model of architecture ``name`` without dropout (RNMT+ decoder: 16 units, 2
    attention heads of 8 dimensions; a cascade's Transformer stage: 1 layer)."""
    transformer = {"num_heads": 2, "ffn_dim": 32, "input_dropout": 0.0, "residual_dropout": 0.0}
    rnmt = {"embedding_dropout": 0.0, "dropout": 0.0}
    encoder = {"transformer": dict(transformer, num_layers=encoder_layers),
               "rnmt_plus": dict(rnmt, num_layers=encoder_layers, units=encoder_units)}
    decoder = {"transformer": dict(transformer, num_layers=1,
                                   tie_softmax=name == "rnmt_transformer"),
               "rnmt_plus": dict(rnmt, num_layers=1, units=16, attention_dropout=0.0,
                                 attention_heads=2, attention_dim=16)}
    return merge({"tie_source_target_embeddings": False}, architecture(name, encoder, decoder))


def _losses(runner):
    logs = []
    runner.run(hooks=[lambda t, s, l: logs.append(l["loss"])])
    return logs


def _runner(cfg, model_dir, cls=None):
    from deep_nmt_tf.training import Runner

    return Runner(cfg, model_dir, trainer=cls or make_trainer_class())


# The cascade trains (warm-started and partly frozen) in the warm-start test below; the
# multi-column hybrid on the demo corpus in the export test at the end.
@pytest.mark.parametrize("architecture", ["transformer_rnmt", "rnmt_transformer"])
def test_hybrid_trains_with_falling_loss(tmp_path, architecture):
    cfg = tiny_config(_model(architecture, encoder_layers=1), train_steps=12,
                      schedule=constant(1e-2), checkpoint_every=100)
    cls = make_trainer_class(make_batches(2, batch_size=8, seed=1))
    losses = _losses(_runner(cfg, str(tmp_path), cls))
    assert np.isfinite(losses).all(), losses
    assert np.mean(losses[-3:]) < losses[0] - 0.3, losses


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """An RNMT+ run (2 encoder layers) whose final checkpoint the cascade starts from."""
    model_dir = str(tmp_path_factory.mktemp("rnmt"))
    cfg = tiny_config(_model("rnmt_plus"), train_steps=2, checkpoint_every=100)
    runner = _runner(cfg, model_dir)
    # Eagerly: only its checkpoint is used, and two updates take less time than tracing one.
    tf.config.run_functions_eagerly(True)
    try:
        runner.run()
    finally:
        tf.config.run_functions_eagerly(False)
    return model_dir, runner.trainer


@pytest.mark.slow
def test_warm_start_loads_exactly_the_named_variables_and_freezing_holds(tmp_path,
                                                                           source_run):
    source_dir, source = source_run
    ckpt = tf.train.latest_checkpoint(source_dir)
    reader = tf.train.load_checkpoint(ckpt)
    # Source values by path relative to the source encoder (checkpoint layout: by position).
    index = {id(v): i for i, v in enumerate(source.model.variables)}
    prefix = source.model.encoder.path + "/"
    want = {v.path[len(prefix):]: reader.get_tensor(
        f"model/variables/{index[id(v)]}/.ATTRIBUTES/VARIABLE_VALUE")
        for v in source.model.encoder.weights}

    cfg = tiny_config(_model("cascaded"), train_steps=12, schedule=constant(1e-2),
                      checkpoint_every=100,
                      warm_start={"checkpoint": source_dir, "source": "encoder",
                                  "target": "encoder/stages/0"},
                      freeze=["encoder/stages/0"])
    runner = _runner(cfg, str(tmp_path / "cascaded"))
    trainer = runner.trainer
    rnmt = trainer.model.encoder.stages[0]
    rprefix = rnmt.path + "/"
    got = {v.path[len(rprefix):]: v.numpy() for v in rnmt.weights}
    assert sorted(got) == sorted(want) and len(got) == len(rnmt.weights) > 0
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Nothing else came from the checkpoint: the rest keeps its fresh initialisation, which
    # matches no checkpointed tensor of the same shape.
    rnmt_ids = {id(v) for v in rnmt.weights}
    values = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
              if k.startswith("model/variables/")]
    for v in trainer.model.weights:
        if id(v) in rnmt_ids or np.all(v.numpy() == v.numpy().flat[0]):
            continue  # constant initialisations (biases, LayerNorm) are not evidence
        assert not any(x.shape == tuple(v.shape) and np.array_equal(x, v.numpy())
                       for x in values), v.path

    # Frozen: excluded from the optimizer; bit-identical after training, the rest changes.
    trainable = {id(v) for v in trainer.trainable_variables}
    assert not rnmt_ids & trainable
    assert len(trainable) == len(trainer.model.trainable_variables) - len(
        rnmt.trainable_weights)
    before = {v.path: v.numpy().copy() for v in trainer.model.weights}
    losses = _losses(runner)
    assert np.mean(losses[-3:]) < losses[0] - 0.15, losses  # the cascade trains
    for v in trainer.model.weights:
        if id(v) in rnmt_ids:
            np.testing.assert_array_equal(v.numpy(), before[v.path], err_msg=v.path)
    changed = [v.path for v in trainer.trainable_variables
               if not np.array_equal(v.numpy(), before[v.path])]
    assert len(changed) == len(trainer.trainable_variables), (
        set(v.path for v in trainer.trainable_variables) - set(changed))


def test_warm_start_mismatch_lists_the_variables(tmp_path, source_run):
    source_dir, _ = source_run
    bad = _model("cascaded", encoder_layers=3, encoder_units=4)
    cfg = tiny_config(bad, warm_start={"checkpoint": source_dir, "source": "encoder",
                                       "target": "encoder/stages/0"})
    with pytest.raises(ConfigError) as e:
        _runner(cfg, str(tmp_path / "bad"))
    msg = str(e.value)
    assert "training.warm_start" in msg
    assert "layer_2/forward/cell/kernel: only in this model's encoder/stages/0" in msg
    assert "layer_0/forward/cell/kernel: checkpoint shape" in msg


@pytest.mark.parametrize("training,key", [
    (dict(freeze=["encoder/nothing"]), "training.freeze[0]"),
    (dict(warm_start={"checkpoint": "/nonexistent/run"}), "training.warm_start.checkpoint"),
])
def test_bad_warm_start_or_freeze_paths_name_the_key(tmp_path, training, key):
    cfg = tiny_config(_model("cascaded"), **training)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[")):
        _runner(cfg, str(tmp_path / "run"))


@pytest.mark.slow
def test_multi_column_trains_on_demo_corpus_decodes_and_exports(tmp_path):
    """The YAML path end to end: the RNMT+ demo config switched to the multi-column hybrid
    trains on the synthetic demo corpus (loss falling), beam-searches, and the exported
    SavedModel translates as the in-process translator does."""
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.export import export_model_dir, load_saved_model
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.training import Runner

    overrides = [
        "model.encoder.type=multi_column",
        "model.encoder.multi_column.columns=[{type: rnmt_plus, rnmt_plus: {num_layers: 1, "
        "units: 16, embedding_dropout: 0, dropout: 0}}, {type: transformer, transformer: "
        "{num_layers: 1, num_heads: 2, ffn_dim: 64, input_dropout: 0, residual_dropout: 0}}]",
        "model.d_model=32", "model.decoder.rnmt_plus.units=32",
        "model.decoder.rnmt_plus.attention_dim=32", "model.decoder.rnmt_plus.num_layers=1",
        "model.decoder.rnmt_plus.embedding_dropout=0", "model.decoder.rnmt_plus.dropout=0",
        "model.decoder.rnmt_plus.attention_dropout=0",
        "data.synthetic_train_size=300", "data.synthetic_dev_size=8",
        "data.synthetic_test_size=8", "data.vocab_size=100", "data.max_dev_sentences=4",
        "data.shuffle_buffer=64", "training.train_steps=12", "training.batch_tokens=400",
        "training.schedule.type=constant", "training.schedule.constant.learning_rate=1e-2",
        "training.eval_every=0",
        "training.adaptive_clipping.enabled=false", "training.log_every=4",
        "decoding.beam_size=2", "decoding.batch_size=4", "decoding.max_length_b=3",
        "decoding.max_length_a=1.0"]
    config = load_config(os.path.join(ROOT, "configs", "rnmt_plus_demo.yaml"), overrides)
    model_dir = str(tmp_path / "run")
    losses = _losses(Runner(config, model_dir))
    assert np.mean(losses[-3:]) < losses[0] - 0.3, losses
    # Without XLA: the compiled search has its own tests (test_export_saved_model.py); an XLA
    # compile of this beam search takes longer than the training.
    translator = Translator.from_model_dir(model_dir, jit_compile=False)
    assert type(translator.model.encoder).__name__ == "MultiColumnEncoder"
    with open(translator.config.data.test_source, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f][:3]
    want = [t.decode("utf-8") for t in translator.translate_batch(sentences)["translations"]]
    loaded = load_saved_model(export_model_dir(model_dir, str(tmp_path / "export"),
                                               jit_compile=False))
    out = loaded.signatures["serving_default"](text=tf.constant(sentences))
    assert [t.decode("utf-8") for t in out["translations"].numpy()] == want
