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


ENC = "model.encoder.transformer"
LR = "training.schedule.transformer.scale"


def test_overrides_and_types(tmp_path):
    path = _write(tmp_path, "model:\n  d_model: 64\n  encoder:\n    transformer:\n"
                            "      num_heads: 4\n")
    cfg = load_config(path, overrides=[f"{LR}=1e-3", f"{ENC}.norm=pre",
                                       "training.jit_compile=true", "data.corpus=synthetic"])
    assert cfg.model.d_model == 64 and cfg.training.schedule.transformer.scale == 1e-3
    assert cfg.model.encoder.transformer.norm == "pre" and cfg.training.jit_compile is True
    assert isinstance(cfg.training.schedule.get().scale, float)


_T = "model:\n  encoder:\n    transformer:\n"  # the encoder's options start on line 4


@pytest.mark.parametrize("text,override,fragment", [
    ("model:\n  d_modle: 64\n", (), "c.yaml:2: model.d_modle: unknown key"),
    ("modle:\n  d_model: 64\n", (), "c.yaml:1: modle: unknown key"),
    ("model:\n  d_model: abc\n", (), "c.yaml:2: model.d_model: expected int"),
    ("model:\n  d_model: true\n", (), "model.d_model: expected int"),
    (_T + "      residual_dropout: -0.1\n", (),
     f"c.yaml:4: {ENC}.residual_dropout: -0.1 is out of range"),
    ("model:\n  d_model: 100\n  encoder:\n    transformer:\n      num_heads: 8\n", (),
     f"c.yaml:5: {ENC}.num_heads: 8 does not divide"),
    (_T + "      norm: middle\n", (), f"c.yaml:4: {ENC}.norm: 'middle' is not one of pre, post"),
    ("training:\n  schedule:\n    transformer:\n      scale: 0\n", (),
     f"{LR}: 0.0 is out of range"),
    ("", (f"{ENC}.num_layers=0",), f"--override: {ENC}.num_layers: 0 is out of range"),
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
    _write(tmp_path, "model:\n  d_model: 64\n  encoder:\n    transformer:\n"
                     "      num_heads: 4\n", "base.yaml")
    child = _write(tmp_path, "base: base.yaml\n" + _T + "      num_layers: 2\n", "child.yaml")
    cfg = load_config(child)
    assert (cfg.model.d_model, cfg.model.encoder.transformer.num_heads,
            cfg.model.encoder.transformer.num_layers) == (64, 4, 2)
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
    for key in ("model.d_model", f"{ENC}.num_heads", f"{ENC}.ffn_dim", f"{ENC}.num_layers",
                "model.decoder.transformer.num_layers", f"{ENC}.norm", "model.encoder.type",
                "model.encoder.rnmt_plus.units", "model.decoder.rnmt_plus.attention_heads",
                "model.encoder.cascaded.stages", "model.encoder.multi_column.columns",
                "data.train_source", "data.train_target", "data.dev_source", "data.dev_target",
                "data.vocab", "training.train_steps", "training.batch_tokens",
                "training.schedule.type", LR, "training.schedule.inverse_sqrt.learning_rate"):
        assert key in keys
    assert all(help_ for _, _, help_ in rows)


def test_config_reference_is_current():
    from deep_nmt_tf.config import config_reference_markdown

    path = os.path.join(ROOT, "docs", "CONFIG.md")
    assert open(path, encoding="utf-8").read() == config_reference_markdown(), (
        "docs/CONFIG.md is stale: python -m deep_nmt_tf.config > docs/CONFIG.md")


# --------------------------------------------------------------------------------------------
# One-of sections (the 0.1 layout: tests/test_config_legacy.py)
# --------------------------------------------------------------------------------------------


def test_one_of_selects_its_section_and_refuses_the_keys_of_another_type(tmp_path):
    cfg = load_config(_write(tmp_path, "model:\n  encoder:\n    type: rnmt_plus\n"
                                       "    rnmt_plus:\n      units: 32\n"),
                      overrides=["model.tie_source_target_embeddings=false"])
    assert cfg.model.encoder.type == "rnmt_plus" and cfg.model.encoder.get().units == 32
    path = _write(tmp_path, "model:\n  encoder:\n    type: rnmt_plus\n    transformer:\n"
                            "      num_layers: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: model.encoder.transformer: set, but "
                                          r"model.encoder.type is 'rnmt_plus'"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"--override: model.decoder.rnmt_plus.units: set, "
                                          r"but model.decoder.type is 'transformer'"):
        load_config(None, overrides=["model.decoder.rnmt_plus.units=8"])


def test_a_child_file_may_switch_the_type_its_base_chose(tmp_path):
    _write(tmp_path, _T + "      num_layers: 3\ntraining:\n  schedule:\n    type: "
                          "transformer\n    transformer:\n      scale: 1.0\n", "base.yaml")
    child = _write(tmp_path, "base: base.yaml\nmodel:\n  tie_source_target_embeddings: false\n"
                             "  encoder:\n    type: rnmt_plus\ntraining:\n  schedule:\n"
                             "    type: constant\n", "child.yaml")
    cfg = load_config(child)
    assert cfg.model.encoder.type == "rnmt_plus" and cfg.training.schedule.type == "constant"
    # An override may switch the type a file chose (the file's options are then ignored).
    demo = load_config(os.path.join(ROOT, "configs", "demo.yaml"), overrides=[
        "model.encoder.type=rnmt_plus", "model.tie_source_target_embeddings=false"])
    assert demo.model.encoder.type == "rnmt_plus"


@pytest.mark.parametrize("text,override,fragment", [
    ("", ("model.encoder.type=lstm",), "model.encoder.type: 'lstm' is not a registered "
     "encoder type (known: cascaded, "),
    ("", ("model.encoder.multi_column.columns=[]", "model.encoder.type=multi_column",
          "model.tie_source_target_embeddings=false"),
     "model.encoder.multi_column.columns: a multi-column encoder needs at least one column"),
])
def test_unknown_types_are_named(tmp_path, text, override, fragment):
    """(The keys that moved in 0.2 are named too: tests/test_config_legacy.py.)"""
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text), overrides=override)
    assert fragment in str(err.value)


def test_non_finite_numbers_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"training.schedule.transformer.scale: 'nan' is not a "
                                          r"finite number"):
        load_config(None, overrides=[f"{LR}=nan"])
    with pytest.raises(ConfigError, match=r"c.yaml:2: model.layer_norm_epsilon: inf is not a "
                                          r"finite number"):
        load_config(_write(tmp_path, "model:\n  layer_norm_epsilon: .inf\n"))
