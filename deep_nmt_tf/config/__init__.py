"""Typed configuration: one tree of dataclasses, loaded from YAML, validated before any work.

Modules (by concern):

- :mod:`~deep_nmt_tf.config.fields`: declared keys (:func:`field`), registries and one-of
  sections (:class:`OneOf`);
- :mod:`~deep_nmt_tf.config.model_schema` and :mod:`~deep_nmt_tf.config.schema`: the tree
  (``model``, ``data``, ``training``, ``decoding``), every key with its default and meaning;
- :mod:`~deep_nmt_tf.config.loading`: YAML with ``base:`` includes, ``--override``, building and
  saving the tree;
- :mod:`~deep_nmt_tf.config.rules`: every check between keys;
- :mod:`~deep_nmt_tf.config.legacy`: keys that moved, and the upgrade of old run directories;
- :mod:`~deep_nmt_tf.config.reference`: ``docs/CONFIG.md``.

Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the file, the
line and the dotted key, e.g.::

    configs/demo.yaml:12: model.encoder.transformer.num_heads: 6 does not divide model.d_model=128

Example:
    >>> from deep_nmt_tf.config import load_config
    >>> cfg = load_config("configs/demo.yaml", overrides=["training.train_steps=10"])
    >>> cfg.model.encoder.type, cfg.model.encoder.get().num_layers
    ('transformer', 3)

No TensorFlow or Keras is imported here.
"""

from deep_nmt_tf.config.fields import ConfigError, OneOf, Registry, field, operational_keys
from deep_nmt_tf.config.loading import (config_from_dict, config_to_dict, load_config,
                                        save_config)
from deep_nmt_tf.config.model_schema import (DECODER_TYPES, ENCODER_TYPES,
                                             CascadedEncoderOptions, DecoderConfig,
                                             DecoderShortcutOptions, DLCLOptions,
                                             EncoderConfig, EncoderShortcutOptions, ModelConfig,
                                             MultiColumnEncoderOptions, RNMTPlusDecoderOptions,
                                             RNMTPlusEncoderOptions, TransformerDecoderOptions,
                                             TransformerEncoderOptions,
                                             TransparentAttentionConfig)
from deep_nmt_tf.config.reference import config_reference_markdown, describe_config
from deep_nmt_tf.config.rules import (SearchOptionsError, check_search_options, component_types,
                                      corpus_name)
from deep_nmt_tf.config.schema import (SCHEDULE_TYPES, TOKENIZER_TYPES, AdaptiveClippingConfig,
                                       Config, ConstantScheduleOptions, CorpusConfig,
                                       DataConfig, DecodingConfig, InverseSqrtScheduleOptions,
                                       RNMTPlusScheduleOptions, ScheduleConfig,
                                       SentencePieceOptions, TokenizerConfig, TrainingConfig,
                                       TransformerScheduleOptions, WarmStartConfig,
                                       WordPieceOptions)

__all__ = [
    "ConfigError", "OneOf", "Registry", "field", "operational_keys", "SearchOptionsError",
    "check_search_options",
    "Config", "ModelConfig", "DataConfig", "TrainingConfig", "DecodingConfig",
    "EncoderConfig", "DecoderConfig", "ScheduleConfig",
    "ENCODER_TYPES", "DECODER_TYPES", "SCHEDULE_TYPES", "TOKENIZER_TYPES",
    "TokenizerConfig", "WordPieceOptions", "SentencePieceOptions", "CorpusConfig",
    "TransformerEncoderOptions", "TransformerDecoderOptions", "RNMTPlusEncoderOptions",
    "RNMTPlusDecoderOptions", "CascadedEncoderOptions", "MultiColumnEncoderOptions",
    "DLCLOptions", "EncoderShortcutOptions", "DecoderShortcutOptions",
    "TransparentAttentionConfig", "AdaptiveClippingConfig", "WarmStartConfig",
    "TransformerScheduleOptions", "InverseSqrtScheduleOptions", "ConstantScheduleOptions",
    "RNMTPlusScheduleOptions",
    "load_config", "config_from_dict", "config_to_dict", "save_config",
    "require_training_data", "describe_config", "config_reference_markdown",
    "component_types", "corpus_name",
]


def require_training_data(cfg: Config):
    """Raises :class:`ConfigError` (naming key and file) if no training corpus is configured.

    Checked by the training tools before any work, not at load time, so that a config file
    describing only a model (e.g. ``configs/transformer_base.yaml``) loads and builds.
    """
    d = cfg.data
    if d.corpus == "files" and not d.train:
        for key in ("train_source", "train_target"):
            if not getattr(d, key):
                raise ConfigError(f"{cfg.source}: data.{key}: required when data.corpus is "
                                  f"'files' (give --override=data.{key}=PATH, list corpora "
                                  f"under data.train, or set data.corpus: synthetic)")
