"""Small test models described in the flat vocabulary of deep_nmt_tf 0.1.

Many tests were written when the model config was one flat section (``architecture``,
``encoder_layers``, ``num_heads``, ``dlcl: {encoder: true}``, ``rnmt: {...}``, and
``training.learning_rate`` / ``schedule``).  They keep that compact form for their tiny models;
these helpers translate it with the library's own upgrade of 0.1 run directories
(:func:`deep_nmt_tf.config.legacy.upgrade`), so every such test also exercises the upgrade.
Tests about the config itself use the current keys directly (``tests/test_config.py``).
"""

import dataclasses

from deep_nmt_tf.config import config_from_dict, config_to_dict


def _plain(value):
    if dataclasses.is_dataclass(value):
        return config_to_dict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def flat_config(model=None, training=None, data=None, decoding=None, source="<test>",
                overrides=()):
    """A validated Config from 0.1-style sections (each a dict; dataclass values allowed)."""
    from deep_nmt_tf.config.legacy import upgrade

    tree = {"model": _plain(model or {}), "training": _plain(training or {}),
            "data": _plain(data or {"corpus": "synthetic"}), "decoding": _plain(decoding or {})}
    new, _ = upgrade(tree)
    return config_from_dict(new, source=source, overrides=overrides)


def model_config(**flat):
    """The ``ModelConfig`` of a 0.1-style flat model section."""
    return flat_config(model=flat).model
