"""A full disk while a run directory is written: :class:`DiskFullError` (no TensorFlow).

A checkpoint that cannot be written because the disk (or the quota) is full fails inside
TensorFlow's ``SaveV2``/``MergeV2Checkpoints`` as a ``ResourceExhaustedError`` ("...; No space
left on device"), inside h5py (``fit``'s ``.weights.h5``) as an ``OSError`` with ``errno`` 28,
and in a plain Python write (``run.json``, ``config.yaml`` ...) as ``OSError(ENOSPC)``.
:func:`is_disk_full` recognises all three (and ``EDQUOT``); the writers of a run directory
(:meth:`deep_nmt_tf.checkpoints.CheckpointStore.disk_full`, checkpoint averaging) remove the
partial files the failed write left and raise :class:`DiskFullError` instead: one line naming
the directory, the free space and the last intact checkpoint, which the training tools print as
their other errors (``train: error: ...``, exit status 2).

Example message::

    cannot save checkpoint ckpt-400 in runs/x: the disk is full (12.0 MiB free); the last
    intact checkpoint is runs/x/ckpt-200 (step 200): free space and rerun to resume from it
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import Optional

from deep_nmt_tf.run_dir import CheckpointError, checkpoint_step

__all__ = ["DiskFullError", "is_disk_full", "free_bytes", "format_bytes"]

_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# TensorFlow and h5py put the C library's text in their messages (TF: "<file>; No space left on
# device"; h5py: "errno = 28, error message = 'No space left on device'").
_TEXTS = tuple(os.strerror(code) for code in _ERRNOS)


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) says that the disk or the quota is
    full: an ``OSError`` with ``errno`` ENOSPC/EDQUOT, or an error whose text holds the C
    library's message for them (TensorFlow's ``ResourceExhaustedError`` of a write, which is
    also raised for memory: that one is not a full disk)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _ERRNOS:
            return True
        if any(text in str(error) for text in _TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


def free_bytes(directory: str) -> Optional[int]:
    """The bytes free for ``directory`` (its nearest existing parent), or None when unknown (a
    ``gs://`` directory)."""
    path = os.path.abspath(directory) if "://" not in directory else None
    while path and not os.path.exists(path):
        path = os.path.dirname(path) if os.path.dirname(path) != path else None
    if not path:
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def format_bytes(count: Optional[int]) -> str:
    """``12.0 MiB`` (``B``, ``KiB`` ... ``TiB``); ``unknown`` for None."""
    if count is None:
        return "unknown"
    if count < 1024:
        return f"{count} B"
    value, unit = count / 1024.0, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if value < 1024.0:
            break
        value, unit = value / 1024.0, larger
    return f"{value:.1f} {unit}"


class DiskFullError(CheckpointError):
    """A file of a run directory could not be written because the disk (or the quota) is
    full; the partial files of that write have been removed.

    Args:
      directory: the directory written.
      free: bytes free there after the partial files were removed (None: unknown).
      last_checkpoint: the newest intact checkpoint of the run (None: there is none).
      target: what could not be saved (``checkpoint ckpt-400``, ``run.json`` ...).
      advice: the end of the message (default: free space and rerun to resume from
        ``last_checkpoint``, or to start from step 0 when there is none).

    Attributes:
      directory, free, last_checkpoint, target: as given; last_step: the step of
        ``last_checkpoint`` (None without one).
    """

    def __init__(self, directory: str, free: Optional[int], last_checkpoint: Optional[str],
                 target: str = "checkpoint", advice: Optional[str] = None):
        self.directory = os.fspath(directory)
        self.free = free
        self.last_checkpoint = last_checkpoint
        self.last_step = checkpoint_step(last_checkpoint) if last_checkpoint else None
        self.target = target
        if advice is None:
            if last_checkpoint:
                advice = (f"the last intact checkpoint is {last_checkpoint} (step "
                          f"{self.last_step}): free space and rerun to resume from it")
            else:
                advice = ("there is no intact checkpoint yet: free space and rerun to start "
                          "from step 0")
        free_text = "free space unknown" if free is None else f"{format_bytes(free)} free"
        super().__init__(f"cannot save {target} in {self.directory}: the disk is full "
                         f"({free_text}); {advice}")
