"""The checkpoint store of a run directory: one meaning of "the latest checkpoint" for both
kinds (``ckpt-N`` of deep-nmt-train, ``ckpt-N.weights.h5`` of deep-nmt-fit), the same integrity
checks and damaged-file handling for both, and the tools on runs of either route
(``--checkpoint=DIR`` included)."""

import logging
import os
import shutil

import pytest

from deep_nmt_tf.checkpoints import (KERAS_WEIGHTS, TF_CHECKPOINT, CheckpointError,
                                     CheckpointStore)
from test_decoding_helpers import TINY, trained_model_dir
from test_robustness import _messages, _tool

from deep_nmt_tf.tools import evaluate as evaluate_tool  # noqa: E402
from deep_nmt_tf.tools import export as export_tool  # noqa: E402
from deep_nmt_tf.tools import translate as translate_tool  # noqa: E402


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory):
    """A run trained with compile/fit (deep-nmt-fit's train()): ckpt-2/4.weights.h5."""
    from deep_nmt_tf.config import config_from_dict
    from deep_nmt_tf.data.preprocess import preprocess_run
    from deep_nmt_tf.fit.run import train

    run = str(tmp_path_factory.mktemp("fit") / "run")
    # (One decoder layer: what is traced, fit's step and the tools' searches, is smaller.)
    model = dict(TINY["model"], decoder=TINY["model"]["encoder"])
    tree = dict(TINY, model=model, training=dict(TINY["training"], train_steps=4, log_every=2,
                                                 checkpoint_every=2))
    preprocess_run(config_from_dict(tree, source="<fit run>"), run)
    train(run)
    return run


def _copy(source, tmp_path, name="copy"):
    target = str(tmp_path / name)
    shutil.copytree(source, target)
    return target


def test_the_store_lists_and_resolves_the_weights_of_a_fit_run(fit_run):
    store = CheckpointStore(fit_run)
    names = [os.path.basename(p) for p in store.list()]
    assert names == ["ckpt-2.weights.h5", "ckpt-4.weights.h5"]
    assert store.list(kinds=[TF_CHECKPOINT]) == []
    assert store.latest() == os.path.join(fit_run, "ckpt-4.weights.h5")
    elsewhere = CheckpointStore(os.path.dirname(fit_run))
    assert store.resolve() == store.latest() == elsewhere.resolve(fit_run)  # DIR: its latest
    assert store.resolve(os.path.join(fit_run, "ckpt-2.weights.h5")).endswith("ckpt-2.weights.h5")
    with pytest.raises(FileNotFoundError, match=r"ckpt-6\.weights\.h5: no such checkpoint .*"
                                                r"ckpt-2\.weights\.h5, ckpt-4\.weights\.h5"):
        store.resolve(os.path.join(fit_run, "ckpt-6.weights.h5"))


def test_a_damaged_weights_file_is_skipped_with_a_warning_like_a_damaged_ckpt(
        fit_run, tmp_path, caplog):
    run = _copy(fit_run, tmp_path)
    newest = os.path.join(run, "ckpt-4.weights.h5")
    size = os.path.getsize(newest)
    with open(newest, "r+b") as f:
        f.truncate(size // 2)
    store = CheckpointStore(run)
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert store.latest() == os.path.join(run, "ckpt-2.weights.h5")
    assert "Skipping checkpoint " + newest + ": " + newest + " is damaged" in _messages(caplog)
    assert os.path.getsize(newest) == size // 2  # tools only read
    with pytest.raises(CheckpointError, match=r"ckpt-4\.weights\.h5 cannot be read: .*damaged"):
        store.resolve(newest)


def test_fit_resumes_only_from_weights_that_pass_the_check(fit_run, tmp_path, caplog):
    from deep_nmt_tf.fit import build_fit_model, compile_model
    from deep_nmt_tf.fit.run import restore_resume_point
    from deep_nmt_tf.run_dir import RunDir

    run = _copy(fit_run, tmp_path)
    with open(os.path.join(run, "ckpt-4.weights.h5"), "r+b") as f:
        f.truncate(1000)
    config = RunDir(run).load_config()
    model = build_fit_model(config)
    compile_model(model, config)
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert restore_resume_point(model, RunDir(run)) == 2
    logs = _messages(caplog)
    assert "Skipping checkpoint" in logs and "Resuming from " + os.path.join(
        run, "ckpt-2.weights.h5") in logs
    assert sorted(n for n in os.listdir(run) if n.startswith("ckpt-")) == [
        "ckpt-2.weights.h5", "ckpt-4.weights.h5.unreadable"]  # kept, set aside
    # None readable: refused, nothing changed.
    with open(os.path.join(run, "ckpt-2.weights.h5"), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CheckpointError, match=r"has checkpoints but none can be read .*"
                                              r"ckpt-2\.weights\.h5 is damaged"):
        CheckpointStore(run).resume_point(KERAS_WEIGHTS)
    assert os.path.exists(os.path.join(run, "ckpt-2.weights.h5"))


def test_one_latest_in_the_package():
    """No other function or property of the package is called latest (one meaning)."""
    import ast
    import glob

    from test_training_helpers import ROOT

    names = []
    for path in glob.glob(os.path.join(ROOT, "deep_nmt_tf", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "latest" in node.name:
                names.append(f"{os.path.relpath(path, ROOT)}:{node.name}")
    assert names == [os.path.join("deep_nmt_tf", "checkpoints", "store.py") + ":latest"], names


@pytest.mark.slow
@pytest.mark.parametrize("route", ["fit", "train"])
def test_translate_evaluate_and_export_work_on_a_run_of_either_route(route, fit_run,
                                                                     tmp_path_factory, tmp_path):
    run = fit_run if route == "fit" else trained_model_dir(tmp_path_factory)
    test_source = os.path.join(run, "data", "test.src")
    test_target = os.path.join(run, "data", "test.tgt")
    out = str(tmp_path / "out.txt")
    assert _tool(translate_tool, f"--model_dir={run}", f"--checkpoint={run}",
                 f"--input={test_source}", f"--output={out}", "--nojit_compile",
                 "--noprogress") == ""
    lines = open(out, encoding="utf-8").read().splitlines()
    assert len(lines) == TINY["data"]["synthetic_test_size"]
    assert _tool(evaluate_tool, f"--model_dir={run}", f"--checkpoint={run}",
                 f"--source={test_source}", f"--reference={test_target}", "--beam_size=1",
                 "--nojit_compile") == ""
    assert _tool(export_tool, f"--model_dir={run}", f"--export_dir={tmp_path / 'exports'}",
                 "--nojit_compile") == ""
    assert os.path.exists(str(tmp_path / "exports" / "1" / "saved_model.pb"))


def test_an_average_written_as_keras_weights_is_the_mean_and_every_tool_reads_it(fit_run,
                                                                               tmp_path):
    """The average a machine without TensorFlow writes (a model-only ``.weights.h5``: what
    ``deep-nmt-experiment --route=fit --stop_after=average`` brings back from a GPU machine
    with only JAX) holds the mean of the checkpoints and translates here."""
    import numpy as np

    from deep_nmt_tf.checkpoints.averaging import average_model_variables
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.run_dir import RunDir

    store = CheckpointStore(fit_run)
    out = str(tmp_path / "averaged")
    path = store.average(out, last=2, output_format=KERAS_WEIGHTS)
    assert os.path.basename(path) == "ckpt-4.weights.h5"
    averaged = CheckpointStore(out)
    assert averaged.list() == [path] and averaged.list(kinds=[TF_CHECKPOINT]) == []
    assert os.path.getsize(path) < os.path.getsize(store.latest()) / 2  # no optimizer slots
    config = RunDir(out).load_config()
    got, want = build_model(config), build_model(config)
    averaged.restore_model(got)
    average_model_variables(want, store.list())
    for a, b in zip(got.weights, want.weights):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    first = build_model(config)
    CheckpointStore(fit_run).restore_model(first, store.list()[0])
    assert any(not np.array_equal(a.numpy(), b.numpy())
               for a, b in zip(first.weights, got.weights))  # the mean, not the first one
    text = _tool(translate_tool, f"--model_dir={out}", "--nojit_compile", "--noprogress",
                 f"--input={os.path.join(fit_run, 'data', 'test.src')}",
                 f"--output={tmp_path / 'out.txt'}")
    assert text == ""
    assert len(open(tmp_path / "out.txt", encoding="utf-8").read().splitlines()) == \
        TINY["data"]["synthetic_test_size"]
    with pytest.raises(ValueError, match="output_format='npz'"):
        store.average(str(tmp_path / "other"), output_format="npz")
