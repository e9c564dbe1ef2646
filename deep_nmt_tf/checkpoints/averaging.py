"""Checkpoint averaging (Wang et al. 2019 average the last 5 checkpoints), the store's
:meth:`~deep_nmt_tf.checkpoints.CheckpointStore.average` (checkpoints of either kind: ``ckpt-N``
or ``fit``'s ``.weights.h5``, each read by its format).

:func:`average_checkpoints` restores each checkpoint's model variables into one model, averages
the floating-point ones (in float64, cast back) and writes a new run directory
(:class:`~deep_nmt_tf.run_dir.RunDir`): ``config.yaml`` (``data.vocab`` pointing at the copied
vocabulary), ``run.json``, ``vocab.txt``, ``averaged_checkpoints.txt`` and one model-only
checkpoint in the trainer's layout (:func:`deep_nmt_tf.checkpointing.model_checkpoint`)
numbered with the newest averaged step, managed by ``tf.train.CheckpointManager`` (so
``tf.train.latest_checkpoint`` finds it).  Optimizer slots and training counters are left out.
On another Keras backend than TensorFlow (a machine with only JAX, where ``fit`` trained the run),
or with ``output_format=KERAS_WEIGHTS``, the average is written as a model-only
``ckpt-<step>.weights.h5`` instead (Keras' ``save_weights``), which every tool reads as well.

An output directory that holds a run (its ``config.yaml``, checkpoints ...) is refused unless
``overwrite`` (its earlier checkpoints are then removed), or unless it holds an earlier average
of the same ``model_dir``'s checkpoints, which a new average replaces; a checkpoint of another
model is
refused naming the first variable that differs (before anything is written); checkpoints from
several run directories are averaged with a WARNING (unrelated runs of one architecture average
to garbage unless one was warm-started from the other).  An average that cannot be written
because the disk is full is removed (its checkpoint's partial files, the copied vocabulary,
``config.yaml``, ``run.json``) and raises :class:`~deep_nmt_tf.checkpoints.disk.DiskFullError`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from typing import List, Optional, Sequence

import numpy as np
from absl import logging

from deep_nmt_tf.checkpoints.disk import DiskFullError, free_bytes, is_disk_full
from deep_nmt_tf.checkpoints.formats import KERAS_WEIGHTS, TF_CHECKPOINT, format_of
from deep_nmt_tf.run_dir import RunDir, checkpoint_step

__all__ = ["average_checkpoints", "average_model_variables"]


def _numpy_dtype(variable) -> np.dtype:
    import keras

    return np.dtype(keras.backend.standardize_dtype(variable.dtype))


def _is_float(variable) -> bool:
    import ml_dtypes

    dtype = _numpy_dtype(variable)
    return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def _tensorflow_backend() -> bool:
    """Whether ``ckpt-N`` can hold the model: TensorFlow installed and Keras' backend (a
    ``tf.train.Checkpoint`` saves no variables of another backend)."""
    import keras

    return keras.backend.backend() == "tensorflow" and _tensorflow_available()


def _tensorflow_available() -> bool:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def average_model_variables(model, checkpoints: Sequence[str]) -> None:
    """Sets ``model``'s floating-point variables to their mean over ``checkpoints``.

    Non-float variables keep the value of the last checkpoint.
    """
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    variables = list(model.variables)
    sums: List[Optional[np.ndarray]] = [None] * len(variables)
    for path in checkpoints:
        format_of(path).restore_model(model, path)
        for i, v in enumerate(variables):
            if _is_float(v):
                value = np.asarray(_keras_value(v), np.float64)
                sums[i] = value if sums[i] is None else sums[i] + value
    for v, total in zip(variables, sums):
        if total is not None:
            v.assign((total / len(checkpoints)).astype(_numpy_dtype(v)))


def _keras_value(variable) -> np.ndarray:
    import keras

    return keras.ops.convert_to_numpy(variable.value)


def _is_average_of(target: RunDir, model_dir: str) -> bool:
    """Whether ``target`` holds an earlier average of checkpoints of ``model_dir`` (replacing it
    with a newer average loses nothing)."""
    try:
        with open(target.averaged_list_path, encoding="utf-8") as f:
            averaged = [line.strip() for line in f if line.strip()]
    except OSError:
        return False
    source = os.path.abspath(model_dir)
    return bool(averaged) and all(os.path.abspath(os.path.dirname(p)) == source
                                  for p in averaged)


def average_checkpoints(model_dir: str, output_dir: str, last: int = 5,
                        checkpoints: Optional[Sequence[str]] = None,
                        overwrite: bool = False, output_format: Optional[str] = None) -> str:
    """Averages the ``last`` newest checkpoints of ``model_dir`` into ``output_dir``.

    Args:
      model_dir: trainer output (``config.yaml``, vocabulary, checkpoints).
      output_dir: new model directory (created; must not be ``model_dir``).
      last: number of newest checkpoints to average.
      checkpoints: explicit checkpoint prefixes instead of ``last``.
      overwrite: replace the run in ``output_dir`` if there is one (without it, only an
        earlier average of ``model_dir`` is replaced; module docstring).
      output_format: ``TF_CHECKPOINT`` or ``KERAS_WEIGHTS`` (default: the first on the
        TensorFlow backend, else the second).

    Returns:
      The path of the written checkpoint.

    Raises:
      RunDirError: ``output_dir`` holds another run and not ``overwrite``.
      CheckpointError: a checkpoint is damaged or of another model.
      DiskFullError: the disk of ``output_dir`` is full (nothing of the average is left
        there).
      FileNotFoundError: no (such) checkpoint.
    """
    from deep_nmt_tf.models import build_model

    if output_format is None:
        output_format = TF_CHECKPOINT if _tensorflow_backend() else KERAS_WEIGHTS
    if output_format not in (TF_CHECKPOINT, KERAS_WEIGHTS):
        raise ValueError(f"output_format={output_format!r}: expected {TF_CHECKPOINT!r} or "
                         f"{KERAS_WEIGHTS!r}")
    if os.path.abspath(output_dir) == os.path.abspath(model_dir):
        raise ValueError("--output must differ from --model_dir")
    source, target = RunDir(model_dir), RunDir(output_dir)
    if not overwrite and not _is_average_of(target, model_dir):
        target.refuse_overwrite("the averaged model", "--overwrite")
    config = source.load_config()
    if checkpoints is None:
        available = source.list_checkpoints()
        if not available:
            raise FileNotFoundError(f"no checkpoints in {model_dir}")
        if last < 1:
            raise ValueError(f"--last must be >= 1, got {last}")
        if len(available) < last:
            logging.warning("%s has %d checkpoints; averaging all of them (asked for %d)",
                            model_dir, len(available), last)
        checkpoints = available[-last:]
    checkpoints = list(checkpoints)
    for path in checkpoints:
        if not format_of(path).exists(path):
            raise FileNotFoundError(f"{path}: no such checkpoint")
    runs = sorted({os.path.abspath(os.path.dirname(p)) for p in checkpoints})
    if len(runs) > 1:
        logging.warning("Averaging checkpoints of %d run directories (%s): unless one run was "
                        "warm-started from the other, their weights are unrelated and their "
                        "average is garbage", len(runs), ", ".join(runs))
    logging.info("Averaging %d checkpoints: %s", len(checkpoints), ", ".join(checkpoints))
    model = build_model(config)
    average_model_variables(model, checkpoints)

    os.makedirs(output_dir, exist_ok=True)
    if _tensorflow_available():  # (without TensorFlow there can be no ckpt-N to replace)
        from deep_nmt_tf.checkpointing import checkpoint_files, find_checkpoints

        for old in find_checkpoints(output_dir):  # (only with overwrite: refused otherwise)
            for name in checkpoint_files(old):
                os.remove(name)
    for old in target.list_keras_weights():  # (a fit run's weights would seem newer)
        os.remove(old)
    state = os.path.join(output_dir, "checkpoint")
    if os.path.exists(state):
        os.remove(state)
    step = max(max(checkpoint_step(p) for p in checkpoints), 0)
    try:
        path = _write_average(source, target, config, model, checkpoints, step, output_format)
    except Exception as e:  # noqa: BLE001 - TensorFlow's ResourceExhaustedError, OSError ...
        if not is_disk_full(e):
            raise
    else:
        logging.info("Wrote the average of %d checkpoints to %s", len(checkpoints), path)
        return path
    # A full disk: what was written is removed (an average is written whole or not at all).
    if output_format == KERAS_WEIGHTS:
        prefix = target.keras_weights_path(step)
        format_of(prefix).remove_partial(prefix)
    else:
        from deep_nmt_tf.checkpointing import remove_partial

        prefix = target.checkpoint_prefix(step)
        remove_partial(prefix)
    vocab_src = os.path.abspath(source.vocab_path(config))
    for name in (target.default_tokenizer_path(config), target.config_path,
                 target.metadata_path, state, target.averaged_list_path):
        for leftover in [name] + glob.glob(glob.escape(name) + ".tmp*"):
            if os.path.isfile(leftover) and os.path.abspath(leftover) != vocab_src:
                os.remove(leftover)
    raise DiskFullError(
        output_dir, free_bytes(output_dir), None,
        f"the average of {len(checkpoints)} checkpoints ({os.path.basename(prefix)})",
        "nothing of it was kept, and the averaged checkpoints are intact: free space and "
        "rerun") from None


def _write_average(source: RunDir, target: RunDir, config, model, checkpoints: Sequence[str],
                   step: int, output_format: str = TF_CHECKPOINT) -> str:
    """Writes the averaged run directory (module docstring); returns the checkpoint."""
    vocab_src = source.vocab_path(config)
    vocab_dst = target.default_tokenizer_path(config)
    if os.path.abspath(vocab_src) != os.path.abspath(vocab_dst):
        shutil.copyfile(vocab_src, vocab_dst)
    target.write_config(dataclasses.replace(config, data=dataclasses.replace(
        config.data, vocab=vocab_dst)))
    if output_format == KERAS_WEIGHTS:
        from deep_nmt_tf.checkpoints.formats import partial_name

        path = target.keras_weights_path(step)
        model.save_weights(partial_name(path), overwrite=True)  # (no optimizer: model only)
        os.replace(partial_name(path), path)
    else:
        import tensorflow as tf

        from deep_nmt_tf.checkpointing import model_checkpoint

        manager = tf.train.CheckpointManager(model_checkpoint(model), target.path,
                                             max_to_keep=None)
        path = manager.save(checkpoint_number=step)
    with open(target.averaged_list_path, "w", encoding="utf-8") as f:
        f.writelines(p + "\n" for p in checkpoints)
    return path
