"""The run directory (deep_nmt_tf.run_dir): layout, stored paths, run.json, resume checks."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from deep_nmt_tf.config import ConfigError, config_from_dict
from deep_nmt_tf.run_dir import RunDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["<pad>", "<s>", "</s>", "[UNK]", "ta", "ko", "##s"]


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


def _prepared(run: RunDir, outside: str, **model):
    """A config as prepare_data leaves it: corpus under MODEL_DIR/data, vocabulary in
    MODEL_DIR, a test set outside the run directory."""
    data = {f"{split}_{side}": _write(run.join("data", f"{split}.{ext}"), ["ta ko"])
            for split in ("train", "dev") for side, ext in (("source", "src"), ("target", "tgt"))}
    data["test_source"] = data["test_target"] = outside
    data["vocab"] = _write(run.default_vocab_path, VOCAB)
    return config_from_dict({"model": dict(vocab_size=len(VOCAB), **model), "data": data,
                             "training": {"train_steps": 5}}, source="<test>")


def test_layout():
    run = RunDir("runs/demo")
    assert run.config_path == os.path.join("runs/demo", "config.yaml")
    assert run.metadata_path == os.path.join("runs/demo", "run.json")
    assert run.default_vocab_path == os.path.join("runs/demo", "vocab.txt")
    assert run.data_dir == os.path.join("runs/demo", "data")
    assert run.export_dir == os.path.join("runs/demo", "exports")
    assert run.log_dir("train") == os.path.join("runs/demo", "train")
    assert RunDir(run).path == "runs/demo" and os.fspath(run) == "runs/demo"
    assert not run.has_config()


def test_paths_inside_are_stored_relative_and_a_moved_run_keeps_working(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = _write(str(tmp_path / "corpus" / "test.txt"), ["x"])
    relative = RunDir("runs/demo")  # as --model_dir=runs/demo
    config = _prepared(relative, os.path.relpath(outside))
    relative.save_config(config)
    with open(relative.config_path, encoding="utf-8") as f:
        stored = yaml.safe_load(f)["data"]
    assert stored["vocab"] == "vocab.txt"
    assert stored["train_source"] == os.path.join("data", "train.src")
    assert stored["test_source"] == outside  # outside the run directory: absolute

    # An absolute --model_dir reads the same files.
    absolute = RunDir(str(tmp_path / "runs" / "demo"))
    loaded = absolute.load_config()
    assert loaded.data.vocab == absolute.default_vocab_path
    assert loaded.data.train_source == absolute.join("data", "train.src")
    assert loaded.data.test_source == outside
    assert absolute.vocab_path(loaded) == absolute.default_vocab_path

    # Moved, and read from another working directory.
    shutil.move(str(tmp_path / "runs" / "demo"), str(tmp_path / "moved"))
    monkeypatch.chdir(tmp_path / "corpus")
    moved = RunDir(str(tmp_path / "moved")).load_config(["decoding.beam_size=2"])
    assert os.path.exists(moved.data.vocab) and os.path.exists(moved.data.dev_target)
    assert moved.decoding.beam_size == 2
    # Its config.yaml given as the tools' --config (a resume, a kept checkpoint's directory)
    # reads the same files; another config file's relative paths stay the working directory's.
    from deep_nmt_tf.cli import load_config_file

    assert os.path.exists(tmp_path / "moved" / "run.json")
    given = load_config_file(str(tmp_path / "moved" / "config.yaml"), ["decoding.beam_size=2"])
    assert (given.data.vocab, given.data.dev_target) == (moved.data.vocab, moved.data.dev_target)
    assert given.decoding.beam_size == 2
    shutil.copy(tmp_path / "moved" / "config.yaml", tmp_path / "template.yaml")
    assert load_config_file(str(tmp_path / "template.yaml")).data.vocab == "vocab.txt"


def test_configs_of_older_versions_still_load(tmp_path, monkeypatch):
    """Older versions stored paths relative to the training run's working directory."""
    monkeypatch.chdir(tmp_path)
    run = RunDir("runs/old")
    config = _prepared(run, "")
    from deep_nmt_tf.config import save_config

    save_config(config, run.config_path)  # the paths as given: runs/old/vocab.txt ...
    assert run.load_config().data.vocab == os.path.join("runs/old", "vocab.txt")
    # The same directory moved: its synthetic corpus is found in MODEL_DIR/data.
    shutil.move("runs/old", "elsewhere")
    loaded = RunDir("elsewhere").load_config()
    assert loaded.data.train_source == os.path.join("elsewhere", "data", "train.src")
    assert RunDir("elsewhere").vocab_path(loaded) == os.path.join("elsewhere", "vocab.txt")


def test_run_json_and_resume_checks(tmp_path, caplog):
    run = RunDir(str(tmp_path / "run"))
    config = _prepared(run, "")
    assert run.save_config(config) is None
    meta = run.metadata()
    import deep_nmt_tf

    assert meta["package"] == "deep_nmt_tf" and meta["version"] == deep_nmt_tf.__version__
    with open(run.default_vocab_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert meta["vocab"] == {"file": "vocab.txt", "size": len(VOCAB), "sha256": digest}
    assert meta["created"] == meta["updated"]

    # Resume: training keys may change (logged), the paths did not (not logged).
    longer = dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                      train_steps=7))
    with caplog.at_level("INFO", logger="absl"):
        assert run.save_config(longer) == config
    changes = [r.getMessage() for r in caplog.records if "Config change" in r.getMessage()]
    assert changes == ["Config change on resume: training.train_steps: 5 -> 7"], changes
    assert json.load(open(run.metadata_path))["created"] == meta["created"]

    # A changed model is refused, before and after data preparation.
    with pytest.raises(ConfigError, match=r"model\.d_model: 512 -> 64"):
        run.check_config(_prepared(run, "", d_model=64, encoder={"transformer": {"num_heads": 2}},
                                   decoder={"transformer": {"num_heads": 2}}))
    unprepared = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                       vocab_size=0))
    assert run.check_config(unprepared) == longer
    # So is another vocabulary of the same size.
    _write(run.default_vocab_path, VOCAB[:-1] + ["mi"])
    with pytest.raises(ConfigError, match="not the vocabulary this model directory was trained"):
        run.save_config(config)


def test_load_config_of_a_directory_without_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="is .* a model directory written by"):
        RunDir(str(tmp_path)).load_config()
    assert RunDir(str(tmp_path)).saved_config() is None


def test_a_damaged_saved_config_names_its_file_and_line(tmp_path):
    """A run's config.yaml that is no longer YAML, or not a mapping (a disk error, an edit gone
    wrong): every tool reads it through RunDir and says what is wrong, where, not a traceback."""
    (tmp_path / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"config.yaml:2: invalid YAML: expected ',' or '\]'"):
        RunDir(str(tmp_path)).load_config()
    (tmp_path / "config.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match=r"config.yaml:1: the top level must be a mapping of "
                                          r"sections, got list"):
        RunDir(str(tmp_path)).saved_config()


def test_run_dir_does_not_import_tensorflow():
    code = ("import sys, deep_nmt_tf.run_dir as r; r.RunDir('x').has_config(); "
            "print('tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_periodic_action_schedule():
    from deep_nmt_tf.training.runner import PeriodicAction

    every3 = PeriodicAction("x", 3, lambda step, logs: None)
    assert [s for s in range(1, 8) if every3.due(s, 7)] == [3, 6, 7]
    not_at_end = PeriodicAction("x", 3, lambda step, logs: None, at_end=False)
    assert [s for s in range(1, 8) if not_at_end.due(s, 7)] == [3, 6]
    assert not any(PeriodicAction("x", 0, None).due(s, 7) for s in range(1, 8))
