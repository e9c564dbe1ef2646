"""Checkpoints and the resolved config of a model directory.

Checkpoint layout: ``model/variables/<i>`` holds ``model.variables[i]`` (every variable of the
model in Keras' deterministic order: trainable weights, non-trainable ones and the dropout
``SeedGenerator`` states), ``optimizer`` the Keras optimizer (iterations, moments), plus the
trainer's counters.  ``tf.train.Checkpoint(model=keras_model)`` is not used because Keras 3
models do not expose all their sub-layers and seed generators to TensorFlow's object graph (only
some weights would be saved).  Inference code loads weights with :func:`restore_model_weights`
and writes model-only checkpoints (averaging) with :func:`model_checkpoint`.

``MODEL_DIR/`` holds:

- ``config.yaml``: the resolved config (every key, ``model.vocab_size`` filled in), written
  before training starts;
- ``ckpt-N.*`` and ``checkpoint``: ``tf.train.CheckpointManager`` checkpoints (``N`` = step);
- ``train/`` and ``eval/``: TensorBoard event files.

Resuming compares the ``model`` section of ``config.yaml`` with the new config: a changed model
is a :class:`~deep_nmt_tf.config.ConfigError` naming the differing keys (the checkpoint would
not fit, or would silently mean something else).  Other sections may change (e.g. a longer
``training.train_steps``); the changes are logged and ``config.yaml`` is rewritten.

Under ``MultiWorkerMirroredStrategy`` every worker must take part in saving; non-chief workers
write to a temporary directory that is deleted afterwards (the ``tf.distribute`` recipe).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import tensorflow as tf
import yaml
from absl import logging

from deep_nmt_tf.config import Config, ConfigError, config_from_dict, config_to_dict, save_config

__all__ = ["CONFIG_FILENAME", "flatten", "config_differences", "check_config",
           "check_and_save_config",
           "model_trackable", "model_checkpoint", "restore_model_weights", "CheckpointSaver",
           "has_object"]

CONFIG_FILENAME = "config.yaml"


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: Config, new: Config, section: Optional[str] = None) -> List[str]:
    """Dotted keys (``model.d_model`` ...) whose values differ, optionally within one section."""
    a = config_to_dict(old if section is None else getattr(old, section))
    b = config_to_dict(new if section is None else getattr(new, section))
    prefix = f"{section}." if section else ""
    fa, fb = flatten(a, prefix), flatten(b, prefix)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def _load_saved_config(path: str) -> Config:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    try:
        return config_from_dict(data, source=path)
    except ConfigError as e:
        raise ConfigError(f"{path}: the saved config of this model directory is no longer "
                          f"valid ({e}); use a new --model_dir") from None


def check_config(config: Config, model_dir: str) -> Optional[Config]:
    """Checks ``config`` against ``MODEL_DIR/config.yaml``, if there is one.

    ``model.vocab_size: 0`` (not yet read from the vocabulary) matches any saved size, so the
    check can run before the data is prepared; run it again on the resolved config.

    Returns:
      The previously saved config, or None for a new model directory.

    Raises:
      ConfigError: the ``model`` section differs from the saved one (naming the keys, with the
        old and new values).
    """
    path = os.path.join(model_dir, CONFIG_FILENAME)
    if not tf.io.gfile.exists(path):
        return None
    previous = _load_saved_config(path)
    changed = config_differences(previous, config, "model")
    if config.model.vocab_size == 0:
        changed = [k for k in changed if k != "model.vocab_size"]
    if changed:
        old, new = flatten(config_to_dict(previous)), flatten(config_to_dict(config))
        details = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in changed)
        raise ConfigError(
            f"{config.source}: the model config differs from the one this model directory "
            f"was trained with ({path}): {details}. Use a new --model_dir, or restore these "
            f"keys.")
    return previous


def check_and_save_config(config: Config, model_dir: str, write: bool = True) -> Optional[Config]:
    """:func:`check_config`, logs the other changed keys, then saves ``config.yaml``.

    Args:
      config: the resolved config of this run.
      model_dir: the model directory.
      write: whether this process writes (False on non-chief workers).

    Returns:
      The previously saved config, or None for a new model directory.
    """
    previous = check_config(config, model_dir)
    if previous is not None:
        old, new = flatten(config_to_dict(previous)), flatten(config_to_dict(config))
        for k in config_differences(previous, config):
            logging.info("Config change on resume: %s: %r -> %r", k, old.get(k), new.get(k))
    if write:
        tf.io.gfile.makedirs(model_dir)
        save_config(config, os.path.join(model_dir, CONFIG_FILENAME))
    return previous


def model_trackable(model) -> tf.train.Checkpoint:
    """The checkpoint node of a Keras model: all of ``model.variables``, by position."""
    return tf.train.Checkpoint(variables=list(model.variables))


def model_checkpoint(model) -> tf.train.Checkpoint:
    """A checkpoint holding only the model, in the trainer's layout (e.g. averaged weights).

    :func:`restore_model_weights` reads it, as it reads the trainer's checkpoints.
    """
    return tf.train.Checkpoint(model=model_trackable(model))


def restore_model_weights(model, checkpoint: str) -> str:
    """Loads the model weights of a training checkpoint into a built ``model``.

    Args:
      model: the model, built from the same ``model`` config as the checkpoint.
      checkpoint: a checkpoint path (``MODEL_DIR/ckpt-N``) or a model directory (its latest).

    Returns:
      The checkpoint path read.

    Raises:
      FileNotFoundError: no checkpoint there.
      AssertionError / ValueError: the checkpoint does not fit the model.
    """
    path = checkpoint
    if tf.io.gfile.isdir(checkpoint):
        path = tf.train.latest_checkpoint(checkpoint)
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {checkpoint}")
    status = model_checkpoint(model).restore(path)
    status.expect_partial()
    status.assert_existing_objects_matched()
    return path


class CheckpointSaver:
    """A ``tf.train.CheckpointManager`` that also works on non-chief workers.

    Args:
      checkpoint: the ``tf.train.Checkpoint`` (model, optimizer, counters ...).
      model_dir: where the chief writes ``ckpt-N``.
      max_to_keep: checkpoints kept (``training.keep_checkpoints``).
      step_counter: the variable whose value numbers the checkpoints.
      chief: whether this worker is the chief.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, model_dir: str, max_to_keep: int,
                 step_counter: tf.Variable, chief: bool = True):
        self.model_dir = model_dir
        self.chief = chief
        self._max_to_keep = max_to_keep
        self._step_counter = step_counter
        self._directory = model_dir if chief else tempfile.mkdtemp(prefix="deep_nmt_ckpt_")
        self.set_checkpoint(checkpoint)

    def set_checkpoint(self, checkpoint: tf.train.Checkpoint) -> None:
        """Saves ``checkpoint`` from now on (e.g. the same objects plus the data iterator)."""
        self.checkpoint = checkpoint
        self._manager = tf.train.CheckpointManager(checkpoint, self._directory,
                                                   max_to_keep=self._max_to_keep,
                                                   step_counter=self._step_counter)

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The newest checkpoint of ``model_dir`` (read from the chief's directory)."""
        return tf.train.latest_checkpoint(self.model_dir)

    def restore_latest(self) -> Optional[str]:
        """Restores the newest checkpoint of ``model_dir`` if there is one; returns its path.

        Every object of the checkpoint object must find its value (the model and optimizer are
        built first), so a checkpoint of a different model fails loudly; values saved for
        objects that do not exist yet (the data iterator) are left for later.
        """
        path = self.latest_checkpoint
        if path is None:
            return None
        status = self.checkpoint.restore(path)
        status.assert_existing_objects_matched()
        status.expect_partial()
        return path

    def save(self) -> Optional[str]:
        """Writes a checkpoint numbered by the step counter; returns the chief's path."""
        step = int(self._step_counter.numpy())
        path = self._manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self._directory, ignore_errors=True)
            return None
        return path


def has_object(checkpoint_path: str, name: str) -> bool:
    """Whether the checkpoint's root has a child object called ``name``."""
    prefix = name + "/"
    return any(key.startswith(prefix) for key, _ in tf.train.list_variables(checkpoint_path))
