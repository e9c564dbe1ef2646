"""The diagnostic figures and the layer probe (deep_nmt_tf.analysis) and their tools
deep-nmt-plot-diagnostics and deep-nmt-probe-layers, on a tiny real run directory."""

import json
import os

import numpy as np
import pytest

from test_training_helpers import run_tool

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Every test needs the module's trained run directory.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(
    "ignore:Even though the `tf.config.experimental_run_functions")]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny Transformer with transparent attention, DLCL and lexical shortcuts trained 3
    steps on a small synthetic corpus by the real trainer, with every diagnostic on."""
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.training import Runner

    model_dir = str(tmp_path_factory.mktemp("diag_run"))
    overrides = [
        "data.synthetic_train_size=300", "data.synthetic_dev_size=16",
        "data.synthetic_test_size=16", "data.vocab_size=200", "data.shuffle_buffer=300",
        "data.max_dev_sentences=16",
        "model.d_model=16", "model.encoder.transformer.num_layers=3",
        "model.decoder.transformer.num_layers=2", "model.transparent_attention.enabled=true",
        "training.train_steps=3", "training.batch_tokens=512", "training.log_every=1",
        "training.checkpoint_every=3", "training.eval_every=3", "training.eval_bleu=false",
        "training.grad_norm_ratio_every=1", "training.schedule.type=constant",
        "training.schedule.constant.learning_rate=3e-3",
    ] + [f"model.{stack}.transformer.{key}" for stack in ("encoder", "decoder")
         for key in ("num_heads=2", "ffn_dim=32", "dlcl.enabled=true",
                     "lexical_shortcuts.enabled=true")]
    config = load_config(os.path.join(ROOT, "configs", "demo.yaml"), overrides)
    # Eagerly: what the run writes is the subject here, and three updates (with the grad-norm
    # ratio) and an evaluation run in less time than tracing them takes.
    import tensorflow as tf

    tf.config.run_functions_eagerly(True)
    try:
        Runner(config, model_dir).run()
    finally:
        tf.config.run_functions_eagerly(False)
    return model_dir


def test_plot_diagnostics_writes_the_papers_figures(run_dir, tmp_path):
    import PIL.Image

    from deep_nmt_tf.analysis.figures import dlcl_display_mask, plot_runs, smooth

    out = str(tmp_path / "plots")
    notes = []
    written = plot_runs([run_dir, run_dir], labels=["a", "b c"], output_dir=out,
                        dlcl_column=1, log=notes.append)
    names = sorted(os.path.basename(p) for p in written)
    assert names == sorted([
        "grad_norm_ratio.png", "grad_norms.png",
        "a_transparent_weights.png", "a_encoder_dlcl.png", "a_decoder_dlcl.png", "a_gates.png",
        "b_c_transparent_weights.png", "b_c_encoder_dlcl.png", "b_c_decoder_dlcl.png",
        "b_c_gates.png"]), names
    for path in written:
        with PIL.Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    assert not notes
    # The DLCL matrix from the summaries equals the one from the checkpoint (logged at the
    # last step, which is also the last checkpoint).
    from deep_nmt_tf.analysis.events import read_run
    from deep_nmt_tf.analysis.figures import dlcl_from_summary, weights_from_checkpoint

    from_ckpt = weights_from_checkpoint(run_dir)
    from_summary = dlcl_from_summary(read_run(run_dir))
    for name in ("encoder_dlcl", "decoder_dlcl"):
        np.testing.assert_allclose(from_summary[name], from_ckpt[name], atol=1e-6)
    assert from_ckpt["transparent_attention"].shape == (4, 2)
    # Wang et al.'s display masking and the smoothing.
    mask = dlcl_display_mask(np.array([[1.0, 0, 0], [0.05, 1.0, 0], [0.3, 0.01, 0.5]]), True)
    np.testing.assert_array_equal(mask, [[1, 0, 0], [0, 1, 0], [1, 0, 1]])
    np.testing.assert_allclose(smooth(np.array([1.0, 3.0]), 0.5), [1.0, 1.75 / 0.75])  # debiased

    # A run without diagnostics: nothing to draw, and a note saying why.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert plot_runs([str(empty)], output_dir=out, log=notes.append) == []
    assert notes and "grad_norm_ratio_every" in notes[0]
    with pytest.raises(ValueError):
        plot_runs([run_dir], labels=["x", "y"], output_dir=out)
    with pytest.raises(FileNotFoundError):
        plot_runs([str(tmp_path / "missing")], output_dir=out)


def test_plot_diagnostics_command_line(run_dir, tmp_path):
    out = str(tmp_path / "cli")
    proc = run_tool("plot_diagnostics", f"--run_dirs={run_dir}", f"--output_dir={out}",
                    "--figures=grad_norm_ratio,gates", "--smoothing=0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.split()
    assert [os.path.basename(p) for p in printed] == [
        "grad_norm_ratio.png", "grad_norms.png", f"{os.path.basename(run_dir)}_gates.png"]
    assert all(os.path.exists(p) for p in printed)
    # A usage error, in this process (the command line's exit status for it is absl's).
    from absl import app, flags

    from deep_nmt_tf.tools import plot_diagnostics

    flags.FLAGS.unparse_flags()
    argv = flags.FLAGS(["plot_diagnostics", "--run_dirs=", "--figures=nope"])
    with pytest.raises(app.UsageError):
        plot_diagnostics.main(argv)


def test_probe_layers_output_shape_and_range(run_dir, tmp_path, capsys):
    from deep_nmt_tf.tools.probe_layers import probe_models

    out = str(tmp_path / "probe")
    data = os.path.join(run_dir, "data")
    results = probe_models([run_dir, run_dir], labels=["m1", "m2"], output_dir=out,
                           source=os.path.join(data, "dev.src"),
                           target=os.path.join(data, "dev.tgt"), max_sentences=10,
                           batch_size=4)
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["layer", "m1", "encoder", "m1", "decoder", "m2",
                                               "encoder", "m2", "decoder"]
    with open(os.path.join(out, "cosine_similarity.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert os.path.getsize(os.path.join(out, "cosine_similarity.png")) > 1000
    for label in ("m1", "m2"):
        r = saved[label]
        assert len(r["encoder"]) == 4 and len(r["decoder"]) == 3  # embedding + layers
        for stack in ("encoder", "decoder"):
            values = np.array(r[stack])
            assert values[0] == pytest.approx(1.0, abs=1e-5)
            assert (np.abs(values) <= 1.0 + 1e-5).all() and np.isfinite(values).all()
            assert r["tokens"][stack] > 10
        assert r["sentences"] == 10 and r["checkpoint"].endswith("ckpt-3")
    np.testing.assert_allclose(saved["m1"]["encoder"], saved["m2"]["encoder"], rtol=1e-6)
    np.testing.assert_allclose(saved["m1"]["decoder"], results["m1"]["decoder"], rtol=1e-6)
    # Default data: the model's test set.
    from deep_nmt_tf.analysis.probe import probe_model

    default = probe_model(run_dir, max_sentences=4)
    assert default["source"].endswith("test.src") and default["sentences"] == 4
    with pytest.raises(ValueError):
        probe_model(run_dir, source=os.path.join(data, "dev.src"))
