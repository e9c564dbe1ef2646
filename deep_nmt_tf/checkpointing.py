"""The ``ckpt-N`` checkpoint format of the custom loop: what a checkpoint holds, and reading,
checking and writing it (TensorFlow).

This is one of the two formats of a run directory's checkpoint store
(:class:`deep_nmt_tf.checkpoints.CheckpointStore`, which lists, chooses, resolves and restores
checkpoints of both kinds; the other is ``fit``'s ``ckpt-N.weights.h5``).

Layout: ``model/variables/<i>`` holds ``model.variables[i]`` (every variable of the model in
Keras' deterministic order: trainable weights, non-trainable ones and the dropout
``SeedGenerator`` states).  A training checkpoint adds ``optimizer`` (the Keras optimizer:
iterations, moments), the trainer's counters (``step``, ``skipped_updates``,
``data_position``), the gradient transforms' state (``transform_<i>_<name>``) and, if asked,
the ``tf.data`` iterator (``data_iterator``).  ``tf.train.Checkpoint(model=keras_model)`` is
not used because Keras 3 models do not expose all their sub-layers and seed generators to
TensorFlow's object graph (only some weights would be saved).

:func:`restore_model_weights` loads the model weights of one checkpoint (training and
model-only checkpoints alike; a checkpoint of another model is refused naming the first
variable that does not fit); :func:`model_checkpoint` writes model-only checkpoints
(averaging).
Checkpoints are named ``ckpt-N`` (``N`` = step) and listed in the directory's ``checkpoint``
file (``tf.train.CheckpointManager``).  Where a run directory keeps them is
:mod:`deep_nmt_tf.run_dir`'s business.

Damaged checkpoints.  :func:`find_checkpoints` lists the checkpoints of a directory from its
``checkpoint`` file *and* from the ``ckpt-N.index`` files present (the ``checkpoint`` file may
be empty, unreadable or name files that are gone); :func:`checkpoint_problem` tells what is
wrong with one (missing ``.index`` or ``.data`` files, an index that does not parse, a truncated
data file or a checksum mismatch: every tensor is read).  The store picks the newest checkpoint
without a problem (skipping the others with a WARNING); a resumed training run starts from it,
the skipped checkpoints' files renamed to ``<file>.unreadable`` (kept, never deleted:
:func:`set_aside`), and :meth:`CheckpointSaver.restore` rewrites the ``checkpoint`` file to list
only the valid checkpoints up to the resumed one, so that the rotation of
``tf.train.CheckpointManager`` never deletes a checkpoint newer than the one it resumed from.

Under ``MultiWorkerMirroredStrategy`` every worker must take part in saving; non-chief workers
write to a temporary directory that is deleted afterwards (the ``tf.distribute`` recipe,
:class:`CheckpointSaver`), and only the chief repairs the chief's directory.

A full disk.  ``tf.train.Checkpoint`` writes ``ckpt-N_temp/part-*`` (through ``*.tempstate*``
files), merges them into ``ckpt-N.index`` and renames the ``.data-*`` shards beside it, then
rewrites the ``checkpoint`` file (through ``checkpoint.tmp<hex>``); a write that fails for
space leaves some of these (an empty ``_temp`` directory, a complete shard without an index, an
empty ``ckpt-N.index`` ...).  :meth:`CheckpointSaver.save` then removes them
(:func:`remove_partial`: a whole ``ckpt-N`` is kept, the rotation may have deleted the oldest
one already) and raises the store's :class:`~deep_nmt_tf.checkpoints.disk.DiskFullError`,
naming the last intact checkpoint, which a rerun resumes from.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from typing import List, Optional, Sequence

import tensorflow as tf
from absl import logging

from deep_nmt_tf.checkpoints.disk import DiskFullError, free_bytes, is_disk_full
from deep_nmt_tf.run_dir import (CHECKPOINT_PREFIX, CHECKPOINT_STATE_FILENAME, UNREADABLE_SUFFIX,
                                 CheckpointError, checkpoint_step, set_aside_files)

__all__ = ["CheckpointError", "model_trackable", "model_checkpoint", "restore_model_weights",
           "model_variable_key", "check_model_checkpoint", "checkpoint_step", "list_checkpoints",
           "find_checkpoints", "checkpoint_files", "checkpoint_problem", "set_aside",
           "remove_partial", "object_names", "has_object", "CheckpointSaver"]

_STATE_FILE = CHECKPOINT_STATE_FILENAME
_PREFIX = CHECKPOINT_PREFIX
_MODEL_KEY = re.compile(r"^model/variables/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$")


def model_variable_key(index: int) -> str:
    """The checkpoint key of ``model.variables[index]`` (trainer and averaged checkpoints)."""
    return f"model/variables/{index}/.ATTRIBUTES/VARIABLE_VALUE"


def model_trackable(model) -> tf.train.Checkpoint:
    """The checkpoint node of a Keras model: all of ``model.variables``, by position."""
    return tf.train.Checkpoint(variables=list(model.variables))


def model_checkpoint(model) -> tf.train.Checkpoint:
    """A checkpoint holding only the model, in the trainer's layout (e.g. averaged weights).

    :func:`restore_model_weights` reads it, as it reads the trainer's checkpoints.
    """
    return tf.train.Checkpoint(model=model_trackable(model))


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    lines = [line for line in text.splitlines() if line.strip() and "{{" not in line]
    return (lines[0] if lines else text.splitlines()[0]).strip()


# ---------------------------------------------------------------------------------------------
# Finding and checking checkpoints
# ---------------------------------------------------------------------------------------------


def _listed_checkpoints(directory: str) -> List[str]:
    """The prefixes the ``checkpoint`` file lists ([] when it is missing, empty or unreadable)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (ValueError, tf.errors.OpError) as e:
        logging.warning("%s: unreadable (%s); looking for the checkpoint files themselves",
                        os.path.join(directory, _STATE_FILE), _first_line(e))
        return []
    if state is None:
        return []
    # get_checkpoint_state has already joined relative entries to ``directory`` (joining again
    # doubled a relative run directory: runs/demo/runs/demo/ckpt-N, "missing").
    return [p for p in list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
            if p]


def find_checkpoints(directory: str) -> List[str]:
    """Every checkpoint of ``directory``, oldest first (by step): the ones its ``checkpoint``
    file lists (even if their files are gone) and every ``ckpt-N.index`` present."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = {os.path.normpath(p) for p in _listed_checkpoints(directory)}
    for index in tf.io.gfile.glob(os.path.join(directory, f"{_PREFIX}-*.index")):
        found.add(os.path.normpath(index[:-len(".index")]))
    return sorted(found, key=lambda p: (checkpoint_step(p), p))


def checkpoint_files(path: str) -> List[str]:
    """The files of checkpoint ``path`` that exist (``.index`` and ``.data-*``)."""
    return sorted(glob.glob(glob.escape(path) + ".index") +
                  glob.glob(glob.escape(path) + ".data-*-of-*"))


def checkpoint_problem(path: str) -> Optional[str]:
    """What prevents reading checkpoint ``path`` (naming the file at fault), or None.

    Reads every tensor, so a truncated data file or a checksum mismatch is found.
    """
    index = path + ".index"
    if not tf.io.gfile.exists(index):
        return f"{index} is missing"
    try:
        reader = tf.train.load_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - TF raises several types for a damaged index
        return f"{index} is unreadable ({_first_line(e)})"
    shards = glob.glob(glob.escape(path) + ".data-*-of-*")
    expected = {re.search(r"-of-(\d+)$", s).group(1) for s in shards}
    if not shards or len(expected) != 1 or len(shards) != int(expected.pop()):
        return f"{path}.data-* files are missing ({len(shards)} found)"
    data = shards[0] if len(shards) == 1 else f"{path}.data-*"
    try:
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf.variant:
                reader.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - truncated (IndexError), checksum (DataLoss) ...
        return f"{data} is damaged ({_first_line(e)})"
    return None


def list_checkpoints(directory: str) -> List[str]:
    """All checkpoints of ``directory`` whose ``.index`` exists, oldest first (by step)."""
    return [p for p in find_checkpoints(directory) if tf.io.gfile.exists(p + ".index")]


def set_aside(path: str) -> List[str]:
    """Renames the files of a damaged checkpoint to ``<file>.unreadable`` (a free name);
    returns the new names."""
    return set_aside_files(checkpoint_files(path))


def remove_partial(path: str) -> List[str]:
    """Removes what a failed save of checkpoint ``path`` (``DIR/ckpt-N``) left (module
    docstring): its ``.index`` and ``.data-*`` files unless they make a whole checkpoint (the
    save failed after them, on the ``checkpoint`` file, possibly after the rotation deleted
    the oldest: then ``path`` is the last intact checkpoint), ``ckpt-N_temp/``, and in ``DIR``
    every other ``ckpt-*_temp/`` directory and ``*.tempstate*`` file (leftovers of a save that
    was killed: never part of a checkpoint); then the ``checkpoint`` file is rewritten to list
    the checkpoints present if it lists others.  Returns the removed names."""
    directory = os.path.dirname(path) or "."
    names = []
    if checkpoint_problem(path) is not None:
        names += glob.glob(glob.escape(path) + ".index*") + glob.glob(glob.escape(path) +
                                                                      ".data-*")
    names += glob.glob(os.path.join(glob.escape(directory), f"{_PREFIX}-*_temp"))
    names += glob.glob(os.path.join(glob.escape(directory), "*.tempstate*"))
    removed = []
    for name in sorted(set(names)):
        if UNREADABLE_SUFFIX in name:  # (A damaged checkpoint of that step, set aside: kept.)
            continue
        if os.path.isdir(name):
            shutil.rmtree(name, ignore_errors=True)
        elif os.path.exists(name):
            os.remove(name)
        removed.append(name)
    state, present = os.path.join(directory, _STATE_FILE), list_checkpoints(directory)
    try:
        if present:
            _repair_state(directory, present)
        elif os.path.exists(state):  # (It lists only the failed checkpoint.)
            os.remove(state)
    except OSError as e:  # (Still no space: a resume skips the missing entries, WARNING.)
        logging.warning("Cannot rewrite %s (%s)", state, e)
        for name in glob.glob(glob.escape(state) + ".tmp*"):
            os.remove(name)
    return removed


def _repair_state(directory: str, keep: Sequence[str]) -> None:
    """Rewrites ``DIRECTORY/checkpoint`` to list ``keep`` if it lists other checkpoints."""
    listed = {os.path.normpath(p) for p in _listed_checkpoints(directory)}
    if listed != {os.path.normpath(p) for p in keep}:
        write_checkpoint_state(directory, keep)


def write_checkpoint_state(directory: str, paths: Sequence[str]) -> None:
    """Rewrites ``DIRECTORY/checkpoint`` to list ``paths`` (oldest first; set aside if empty),
    with their files' times as timestamps, so that ``tf.train.CheckpointManager`` rotates them
    as usual."""
    state = os.path.join(directory, _STATE_FILE)
    if not paths:
        if os.path.exists(state):
            os.replace(state, state + UNREADABLE_SUFFIX)
        return
    names = [json.dumps(os.path.relpath(p, directory)) for p in paths]
    lines = [f"model_checkpoint_path: {names[-1]}"]
    lines += [f"all_model_checkpoint_paths: {n}" for n in names]
    lines += [f"all_model_checkpoint_timestamps: {os.path.getmtime(p + '.index')!r}"
              for p in paths]
    lines.append("last_preserved_timestamp: 0.0")
    tmp = f"{state}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, state)


# ---------------------------------------------------------------------------------------------
# Model weights
# ---------------------------------------------------------------------------------------------


def _describe(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def check_model_checkpoint(model, path: str, rounded: bool = False) -> None:
    """Raises :class:`CheckpointError` naming the first model variable that the checkpoint does
    not hold with the same shape and dtype (before any value is restored, so a checkpoint of
    another model gives one clear message instead of a failed partial restore).  ``rounded``:
    a ``bfloat16``/``float16`` model variable may be ``float32`` in the checkpoint."""
    reader = tf.train.load_checkpoint(path)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    saved = {}
    for key, shape in shapes.items():
        match = _MODEL_KEY.match(key)
        if match:
            saved[int(match.group(1))] = (tuple(shape), dtypes[key])
    variables = list(model.variables)
    for i, variable in enumerate(variables):
        if i not in saved:
            raise CheckpointError(
                f"{path} does not fit this model: it holds {len(saved)} model variables, the "
                f"model has {len(variables)} (the first one missing: variable {i}, "
                f"{_describe(variable)}); it is a checkpoint of another model")
        shape, dtype = saved[i]
        want_shape, want_dtype = tuple(variable.shape), tf.as_dtype(variable.dtype)
        if rounded and dtype == tf.float32 and want_dtype in (tf.bfloat16, tf.float16):
            dtype = want_dtype
        if shape != want_shape or dtype != want_dtype:
            raise CheckpointError(
                f"{path} does not fit this model: variable {i} ({_describe(variable)}) is "
                f"{want_dtype.name}{list(want_shape)} in the model but "
                f"{dtype.name}{list(shape)} in the checkpoint; it is a checkpoint of another "
                "model")
    if len(saved) > len(variables):
        raise CheckpointError(f"{path} does not fit this model: it holds {len(saved)} model "
                              f"variables, the model has {len(variables)}; it is a checkpoint "
                              "of another model")


def restore_model_weights(model, checkpoint: str) -> str:
    """Loads the model weights of a training (or model-only) checkpoint into a built ``model``.

    Optimizer slots and counters are ignored; every model variable must be found.

    Args:
      model: the model, built from the same ``model`` config as the checkpoint.
      checkpoint: a checkpoint prefix (``MODEL_DIR/ckpt-N``).  (A run directory, or a
        ``.weights.h5`` of ``fit``: :meth:`deep_nmt_tf.checkpoints.CheckpointStore.
        restore_model`.)

    Returns:
      The checkpoint path read.

    Raises:
      FileNotFoundError: no such checkpoint (the message lists the directory's checkpoints).
      CheckpointError: the checkpoint is damaged, or does not fit the model (naming the first
        variable that differs).

    Checkpoints hold float32 weights (mixed-precision training keeps float32 variables); a
    model built with a half-precision inference policy (``bfloat16``/``float16`` variables,
    :func:`deep_nmt_tf.models.build_model`) gets them rounded to its variables' dtype.
    """
    path = os.fspath(checkpoint)
    if not tf.io.gfile.exists(path + ".index"):
        if tf.io.gfile.isdir(path):
            raise FileNotFoundError(f"{path} is a directory, not a checkpoint (the store picks "
                                    "one: deep_nmt_tf.checkpoints.CheckpointStore)")
        directory = os.path.dirname(path) or "."
        known = ", ".join(os.path.basename(p) for p in list_checkpoints(directory)) or "none"
        raise FileNotFoundError(f"{path}: no such checkpoint ({path}.index not found; "
                                f"checkpoints in {directory}: {known})")
    problem = checkpoint_problem(path)
    if problem:
        raise CheckpointError(f"checkpoint {path} cannot be read: {problem}")
    rounded = any(v.dtype in ("bfloat16", "float16") for v in model.variables)
    # Every model variable is there, same shape and dtype (float32 for a rounded one).
    check_model_checkpoint(model, path, rounded=rounded)
    if rounded:
        _restore_cast(model, path)
    else:
        model_checkpoint(model).restore(path).expect_partial()
    return path


def _restore_cast(model, path: str) -> None:
    """Assigns every ``model/variables/<i>`` of ``path`` (checked by
    :func:`check_model_checkpoint`) cast to the variable's dtype (a plain restore refuses a
    dtype change)."""
    reader = tf.train.load_checkpoint(path)
    for i, variable in enumerate(model.variables):
        key = model_variable_key(i)
        variable.assign(tf.cast(reader.get_tensor(key), variable.dtype))


def object_names(checkpoint_path: str) -> set:
    """The names of the checkpoint root's child objects (one read of its index)."""
    return {key.split("/", 1)[0] for key, _ in tf.train.list_variables(checkpoint_path)}


def has_object(checkpoint_path: str, name: str) -> bool:
    """Whether the checkpoint's root has a child object called ``name``."""
    return name in object_names(checkpoint_path)


# ---------------------------------------------------------------------------------------------
# Training checkpoints
# ---------------------------------------------------------------------------------------------


class CheckpointSaver:
    """A ``tf.train.CheckpointManager`` that also works on non-chief workers, and restores the
    resume point (module docstring); made by :meth:`deep_nmt_tf.checkpoints.CheckpointStore.
    saver`.

    Args:
      checkpoint: the ``tf.train.Checkpoint`` (model, optimizer, counters ...).
      directory: where the chief writes ``ckpt-N``.
      max_to_keep: checkpoints kept (``training.keep_checkpoints``).
      step_counter: the variable whose value numbers the checkpoints.
      chief: whether this worker is the chief.
      store: the run directory's :class:`~deep_nmt_tf.checkpoints.CheckpointStore` (the
        store's :meth:`~deep_nmt_tf.checkpoints.CheckpointStore.saver` passes itself): a save
        that fails for a full disk becomes its ``disk_full`` error (:meth:`save`).
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, max_to_keep: int,
                 step_counter: tf.Variable, chief: bool = True, store=None):
        self.directory = directory
        self.chief = chief
        self._store = store
        self._max_to_keep = max_to_keep
        self._step_counter = step_counter
        self._write_directory = directory if chief else tempfile.mkdtemp(
            prefix="deep_nmt_ckpt_")
        self._manager: Optional[tf.train.CheckpointManager] = None
        self.restored: Optional[str] = None
        self.set_checkpoint(checkpoint)

    def set_checkpoint(self, checkpoint: tf.train.Checkpoint) -> None:
        """Saves ``checkpoint`` from now on (e.g. the same objects plus the data iterator)."""
        self.checkpoint = checkpoint
        self._manager = None  # Created at the first save (after restore's repairs).

    def restore(self, path: Optional[str]) -> Optional[str]:
        """Restores checkpoint ``path``, the resume point the store chose
        (:meth:`deep_nmt_tf.checkpoints.CheckpointStore.resume_point`; None: nothing to
        restore); returns it.

        First the chief rewrites the ``checkpoint`` file to list only the checkpoints present
        up to ``path`` when it lists anything else (skipped, missing or newer ones), so that the
        rotation never deletes a checkpoint newer than the resumed one; other workers only
        read.  Every object of the checkpoint object must find its value (the model and
        optimizer are built first), so a checkpoint of a different model fails loudly; values
        saved for objects that do not exist yet (the data iterator) are left for later.
        """
        self.restored = path
        if self.chief:
            _repair_state(self.directory, [] if path is None else [
                p for p in list_checkpoints(self.directory)
                if checkpoint_step(p) <= checkpoint_step(path)])
        if path is None:
            return None
        status = self.checkpoint.restore(path)
        status.assert_existing_objects_matched()
        status.expect_partial()
        return path

    def chief_path(self, step: int) -> str:
        """The path of the chief's checkpoint of ``step``."""
        return os.path.join(self.directory, f"{_PREFIX}-{step}")

    def save(self) -> Optional[str]:
        """Writes a checkpoint numbered by the step counter; returns the chief's path.

        Raises:
          DiskFullError: the disk is full: the files the save left are removed (module
            docstring); the message names the free space and the last intact checkpoint
            (:meth:`deep_nmt_tf.checkpoints.CheckpointStore.disk_full`; without a store, the
            error is TensorFlow's).  On a non-chief worker, its temporary directory's disk.
        """
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                self.checkpoint, self._write_directory, max_to_keep=self._max_to_keep,
                step_counter=self._step_counter, checkpoint_name=_PREFIX)
        step = int(self._step_counter.numpy())
        if not self.chief:
            try:
                self._manager.save(checkpoint_number=step)
            except Exception as e:  # noqa: BLE001 - ResourceExhaustedError, OSError ...
                if not is_disk_full(e):
                    raise
                shutil.rmtree(self._write_directory, ignore_errors=True)
                raise DiskFullError(
                    self._write_directory, free_bytes(self._write_directory), None,
                    f"this worker's copy of checkpoint {_PREFIX}-{step}", "it was removed: free "
                    "space on this worker and rerun") from None
        elif self._store is not None:
            with self._store.writing(f"checkpoint {_PREFIX}-{step}", [self.chief_path(step)]):
                path = self._manager.save(checkpoint_number=step)
        else:
            path = self._manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self._write_directory, ignore_errors=True)
            return None
        return path
