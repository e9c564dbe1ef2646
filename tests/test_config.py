"""Config loading: defaults, overrides, includes, and rejection of bad input before any work."""

import glob
import os

import pytest
import yaml

from deep_nmt_tf.config import (Config, ConfigError, config_to_dict, describe_config,
                                load_config, require_training_data, save_config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))))
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_overrides_and_types(tmp_path):
    path = _write(tmp_path, "model:\n  d_model: 64\n  num_heads: 4\n")
    cfg = load_config(path, overrides=["training.learning_rate=1e-3", "model.norm=pre",
                                       "training.jit_compile=true", "data.corpus=synthetic"])
    assert cfg.model.d_model == 64 and cfg.training.learning_rate == 1e-3
    assert cfg.model.norm == "pre" and cfg.training.jit_compile is True
    assert isinstance(cfg.training.learning_rate, float)


@pytest.mark.parametrize("text,override,fragment", [
    ("model:\n  d_modle: 64\n", (), "c.yaml:2: model.d_modle: unknown key"),
    ("modle:\n  d_model: 64\n", (), "c.yaml:1: modle: unknown key"),
    ("model:\n  d_model: abc\n", (), "c.yaml:2: model.d_model: expected int"),
    ("model:\n  d_model: true\n", (), "model.d_model: expected int"),
    ("model:\n  residual_dropout: -0.1\n", (), "c.yaml:2: model.residual_dropout: -0.1 is out of range"),
    ("model:\n  d_model: 100\n  num_heads: 8\n", (), "c.yaml:3: model.num_heads: 8 does not divide"),
    ("model:\n  norm: middle\n", (), "c.yaml:2: model.norm: 'middle' is not one of pre, post"),
    ("training:\n  learning_rate: 0\n", (), "training.learning_rate: 0.0 is out of range"),
    ("", ("model.encoder_layers=0",), "--override: model.encoder_layers: 0 is out of range"),
    ("", ("model.nope=1",), "--override: model.nope: unknown key"),
    ("", ("training.train_steps",), "expected KEY=VALUE"),
    ("- a\n- b\n", (), "top level must be a mapping"),
    ("model: [1, 2\n", (), "invalid YAML"),
    ("decoding:\n  beam_size: 2\n  n_best: 3\n", (), "decoding.n_best: 3 exceeds"),
])
def test_rejections_name_file_line_and_key(tmp_path, text, override, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides=override)
    assert fragment in str(err.value)


def test_missing_file_and_bad_utf8(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tmp_path / "missing.yaml"))
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"model:\n  norm: \xff\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2: config file is not valid UTF-8"):
        load_config(str(path))


def test_base_include_and_cycle(tmp_path):
    _write(tmp_path, "model:\n  d_model: 64\n  num_heads: 4\n", "base.yaml")
    child = _write(tmp_path, "base: base.yaml\nmodel:\n  num_heads: 2\n", "child.yaml")
    cfg = load_config(child)
    assert (cfg.model.d_model, cfg.model.num_heads) == (64, 2)
    a = _write(tmp_path, "base: b.yaml\n", "a.yaml")
    _write(tmp_path, "base: a.yaml\n", "b.yaml")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(a)


def test_save_and_reload_is_identical(tmp_path):
    cfg = load_config(os.path.join(ROOT, "configs", "demo.yaml"),
                      overrides=["training.train_steps=7"])
    out = str(tmp_path / "run" / "config.yaml")
    save_config(cfg, out)
    again = load_config(out)
    assert config_to_dict(again) == config_to_dict(cfg)
    assert yaml.safe_load(open(out))["training"]["train_steps"] == 7


def test_training_data_required_only_for_training(tmp_path):
    cfg = load_config(os.path.join(ROOT, "configs", "transformer_base.yaml"))
    with pytest.raises(ConfigError, match="data.train_source: required"):
        require_training_data(cfg)
    require_training_data(load_config(os.path.join(ROOT, "configs", "demo.yaml")))


def test_every_key_is_documented():
    rows = describe_config()
    keys = {r[0] for r in rows}
    for key in ("model.d_model", "model.num_heads", "model.ffn_dim", "model.encoder_layers",
                "model.decoder_layers", "model.norm", "data.train_source", "data.train_target",
                "data.dev_source", "data.dev_target", "data.vocab", "training.train_steps",
                "training.batch_tokens", "training.learning_rate"):
        assert key in keys
    assert all(help_ for _, _, help_ in rows)


def test_config_reference_is_current():
    from deep_nmt_tf.config import config_reference_markdown

    path = os.path.join(ROOT, "docs", "CONFIG.md")
    assert open(path, encoding="utf-8").read() == config_reference_markdown(), (
        "docs/CONFIG.md is stale: python -m deep_nmt_tf.config > docs/CONFIG.md")
