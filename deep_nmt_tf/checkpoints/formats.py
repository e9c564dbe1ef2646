"""The two checkpoint formats of a run directory, one strategy each (no TensorFlow at import).

=====================  ==========================================  ============================
                       :class:`TFCheckpoints` (``ckpt-N``)         :class:`KerasWeights`
                                                                   (``ckpt-N.weights.h5``)
=====================  ==========================================  ============================
written by             the custom loop (``tf.train.Checkpoint``:   ``compile``/``fit``
                       model, optimizer, counters); averaging      (Keras ``save_weights``)
candidates             the ``checkpoint`` file's list and the      the ``.weights.h5`` files
                       ``ckpt-N.index`` files present
integrity check        missing ``.index``/``.data`` files, an      a missing file, or one that
(:meth:`problem`)      index that does not parse, a truncated      does not open as HDF5 or
                       data file, a checksum mismatch (every       whose datasets do not all
                       tensor is read)                             read (a truncated file)
damaged files          renamed ``<file>.unreadable`` (kept)        the same
a failed save          its ``.index`` and ``.data-*`` files,       the file it was written as
(``remove_partial``)   ``ckpt-N_temp/``, ``*.tempstate*``          (``ckpt-N.partial.weights.
                                                                   h5``; renamed when complete)
restore the model      :func:`deep_nmt_tf.checkpointing.           ``model.load_weights``
                       restore_model_weights` (every variable      (any backend)
                       checked first)
=====================  ==========================================  ============================

The checkpoint store (:class:`deep_nmt_tf.checkpoints.CheckpointStore`) asks the format of each
file (:func:`format_of`), so that listing, "the latest", resolving, resuming and averaging are
the same for both.  The TensorFlow format imports :mod:`deep_nmt_tf.checkpointing` when it is
used; the Keras one needs only ``h5py`` (a Keras dependency), so ``fit`` on JAX resumes without
TensorFlow.
"""

from __future__ import annotations

import os
from typing import List, Optional

from deep_nmt_tf.run_dir import KERAS_WEIGHTS_SUFFIX, RunDir, is_keras_weights, set_aside_files

__all__ = ["TF_CHECKPOINT", "KERAS_WEIGHTS", "CheckpointFormat", "TFCheckpoints",
           "KerasWeights", "FORMATS", "format_of", "partial_name"]

#: The kinds of checkpoint (:attr:`CheckpointFormat.kind`).
TF_CHECKPOINT = "ckpt"
KERAS_WEIGHTS = "weights.h5"


class CheckpointFormat:
    """One kind of checkpoint file: how to find, check, set aside and restore it."""

    #: :data:`TF_CHECKPOINT` or :data:`KERAS_WEIGHTS`.
    kind: str = ""

    def owns(self, path: str) -> bool:
        """Whether ``path`` names a checkpoint of this kind."""
        raise NotImplementedError

    def candidates(self, run_dir: RunDir) -> List[str]:
        """Every checkpoint of this kind the run directory names, oldest first (some may be
        missing or damaged)."""
        raise NotImplementedError

    def main_file(self, path: str) -> str:
        """The file whose presence means the checkpoint exists."""
        return path

    def exists(self, path: str) -> bool:
        """Whether the checkpoint's main file is there."""
        raise NotImplementedError

    def problem(self, path: str) -> Optional[str]:
        """What prevents reading checkpoint ``path`` (naming the file at fault), or None."""
        raise NotImplementedError

    def set_aside(self, path: str) -> List[str]:
        """Renames the checkpoint's files to ``<file>.unreadable``; returns the new names."""
        raise NotImplementedError

    def restore_model(self, model, path: str) -> None:
        """Loads the model weights of checkpoint ``path`` into the built ``model``."""
        raise NotImplementedError

    def remove_partial(self, path: str) -> List[str]:
        """Removes what a failed save of checkpoint ``path`` left; returns the removed names."""
        raise NotImplementedError


class TFCheckpoints(CheckpointFormat):
    """``ckpt-N`` (``tf.train.Checkpoint``): :mod:`deep_nmt_tf.checkpointing`."""

    kind = TF_CHECKPOINT

    def owns(self, path: str) -> bool:
        return not is_keras_weights(path)

    def candidates(self, run_dir: RunDir) -> List[str]:
        from deep_nmt_tf.checkpointing import find_checkpoints

        return find_checkpoints(run_dir.path)

    def main_file(self, path: str) -> str:
        return path + ".index"

    def exists(self, path: str) -> bool:
        import tensorflow as tf

        return tf.io.gfile.exists(self.main_file(path))

    def problem(self, path: str) -> Optional[str]:
        from deep_nmt_tf.checkpointing import checkpoint_problem

        return checkpoint_problem(path)

    def set_aside(self, path: str) -> List[str]:
        from deep_nmt_tf.checkpointing import set_aside

        return set_aside(path)

    def remove_partial(self, path: str) -> List[str]:
        from deep_nmt_tf.checkpointing import remove_partial

        return remove_partial(path)

    def restore_model(self, model, path: str) -> None:
        from deep_nmt_tf.checkpointing import restore_model_weights

        restore_model_weights(model, path)


class KerasWeights(CheckpointFormat):
    """``ckpt-N.weights.h5`` of ``fit`` (Keras' ``save_weights``: the model's weights by layer
    path and, from a training run, the optimizer's; the dropout seed states are not in it,
    inference does not use them)."""

    kind = KERAS_WEIGHTS

    def owns(self, path: str) -> bool:
        return is_keras_weights(path)

    def candidates(self, run_dir: RunDir) -> List[str]:
        return run_dir.list_keras_weights()

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def problem(self, path: str) -> Optional[str]:
        if not os.path.isfile(path):
            return f"{path} is missing"
        import h5py

        def read(name, item):
            if isinstance(item, h5py.Dataset):
                item[()]  # noqa: B018  (every dataset is read, as every tensor of a ckpt-N)

        try:
            with h5py.File(path, "r") as f:
                f.visititems(read)
        except Exception as e:  # noqa: BLE001 - h5py raises OSError, KeyError ... when damaged
            reason = (str(e).strip() or type(e).__name__).splitlines()[0]
            return f"{path} is damaged ({reason})"
        return None

    def set_aside(self, path: str) -> List[str]:
        return set_aside_files([path])

    def remove_partial(self, path: str) -> List[str]:
        # (CheckpointStore.save writes partial_name(path), renamed to path once complete.)
        removed = [name for name in (partial_name(path),) if os.path.exists(name)]
        for name in removed:
            os.remove(name)
        return removed

    def restore_model(self, model, path: str) -> None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such weights file")
        model.load_weights(path)


#: The formats, in the order a tie at the same step is broken (the later one wins).
FORMATS = (KerasWeights(), TFCheckpoints())


def partial_name(path: str) -> str:
    """The name a ``ckpt-N.weights.h5`` is written as before it is complete:
    ``ckpt-N.partial.weights.h5`` (Keras needs the suffix; the run directory lists no such
    name)."""
    return path[:-len(KERAS_WEIGHTS_SUFFIX)] + ".partial" + KERAS_WEIGHTS_SUFFIX


def format_of(path: str) -> CheckpointFormat:
    """The format of the checkpoint ``path`` names (by its name)."""
    for fmt in FORMATS:
        if fmt.owns(os.fspath(path)):
            return fmt
    raise ValueError(f"{path}: not a checkpoint name")  # (TFCheckpoints owns the rest)
