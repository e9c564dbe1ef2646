"""The checkpoint format: what a checkpoint holds, and reading and writing it (TensorFlow).

Layout: ``model/variables/<i>`` holds ``model.variables[i]`` (every variable of the model in
Keras' deterministic order: trainable weights, non-trainable ones and the dropout
``SeedGenerator`` states).  A training checkpoint adds ``optimizer`` (the Keras optimizer:
iterations, moments), the trainer's counters (``step``, ``skipped_updates``,
``data_position``), the gradient transforms' state (``transform_<i>_<name>``) and, if asked,
the ``tf.data`` iterator (``data_iterator``).  ``tf.train.Checkpoint(model=keras_model)`` is
not used because Keras 3 models do not expose all their sub-layers and seed generators to
TensorFlow's object graph (only some weights would be saved).

Inference code loads weights with :func:`restore_model_weights` (training and model-only
checkpoints alike) and writes model-only checkpoints (averaging) with :func:`model_checkpoint`.
Checkpoints are named ``ckpt-N`` (``N`` = step) and listed in the directory's ``checkpoint``
file (``tf.train.CheckpointManager``); :func:`list_checkpoints` and :func:`latest_checkpoint`
read it.  Where a run directory keeps them is :mod:`deep_nmt_tf.run_dir`'s business.

Under ``MultiWorkerMirroredStrategy`` every worker must take part in saving; non-chief workers
write to a temporary directory that is deleted afterwards (the ``tf.distribute`` recipe,
:class:`CheckpointSaver`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import List, Optional

import tensorflow as tf

__all__ = ["model_trackable", "model_checkpoint", "restore_model_weights", "checkpoint_step",
           "latest_checkpoint", "list_checkpoints", "has_object", "CheckpointSaver"]


def model_trackable(model) -> tf.train.Checkpoint:
    """The checkpoint node of a Keras model: all of ``model.variables``, by position."""
    return tf.train.Checkpoint(variables=list(model.variables))


def model_checkpoint(model) -> tf.train.Checkpoint:
    """A checkpoint holding only the model, in the trainer's layout (e.g. averaged weights).

    :func:`restore_model_weights` reads it, as it reads the trainer's checkpoints.
    """
    return tf.train.Checkpoint(model=model_trackable(model))


def checkpoint_step(path: str) -> int:
    """``N`` of a ``.../ckpt-N`` prefix (-1 if the name has no number)."""
    try:
        return int(path.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest checkpoint that ``DIRECTORY/checkpoint`` names, or None."""
    return tf.train.latest_checkpoint(directory)


def list_checkpoints(directory: str) -> List[str]:
    """All checkpoints that ``DIRECTORY/checkpoint`` lists and that exist, oldest first (by
    step)."""
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    paths = [p if os.path.isabs(p) else os.path.join(directory, p) for p in paths]
    paths = [p for p in paths if tf.io.gfile.exists(p + ".index")]
    return sorted(set(paths), key=checkpoint_step)


def restore_model_weights(model, checkpoint: str) -> str:
    """Loads the model weights of a training (or model-only) checkpoint into a built ``model``.

    Optimizer slots and counters are ignored; every model variable must be found.

    Args:
      model: the model, built from the same ``model`` config as the checkpoint.
      checkpoint: a checkpoint path (``MODEL_DIR/ckpt-N``) or a directory (its latest).

    Returns:
      The checkpoint path read.

    Raises:
      FileNotFoundError: no checkpoint there.
      AssertionError / ValueError: the checkpoint does not fit the model.

    Checkpoints hold float32 weights (mixed-precision training keeps float32 variables); a
    model built with a half-precision inference policy (``bfloat16``/``float16`` variables,
    :func:`deep_nmt_tf.models.build_model`) gets them rounded to its variables' dtype.
    """
    path = checkpoint
    if tf.io.gfile.isdir(checkpoint):
        path = latest_checkpoint(checkpoint)
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {checkpoint}")
    if any(v.dtype in ("bfloat16", "float16") for v in model.variables):
        _restore_cast(model, path)
        return path
    status = model_checkpoint(model).restore(path)
    status.expect_partial()
    status.assert_existing_objects_matched()
    return path


def _restore_cast(model, path: str) -> None:
    """Reads every ``model/variables/<i>`` of ``path`` and assigns it, cast to the variable's
    dtype (a plain restore refuses a dtype change)."""
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    for i, variable in enumerate(model.variables):
        key = f"model/variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"
        if key not in shapes:
            raise AssertionError(f"{path} has no value for model variable {i} "
                                 f"({getattr(variable, 'path', variable.name)})")
        if list(shapes[key]) != list(variable.shape):
            raise ValueError(f"{path}: model variable {i} "
                             f"({getattr(variable, 'path', variable.name)}) has shape "
                             f"{shapes[key]} in the checkpoint, {list(variable.shape)} in the "
                             "model")
        variable.assign(tf.cast(reader.get_tensor(key), variable.dtype))


def has_object(checkpoint_path: str, name: str) -> bool:
    """Whether the checkpoint's root has a child object called ``name``."""
    prefix = name + "/"
    return any(key.startswith(prefix) for key, _ in tf.train.list_variables(checkpoint_path))


class CheckpointSaver:
    """A ``tf.train.CheckpointManager`` that also works on non-chief workers.

    Args:
      checkpoint: the ``tf.train.Checkpoint`` (model, optimizer, counters ...).
      directory: where the chief writes ``ckpt-N``.
      max_to_keep: checkpoints kept (``training.keep_checkpoints``).
      step_counter: the variable whose value numbers the checkpoints.
      chief: whether this worker is the chief.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, max_to_keep: int,
                 step_counter: tf.Variable, chief: bool = True):
        self.directory = directory
        self.chief = chief
        self._max_to_keep = max_to_keep
        self._step_counter = step_counter
        self._write_directory = directory if chief else tempfile.mkdtemp(
            prefix="deep_nmt_ckpt_")
        self.set_checkpoint(checkpoint)

    def set_checkpoint(self, checkpoint: tf.train.Checkpoint) -> None:
        """Saves ``checkpoint`` from now on (e.g. the same objects plus the data iterator)."""
        self.checkpoint = checkpoint
        self._manager = tf.train.CheckpointManager(checkpoint, self._write_directory,
                                                   max_to_keep=self._max_to_keep,
                                                   step_counter=self._step_counter)

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The newest checkpoint of ``directory`` (read from the chief's directory)."""
        return latest_checkpoint(self.directory)

    def restore_latest(self) -> Optional[str]:
        """Restores the newest checkpoint of ``directory`` if there is one; returns its path.

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
            shutil.rmtree(self._write_directory, ignore_errors=True)
            return None
        return path
