"""``tf.data`` options of the package's pipelines, and the config's autotuning choice applied
to a dataset built elsewhere (a custom trainer's).

Only TensorFlow is imported here (not the tokenizers), so the training loop can apply
``data.autotune`` without loading the input pipeline's modules.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["pipeline_options", "default_autotune"]


def pipeline_options(data) -> tf.data.Options:
    """The options of the package's pipelines: deterministic order (parallel map calls
    included) and tf.data's autotuning model as ``data.autotune`` says (off: no model thread;
    see the config key)."""
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = bool(data.autotune)
    return options


def default_autotune(dataset: tf.data.Dataset, enabled: bool) -> tf.data.Dataset:
    """``dataset`` with tf.data's autotuning model set to ``enabled`` (``data.autotune``)
    unless the dataset sets it itself.

    The runner applies it to the datasets a trainer builds (the package's own pipelines set it
    already), so a custom trainer's ``tf.data`` pipeline gets the config's choice too.
    """
    if dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = bool(enabled)
    return dataset.with_options(options)
