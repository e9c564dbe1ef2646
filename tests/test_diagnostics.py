"""Training diagnostics (issue 4 item 5): grad-norm ratio, weight images, gates, layer probe.

The last test is the issue's experiment: on the demo data, the grad-norm ratio of a 20-layer
post-norm encoder is far below that of the same encoder with transparent attention or DLCL
(Bapna et al. 2018 Fig. 1 and 3; Wang et al. 2019 section 3).
"""

import io
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.analysis import events, probe
from config_trees import merge, stacks
from deep_nmt_tf.training import Runner, diagnostics
from test_training_helpers import (NO_DROPOUT, make_batches, make_trainer_class,
                                   run_python, tiny_config)


def _batch(batch):
    return {k: tf.constant(v) for k, v in batch.items()}


# --------------------------------------------------------------------------------------------
# Grad-norm ratio in the training step
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("static_shapes", [False, True])
def test_grad_norm_ratio_only_every_k_steps_and_equal_to_a_direct_tape(tmp_path, static_shapes):
    model = merge(NO_DROPOUT, stacks(encoder={"num_layers": 3}))
    batches = make_batches(3, batch_size=8, seed=3)
    cls = make_trainer_class(batches)
    runner = Runner(tiny_config(model, train_steps=7, grad_norm_ratio_every=3, log_every=7,
                                checkpoint_every=7, static_shapes=static_shapes),
                    str(tmp_path / "k3"), trainer=cls)
    trainer = runner.trainer
    expected, logs = {}, {}

    def reference(step):
        # Weights before update `step`, on the batch that update reads (same tape quantities).
        batch = _batch(batches[(step - 1) % len(batches)])
        expected[step] = diagnostics.grad_norm_ratio(trainer.model, batch, 0.1)

    def hook(t, step, step_logs):
        logs[step] = step_logs
        if (step + 1) % 3 == 0:
            reference(step + 1)

    runner.run(hooks=[hook])
    with_ratio = sorted(s for s, l in logs.items() if "grad_norm_ratio" in l)
    assert with_ratio == [3, 6], with_ratio
    for step in with_ratio:
        for key in diagnostics.RATIO_KEYS:
            np.testing.assert_allclose(logs[step][key], expected[step][key], rtol=1e-4,
                                       err_msg=f"{key} at step {step}")
        assert logs[step]["grad_norm_ratio"] > 0
    if static_shapes:
        # Every update takes the diagnostic step (reported on the ratio's updates only):
        # one trace per batch shape, not two.
        shapes = {tuple(b[k].shape for k in sorted(b)) for b in batches}
        assert trainer._update_fn.experimental_get_tracing_count() == len(shapes)
    else:
        # Two traced step functions (with and without the diagnostic), each traced once.
        assert trainer._train_step_fn.experimental_get_tracing_count() == 2

    # (That a diagnostic step applies the same update as a plain one is checked in
    # test_training_trainer.py.)

    # TensorBoard has the ratio and both norms at steps 3 and 6.
    run = events.read_run(trainer.model_dir, ("train",))
    for key in diagnostics.RATIO_KEYS:
        steps, values = run.scalar(key, ("train",))
        assert list(steps) == [3, 6]
        np.testing.assert_allclose(values, [logs[3][key], logs[6][key]], rtol=1e-6)


MIRRORED = textwrap.dedent("""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import numpy as np
    from deep_nmt_tf.training import Runner, diagnostics, make_strategy

    # Eagerly: the step's code under the strategy without tracing it (30 s on 2 busy cores;
    # the compiled step under the strategy, accumulating, is test_training_distributed.py's).
    tf.config.run_functions_eagerly(True)
    from config_trees import merge, stacks
    from test_training_helpers import NO_DROPOUT, make_batches, make_trainer_class, tiny_config

    batches = make_batches(1, batch_size=8, seed=4)
    model = merge(NO_DROPOUT, stacks(encoder={{"num_layers": 2}}),
                  {{"transparent_attention": {{"enabled": True, "weight_dropout": 0.0}}}})
    mirrored = make_strategy("mirrored")
    assert mirrored.num_replicas_in_sync == 2
    # 2 replicas x 2 accumulated micro-batches: each replica sees 2 quarters of the batch.
    cls = make_trainer_class(batches, split=4)
    runner = Runner(tiny_config(model, train_steps=1, grad_norm_ratio_every=1,
                                gradient_accumulation_steps=2), "{tmp}/mirrored",
                    strategy=mirrored, trainer=cls)
    trainer = runner.trainer
    batch = {{k: tf.constant(v) for k, v in batches[0].items()}}
    expected = diagnostics.grad_norm_ratio(trainer.model, batch, 0.1)  # one device, one batch
    logs = []
    runner.run(hooks=[lambda t, s, l: logs.append(l)])
    print("expected", expected, "got", {{k: logs[0][k] for k in expected}})
    for key, value in expected.items():
        np.testing.assert_allclose(logs[0][key], value, rtol=2e-5, err_msg=key)
    print("ratio under mirrored: ok")
""")


@pytest.mark.slow
def test_grad_norm_ratio_under_mirrored_strategy_and_accumulation(tmp_path):
    """Per replica (and per micro-batch) squared norms, summed across replicas: the ratio of
    the global batch, as on one device (the step run eagerly under the strategy)."""
    proc = run_python(MIRRORED.format(tmp=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    assert "ratio under mirrored: ok" in proc.stdout


# --------------------------------------------------------------------------------------------
# Weight images, gates
# --------------------------------------------------------------------------------------------


def _deep_model(dlcl=True):
    from deep_nmt_tf.models import build_model

    model = merge(NO_DROPOUT, {"transparent_attention": {"enabled": True}},
                  stacks({"dlcl": {"enabled": dlcl}, "lexical_shortcuts": {"enabled": True}},
                         encoder={"num_layers": 3}, decoder={"num_layers": 2}))
    return build_model(tiny_config(model))


def test_heatmap_rgb():
    matrix = np.array([[0.0, 1.0], [0.5, 2.0]])
    mask = np.array([[True, False], [True, True]])
    image = diagnostics.heatmap_rgb(matrix, mask, cell_size=3)
    assert image.shape == (6, 6, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image[0, 0], [68, 1, 84])  # min: viridis start
    np.testing.assert_array_equal(image[3, 3], [253, 231, 37])  # max: viridis end
    np.testing.assert_array_equal(image[0, 5], [255, 255, 255])  # masked
    assert (image[:3, :3] == image[0, 0]).all()  # one colour per cell
    flat = diagnostics.heatmap_rgb(np.ones([4, 2]))
    assert flat.shape[0] == 4 * 32 and len(np.unique(flat.reshape(-1, 3), axis=0)) == 1
    with pytest.raises(ValueError):
        diagnostics.heatmap_rgb(np.ones([2, 2, 2]))


def test_weight_images_are_written_and_read_back(tmp_path):
    import PIL.Image

    model = _deep_model()
    writer = tf.summary.create_file_writer(str(tmp_path / "train"))
    tags = diagnostics.write_weight_images(writer, 7, model)
    assert tags == ["weights/decoder_dlcl", "weights/encoder_dlcl",
                    "weights/transparent_attention"]
    run = events.read_run(str(tmp_path))
    matrices = diagnostics.weight_matrices(model)
    for tag in tags:
        step, png, description = run.images[("train", tag)]
        image = np.asarray(PIL.Image.open(io.BytesIO(png)))
        name = tag.split("/")[1]
        rows, cols = matrices[name].shape
        cell = image.shape[0] // rows
        assert step == 7 and image.shape == (rows * cell, cols * cell, 3), image.shape
        np.testing.assert_array_equal(image, diagnostics.heatmap_rgb(
            matrices[name], diagnostics.weight_mask(name, matrices[name])))
        assert name in description and "viridis from" in description
    assert matrices["transparent_attention"].shape == (4, 2)
    assert matrices["encoder_dlcl"].shape == (4, 4)
    # DLCL images show the lower triangle only.
    assert diagnostics.weight_mask("encoder_dlcl", matrices["encoder_dlcl"]).sum() == 10
    # A model without mixing weights writes nothing.
    from deep_nmt_tf.models import build_model

    assert diagnostics.write_weight_images(writer, 1, build_model(tiny_config())) == []


@pytest.mark.filterwarnings("ignore:Even though the `tf.config.experimental_run_functions")
def test_trainer_writes_weight_images_and_gate_scalars(tmp_path):
    deep = merge(NO_DROPOUT, {"transparent_attention": {"enabled": True}},
                 stacks({"num_layers": 2, "lexical_shortcuts": {"enabled": True}},
                        encoder={"dlcl": {"enabled": True}}))
    cls = make_trainer_class()
    runner = Runner(tiny_config(deep, train_steps=4, log_every=2, diagnostics_every=2),
                    str(tmp_path / "run"), trainer=cls)
    trainer = runner.trainer
    tf.config.run_functions_eagerly(True)  # what is written, not the compiled step, is the subject
    try:
        runner.run()
    finally:
        tf.config.run_functions_eagerly(False)
    run = events.read_run(trainer.model_dir)
    images = {tag for sub, tag in run.images if sub == "train"}
    assert {"weights/transparent_attention", "weights/encoder_dlcl"} <= images, images
    assert run.images[("train", "weights/encoder_dlcl")][0] == 4
    gates = run.tags("gates/", "train")
    assert "gates/encoder/layer_1/self/key" in gates and "gates/decoder/layer_0/self/value" in gates
    steps, values = run.scalar("gates/encoder/layer_0/self/key", ("train",))
    assert list(steps) == [2, 4] and ((values > 0) & (values < 1)).all()
    # The transparent weights are scalars too (Bapna et al. Fig. 4 curves).
    steps, values = run.scalar("transparent_attention/decoder_layer_1/source_0", ("train",))
    assert list(steps) == [2, 4] and ((values > 0) & (values < 1)).all()


# --------------------------------------------------------------------------------------------
# Layer probe
# --------------------------------------------------------------------------------------------


def test_decoder_layer_states_match_the_decoder_and_cosines_are_in_range():
    from deep_nmt_tf.models import build_model

    batch = _batch(make_batches(1, batch_size=5, seed=8)[0])
    both = stacks({"lexical_shortcuts": {"enabled": True}}, encoder={"num_layers": 2},
                  decoder={"num_layers": 3, "lexical_shortcuts": {"placement": "both"}})
    for model in (build_model(tiny_config(both)), _deep_model(dlcl=False)):
        states = probe.layer_states(model, batch["source_ids"], batch["target_input_ids"])
        assert len(states["encoder"]) == model.model_config.encoder.get().num_layers + 1
        assert len(states["decoder"]) == model.model_config.decoder.get().num_layers + 1
        # The replayed decoder is the decoder: its top state gives the model's logits.
        logits = model({"source_ids": batch["source_ids"],
                        "target_input_ids": batch["target_input_ids"]}, training=False)
        np.testing.assert_allclose(model.decoder.output_logits(states["decoder"][-1]), logits,
                                   atol=1e-5)

        cosine = probe.CosineProbe(model)
        cosine.update(batch)
        cosine.update(batch)
        result = cosine.result()
        for stack in ("encoder", "decoder"):
            values = np.array(result[stack])
            assert values.shape == (len(states[stack]),)
            assert values[0] == pytest.approx(1.0, abs=1e-5)
            assert (np.abs(values) <= 1.0 + 1e-5).all()
            # Against numpy on the masked positions.
            ids = batch["source_ids" if stack == "encoder" else "target_input_ids"].numpy()
            mask = ids != 0
            assert cosine.tokens[stack] == 2 * mask.sum()
            y0 = states[stack][0].numpy()[mask]
            for layer, state in enumerate(states[stack]):
                y = state.numpy()[mask]
                cos = (y0 * y).sum(-1) / np.linalg.norm(y0, axis=-1) / np.linalg.norm(y, axis=-1)
                assert values[layer] == pytest.approx(cos.mean(), abs=1e-5)


# --------------------------------------------------------------------------------------------
# The experiment (Bapna et al. 2018 Fig. 1/3, Wang et al. 2019)
# --------------------------------------------------------------------------------------------

DEMO_OVERRIDES = [
    # The demo config on a small synthetic corpus (the same language, fewer sentences: three
    # updates read about 150).
    "data.synthetic_train_size=600", "data.synthetic_dev_size=20",
    "data.synthetic_test_size=20", "data.vocab_size=300", "data.shuffle_buffer=600",
    # Tiny widths, a 20-layer post-norm encoder.
    "model.d_model=16", "model.encoder.transformer.num_layers=20",
    "model.decoder.transformer.num_layers=1"] + [
    f"model.{stack}.transformer.{key}" for stack in ("encoder", "decoder")
    for key in ("num_heads=2", "ffn_dim=32", "norm=post")] + [
    "training.train_steps=3", "training.batch_tokens=1024", "training.schedule.type=constant",
    "training.schedule.constant.learning_rate=3e-3", "training.grad_norm_ratio_every=1",
    "training.log_every=3",
    "training.checkpoint_every=3", "training.eval_every=0",
]
VARIANTS = {
    "post-norm": [],
    "transparent": ["model.transparent_attention.enabled=true"],
    "dlcl": ["model.encoder.transformer.dlcl.enabled=true"],
}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Even though the `tf.config.experimental_run_functions")
def test_deep_post_norm_ratio_is_far_below_transparent_attention_and_dlcl(tmp_path):
    """r_t of a 20-layer post-norm encoder is far below the same encoder's with transparent
    attention or with (encoder) DLCL, at initialisation and after a few updates.

    Bapna et al. report r_t flat and well below 1 for the 20-layer post-norm Transformer (the
    gradient vanishes on its way down the encoder; Fig. 1) and r_t of the healthy shape with
    transparent attention (Fig. 3); Wang et al. attribute the failure of deep post-norm stacks to
    the same vanishing gradient and let DLCL's direct connections carry it.  The trainer's own
    in-step measurement (``training.grad_norm_ratio_every=1``) on the demo corpus.  The steps run
    eagerly (``tf.config.run_functions_eagerly``): the same code as the compiled step, without
    tracing three 20-layer graphs (25 s each on 2 busy cores, over 60 s on loaded ones; an
    eager update takes about 5 s).  Three updates: r_t at initialisation, after one and after
    two.
    """
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.training import Runner

    ratios = {}
    tf.config.run_functions_eagerly(True)
    try:
        for name, extra in VARIANTS.items():
            config = load_config(os.path.join(os.path.dirname(__file__), "..", "configs",
                                              "demo.yaml"), DEMO_OVERRIDES + extra)
            runner = Runner(config, str(tmp_path / name.replace(" ", "_")))
            logs = []
            runner.run(hooks=[lambda t, s, l: logs.append(l["grad_norm_ratio"])])
            ratios[name] = np.array(logs)
    finally:
        tf.config.run_functions_eagerly(False)
    print("\nr_t = ||dL/dh_1|| / ||dL/dh_N|| per update, 20-layer encoders, demo data:")
    for name, values in ratios.items():
        print(f"  {name:12s} " + " ".join(f"{v:.3g}" for v in values))
    post = ratios["post-norm"]
    assert (post < 1.0).all(), post  # Bapna et al.: r_t stays below 1 (vanishing gradient)
    for name in ("transparent", "dlcl"):
        other = ratios[name]
        assert post[0] * 5 < other[0], (name, post[0], other[0])  # at initialisation
        assert post[-1] * 5 < other[-1], (name, post[-1], other[-1])  # after the updates
        assert np.median(post) * 5 < np.median(other), (name, post, other)
