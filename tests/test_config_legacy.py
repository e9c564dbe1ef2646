"""The 0.1 config layout (config/legacy.py), kept only to read the run directories of 0.1:
the keys that moved are named with their new place, a 0.1 run's config.yaml upgrades to the
same model and recipe, and the 0.1 form of every tiny model the tests use upgrades to the
current-layout tree they now write (tests/config_trees.py).  The only tests that write the
0.1 layout."""

import os

import pytest

from config_trees import architecture, config, constant, merge, stack, stacks, transformer
from deep_nmt_tf.config import ConfigError, config_from_dict, config_to_dict, load_config
from deep_nmt_tf.config.legacy import is_legacy, upgrade

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("text,override,fragment", [
    ("model:\n  encoder_layers: 12\n", (), "c.yaml:2: model.encoder_layers: this key moved "
     "in deep_nmt_tf 0.2: use model.encoder.<type>.num_layers"),
    ("model:\n  dlcl:\n    encoder: true\n", (), "model.dlcl: this key moved in deep_nmt_tf "
     "0.2: use model.encoder.transformer.dlcl"),
    ("training:\n  learning_rate: 1.0e-3\n", (), "training.learning_rate: this key moved"),
    ("training:\n  schedule: inverse_sqrt\n", (), "training.schedule: is now a section"),
    ("", ("model.num_heads=4",), "--override model.num_heads: this key moved in deep_nmt_tf 0.2: "
     "use model.encoder.transformer.num_heads and model.decoder.transformer.num_heads"),
])
def test_moved_keys_are_named(tmp_path, text, override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text), overrides=override)
    assert fragment in str(err.value)


def test_legacy_run_configs_upgrade_to_the_same_config():
    """A 0.1 run directory's resolved config.yaml translates to the config of the same model
    and recipe (here: the 0.1 form of configs/demo.yaml and of a cascaded hybrid)."""
    old = {"model": {"architecture": "transformer", "vocab_size": 0, "d_model": 128,
                     "num_heads": 4, "ffn_dim": 512, "encoder_layers": 3, "decoder_layers": 3,
                     "norm": "pre", "input_dropout": 0.1, "residual_dropout": 0.1,
                     "relu_dropout": 0.0, "attention_dropout": 0.0,
                     "tie_source_target_embeddings": True, "tie_softmax_embeddings": True,
                     "dlcl": {"encoder": False, "decoder": False},
                     "lexical_shortcuts": {"enabled": False, "placement": "self"}},
           "training": {"schedule": "inverse_sqrt", "learning_rate": 1e-3,
                        "warmup_steps": 300, "warmup_init_lr": 1e-7, "decay_start": 600000,
                        "train_steps": 1500}}
    assert is_legacy(old)
    new, moved = upgrade(old)
    assert "model.architecture" in moved and not is_legacy(new)
    demo = load_config(os.path.join(ROOT, "configs", "demo.yaml"))
    upgraded = config_from_dict(new)
    assert config_to_dict(upgraded.model) == config_to_dict(demo.model)
    assert upgraded.training.schedule == demo.training.schedule
    cascade, _ = upgrade({"model": {"architecture": "cascaded", "d_model": 16, "num_heads": 2,
                                    "encoder_layers": 2, "tie_source_target_embeddings": False,
                                    "hybrid": {"cascade_layers": 3}},
                          "training": {"freeze": ["encoder/rnmt"]}})
    cfg = config_from_dict(cascade)
    stages = cfg.model.encoder.get().stages
    assert [s.type for s in stages] == ["rnmt_plus", "transformer"]
    assert (stages[0].get().num_layers, stages[1].get().num_layers) == (2, 3)
    assert cfg.training.freeze == ("encoder/stages/0",)


def _upgraded(model, training=None):
    """The config of a 0.1 tree (model and training sections) after :func:`upgrade`."""
    old = {"model": model, "training": training or {}, "data": {"corpus": "synthetic"},
           "decoding": {}}
    assert is_legacy(old)
    return config_from_dict(upgrade(old)[0])


_TINY = dict(vocab_size=24, d_model=16, num_heads=2, ffn_dim=32, encoder_layers=1,
             decoder_layers=1, input_dropout=0.0, residual_dropout=0.0)
_TINY_TREE = transformer(24, 16, num_heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1,
                         input_dropout=0.0, residual_dropout=0.0)
_RNMT = {"encoder_units": 8, "decoder_units": 16, "attention_heads": 2, "attention_dim": 16}
_ENCODER = {"transformer": {"num_layers": 2, "num_heads": 2, "ffn_dim": 32,
                            "input_dropout": 0.0, "residual_dropout": 0.0},
            "rnmt_plus": {"num_layers": 2, "units": 8, "embedding_dropout": 0.0,
                          "dropout": 0.0}}
_DECODER = {"transformer": dict(_ENCODER["transformer"], num_layers=1),
            "rnmt_plus": {"num_layers": 1, "units": 16, "embedding_dropout": 0.0, "dropout": 0.0,
                          "attention_dropout": 0.0, "attention_heads": 2, "attention_dim": 16}}


@pytest.mark.parametrize("old,current", [
    # The tiny Transformer with the three deep methods.
    (dict(_TINY, encoder_layers=2, transparent_attention={"enabled": True},
          dlcl={"decoder": True, "window": 2}, lexical_shortcuts={"enabled": True}),
     merge(_TINY_TREE, {"transparent_attention": {"enabled": True}},
           stacks({"lexical_shortcuts": {"enabled": True}}, encoder={"num_layers": 2,
                                                                   "dlcl": {"window": 2}},
                  decoder={"dlcl": {"enabled": True, "window": 2}}))),
    # Cross-attention shortcuts are the decoder's alone.
    (dict(_TINY, lexical_shortcuts={"enabled": True, "placement": "cross",
                                    "variant": "feature_fusion"}),
     merge(_TINY_TREE, stacks({"lexical_shortcuts": {"variant": "feature_fusion"}},
                              decoder={"lexical_shortcuts": {"enabled": True,
                                                             "placement": "cross"}}))),
    # Untied softmax.
    (dict(_TINY, tie_source_target_embeddings=False, tie_softmax_embeddings=False),
     merge(_TINY_TREE, {"tie_source_target_embeddings": False},
           stacks(decoder={"tie_softmax": False}))),
] + [
    # Every architecture: RNMT+ stacks, hybrids (the cascade's second stage: 1 layer).
    (dict(_TINY, architecture=name, encoder_layers=2, tie_source_target_embeddings=False,
          rnmt=_RNMT, hybrid={"cascade_layers": 1, "columns": ["rnmt_plus", "transformer"]}),
     merge(_TINY_TREE, {"tie_source_target_embeddings": False},
           architecture(name, _ENCODER, _DECODER)))
    for name in ("rnmt_plus", "transformer_rnmt", "rnmt_transformer", "cascaded",
                 "multi_column")
], ids=["deep_methods", "cross_shortcuts", "untied", "rnmt_plus", "transformer_rnmt",
        "rnmt_transformer", "cascaded", "multi_column"])
def test_the_0_1_layout_of_a_model_upgrades_to_its_current_tree(old, current):
    assert config_to_dict(_upgraded(old).model) == config_to_dict(config(current).model)


@pytest.mark.parametrize("old,current", [
    (dict(schedule="constant", learning_rate=3e-3, warmup_steps=0), constant(3e-3)),
    (dict(schedule="transformer", learning_rate=2.0, warmup_steps=8),
     {"type": "transformer", "transformer": {"scale": 2.0, "warmup_steps": 8}}),
    (dict(schedule="inverse_sqrt", learning_rate=1e-3, warmup_steps=8, warmup_init_lr=1e-6),
     {"type": "inverse_sqrt", "inverse_sqrt": {"learning_rate": 1e-3, "warmup_steps": 8,
                                               "warmup_init_lr": 1e-6}}),
    (dict(schedule="rnmt_plus", learning_rate=1e-4, warmup_steps=500, decay_start=600000,
          decay_end=1200000, min_learning_rate=5e-5),
     stack("rnmt_plus", learning_rate=1e-4, warmup_steps=500, decay_start=600000,
           decay_end=1200000, min_learning_rate=5e-5)),
], ids=["constant", "transformer", "inverse_sqrt", "rnmt_plus"])
def test_the_0_1_schedules_upgrade_to_their_sections(old, current):
    upgraded = _upgraded(dict(_TINY), old).training.schedule
    assert upgraded == config(_TINY_TREE, {"schedule": current}).training.schedule
