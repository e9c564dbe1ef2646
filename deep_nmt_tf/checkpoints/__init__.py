"""A run directory's checkpoints, of both training routes (no TensorFlow at import).

* :mod:`.store`: :class:`CheckpointStore` (list, latest, resolve, restore, resume, save,
  average: the one place that knows which checkpoint is meant);
* :mod:`.formats`: one strategy per file kind, ``ckpt-N`` of the custom loop
  (:mod:`deep_nmt_tf.checkpointing`, TensorFlow) and ``ckpt-N.weights.h5`` of ``fit``, with
  the same integrity checks and damaged-file handling;
* :mod:`.averaging`: checkpoint averaging into a new run directory (TensorFlow; imported when
  used);
* :mod:`.disk`: :class:`DiskFullError`, a write that failed because the disk is full (the
  store's :meth:`CheckpointStore.disk_full`).
"""

from deep_nmt_tf.checkpoints.disk import DiskFullError, is_disk_full
from deep_nmt_tf.checkpoints.formats import (KERAS_WEIGHTS, TF_CHECKPOINT, CheckpointFormat,
                                             format_of)
from deep_nmt_tf.checkpoints.store import CheckpointStore, Resume
from deep_nmt_tf.run_dir import CheckpointError

__all__ = ["CheckpointStore", "Resume", "CheckpointFormat", "CheckpointError", "DiskFullError",
           "is_disk_full", "format_of", "TF_CHECKPOINT", "KERAS_WEIGHTS"]
