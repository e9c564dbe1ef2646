"""deep-nmt-train (tools/train.py) end to end on the real data pipeline (synthetic corpus) and
model, run as ``python -m deep_nmt_tf.tools.train``."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import yaml

from test_decoding_helpers import build_once
from test_training_helpers import SUBPROCESS_TIMEOUT, captured_logs, run_tool, weights

_STACK = {"num_layers": 1, "num_heads": 2, "ffn_dim": 32, "norm": "pre"}
TINY = {
    "model": {"d_model": 16, "encoder": {"transformer": dict(_STACK)},
              "decoder": {"transformer": dict(_STACK)}},
    "data": {"corpus": "synthetic", "synthetic_train_size": 300, "synthetic_dev_size": 12,
             "synthetic_test_size": 4, "vocab_size": 120, "max_dev_sentences": 8,
             "shuffle_buffer": 64},
    "training": {"train_steps": 4, "batch_tokens": 300,
                 "schedule": {"type": "inverse_sqrt",
                              "inverse_sqrt": {"learning_rate": 3e-3, "warmup_steps": 2}},
                 "log_every": 2,
                 "checkpoint_every": 2, "keep_checkpoints": 2, "eval_every": 4, "seed": 3},
    "decoding": {"batch_size": 4, "max_length_a": 1.0, "max_length_b": 2},
}

def _write_config(tmp_path, data=TINY):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def train_tool_run(tmp_path_factory):
    """``python -m deep_nmt_tf.tools.train --config=TINY --checkpoint_data_iterator`` run once
    per test session the way an installed console script runs (from another directory,
    ``TF_CPP_MIN_LOG_LEVEL`` unset: ``tests/test_tools_quiet.py`` checks its output too):
    ``{"model_dir", "config", "returncode", "stdout", "stderr"}``.  Tests that change the run
    directory copy it first."""

    def build(path):
        os.makedirs(path)
        config = _write_config(pathlib.Path(path))
        model_dir = os.path.join(path, "run")
        env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        proc = subprocess.run([sys.executable, "-m", "deep_nmt_tf.tools.train",
                               f"--config={config}", f"--model_dir={model_dir}",
                               "--checkpoint_data_iterator"], cwd=tempfile.gettempdir(),
                              capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
                              env=env)
        with open(os.path.join(path, "process.json"), "w", encoding="utf-8") as f:
            json.dump({"model_dir": model_dir, "config": config, "returncode": proc.returncode,
                       "stdout": proc.stdout, "stderr": proc.stderr}, f)

    path = build_once(tmp_path_factory, "train_tool_run", build)
    with open(os.path.join(path, "process.json"), encoding="utf-8") as f:
        return json.load(f)


def test_config_errors_exit_2_before_any_work(tmp_path):
    config = _write_config(tmp_path)
    model_dir = str(tmp_path / "run")
    proc = run_tool("train", f"--config={config}", f"--model_dir={model_dir}",
                    "--override=model.encoder.transformer.num_heads=3")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("--override: model.encoder.transformer.num_heads: 3 does not divide "
            "model.d_model=16") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(model_dir)
    bad = dict(TINY, data={"corpus": "files"})
    proc = run_tool("train", f"--config={_write_config(tmp_path, bad)}",
                    f"--model_dir={model_dir}")
    assert proc.returncode == 2 and "data.train_source: required" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_train_tool_then_exact_resume_in_process(tmp_path, tmp_path_factory):
    config_path = _write_config(tmp_path)
    proc = train_tool_run(tmp_path_factory)  # (the session's run of the tool, copied)
    assert proc["returncode"] == 0, proc["stderr"][-4000:]
    model_dir = str(tmp_path / "run")
    shutil.copytree(proc["model_dir"], model_dir)
    assert "step 4/4: loss" in proc["stderr"] and "eval at step 4:" in proc["stderr"]
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-4")
    for name in ("config.yaml", "vocab.txt", "train", "eval"):
        assert os.path.exists(os.path.join(model_dir, name)), name
    tags = set()
    eval_dir = os.path.join(model_dir, "eval")
    for f in os.listdir(eval_dir):
        for record in tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, f)):
            tags.update(v.tag for v in record.summary.value)
    assert {"loss", "bleu", "perplexity"} <= tags

    # Continue to step 8 in this process (restoring the data iterator from the checkpoint) and
    # compare with 8 uninterrupted steps.
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.training import Runner

    overrides = ["training.train_steps=8", "training.eval_every=0"]
    runner = Runner(load_config(config_path, overrides), model_dir, checkpoint_iterator=True)
    resumed = runner.trainer
    assert int(resumed.step.numpy()) == 4
    with captured_logs() as messages:
        runner.run()
    assert any("Restored the training data iterator" in m for m in messages), messages
    runner = Runner(load_config(config_path, overrides), str(tmp_path / "straight"))
    straight = runner.trainer
    runner.run()
    assert int(resumed.data_position.numpy()) == int(straight.data_position.numpy()) == 8
    for a, b in zip(weights(resumed), weights(straight)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)

    # Resumed under the other data.autotune, the saved iterator does not restore (another
    # pipeline graph): the consumed batches are read again, and the run is the same.
    other_dir = str(tmp_path / "other_autotune")
    shutil.copytree(proc["model_dir"], other_dir)
    runner = Runner(load_config(config_path, overrides + ["data.autotune=true"]), other_dir,
                    checkpoint_iterator=True)
    with captured_logs() as messages:
        runner.run()
    assert any("re-reading the consumed batches instead" in m and "data.autotune" in m
               for m in messages), messages
    for a, b in zip(weights(runner.trainer), weights(straight)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
