"""The checkpoint store of a run directory: one place that lists, chooses, resolves, restores,
saves and averages its checkpoints (OpenNMT-tf's ``Checkpoint`` shape).

A run directory holds checkpoints of two kinds (:mod:`deep_nmt_tf.checkpoints.formats`):
``ckpt-N`` of the custom loop and ``ckpt-N.weights.h5`` of ``compile``/``fit``.  The store
treats them alike:

* :meth:`CheckpointStore.list`: every checkpoint present, oldest first (by step);
* :meth:`CheckpointStore.latest`: **the** latest checkpoint, the one meaning of it in the
  package: the newest one that passes its format's integrity check; each newer one that does
  not is skipped with a WARNING naming its problem (nothing is changed: tools only read);
* :meth:`CheckpointStore.resolve`: what a ``--checkpoint`` names (nothing: the latest; a run
  directory: its latest; a checkpoint: itself, checked), so ``--checkpoint=DIR`` works for a
  run of either route;
* :meth:`CheckpointStore.restore_model`: the model weights of a resolved checkpoint;
* :meth:`CheckpointStore.resume_point` / :meth:`CheckpointStore.set_aside_skipped`: where a
  training run resumes, decided once, before any file is written: the newest valid checkpoint
  of the route's kind; the damaged newer ones are renamed ``*.unreadable`` (kept) with a
  WARNING, and none valid among existing files is a :class:`~deep_nmt_tf.run_dir.
  CheckpointError` unless the run starts over.  The custom loop and ``fit`` both resume this
  way (``fit`` only from a ``.weights.h5`` that passes the check);
* :meth:`CheckpointStore.saver` (the custom loop's ``tf.train.CheckpointManager``,
  :class:`deep_nmt_tf.checkpointing.CheckpointSaver`) and :meth:`CheckpointStore.save`
  (``fit``'s ``.weights.h5``, written under a temporary name and renamed, rotated to
  ``training.keep_checkpoints``);
* :meth:`CheckpointStore.writing` / :meth:`CheckpointStore.disk_full`: a write into the run
  directory that fails because the disk is full (a checkpoint of either kind, ``config.yaml``,
  ``run.json`` ...) leaves no partial file (the failed checkpoint's, by its format, and the
  run directory's ``<file>.tmp*``) and raises :class:`~deep_nmt_tf.checkpoints.disk.
  DiskFullError`: the directory, the free space and the last intact checkpoint, which a rerun
  resumes from;
* :meth:`CheckpointStore.average`: the average of the last checkpoints, written as a new run
  directory (:mod:`deep_nmt_tf.checkpoints.averaging`);
* :meth:`CheckpointStore.keep`: a resumable run directory of one checkpoint, out of the
  rotation's reach (the runner keeps the checkpoint before a gradient-norm spike this way).

No TensorFlow at import: a ``fit`` run on JAX lists, checks, resumes and saves its
``.weights.h5`` through the same store.

Example:
    >>> store = CheckpointStore("runs/demo")
    >>> store.latest()                     # 'runs/demo/ckpt-1500'
    >>> store.restore_model(model, "runs/demo_fit")   # a fit run's newest .weights.h5
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import shutil
import sys
from typing import Iterable, List, Optional, Sequence, Tuple

from absl import logging

from deep_nmt_tf.checkpoints.disk import DiskFullError, free_bytes, is_disk_full
from deep_nmt_tf.checkpoints.formats import FORMATS, CheckpointFormat, format_of, partial_name
from deep_nmt_tf.run_dir import (CHECKPOINT_PREFIX, CHECKPOINT_STATE_FILENAME, CONFIG_FILENAME,
                                 DATA_DIRNAME, DATA_STATS_FILENAME, METADATA_FILENAME,
                                 UNREADABLE_SUFFIX, CheckpointError, RunDir, RunDirError,
                                 checkpoint_step, is_keras_weights)
from deep_nmt_tf.run_lock import LOCK_NAME

__all__ = ["CheckpointStore", "Resume"]

#: ``(path or None, [(skipped path, problem), ...])``: a resume point and what it skipped
#: (newest first).
Resume = Tuple[Optional[str], List[Tuple[str, str]]]


class CheckpointStore:
    """The checkpoints of one run directory (module docstring).

    Args:
      run_dir: the run directory (a path or :class:`~deep_nmt_tf.run_dir.RunDir`).
    """

    def __init__(self, run_dir):
        self.run_dir = RunDir(run_dir)
        self.directory = self.run_dir.path

    def __repr__(self) -> str:
        return f"CheckpointStore({self.directory!r})"

    @classmethod
    def of(cls, spec: str) -> "CheckpointStore":
        """The store of the run directory that ``spec`` names (the directory itself, or the
        one that holds the checkpoint ``spec``)."""
        spec = os.fspath(spec)
        if os.path.isdir(spec) or "://" in spec:
            return cls(spec)
        return cls(os.path.dirname(spec) or ".")

    @staticmethod
    def format_of(path: str) -> CheckpointFormat:
        """The format (strategy) of a checkpoint, from its name."""
        return format_of(path)

    @staticmethod
    def _formats(kinds: Optional[Iterable[str]]) -> List[CheckpointFormat]:
        return [f for f in FORMATS if kinds is None or f.kind in set(kinds)]

    # -- listing and choosing -----------------------------------------------------------------
    def list(self, kinds: Optional[Sequence[str]] = None) -> List[str]:
        """Every checkpoint present (of ``kinds``: default both), oldest first
        (:meth:`deep_nmt_tf.run_dir.RunDir.list_checkpoints`)."""
        return [p for p in self.run_dir.list_checkpoints()
                if kinds is None or format_of(p).kind in set(kinds)]

    def _candidates(self, kinds: Optional[Sequence[str]]) -> List[str]:
        """The checkpoints the formats name (present or not), oldest first (ties: the order of
        :data:`~deep_nmt_tf.checkpoints.formats.FORMATS`)."""
        found = []
        for rank, fmt in enumerate(self._formats(kinds)):
            found += [(checkpoint_step(p), rank, p) for p in fmt.candidates(self.run_dir)]
        return [p for _, _, p in sorted(found)]

    def _newest_valid(self, kinds: Optional[Sequence[str]]) -> Resume:
        skipped = []
        for path in reversed(self._candidates(kinds)):
            problem = format_of(path).problem(path)
            if problem is None:
                return path, skipped
            skipped.append((path, problem))
        return None, skipped

    def latest(self, valid: bool = True, kinds: Optional[Sequence[str]] = None
               ) -> Optional[str]:
        """The latest checkpoint (of ``kinds``: default both), or None.

        Args:
          valid: the newest one that passes its format's integrity check, each newer one that
            does not skipped with a WARNING naming its problem (the files are left as they
            are); False: the newest one present, unchecked (an error message's hint).
          kinds: :data:`~deep_nmt_tf.checkpoints.formats.TF_CHECKPOINT` and/or
            :data:`~deep_nmt_tf.checkpoints.formats.KERAS_WEIGHTS`.
        """
        if not valid:
            present = self.list(kinds)
            return present[-1] if present else None
        path, skipped = self._newest_valid(kinds)
        for bad, problem in skipped:
            logging.warning("Skipping checkpoint %s: %s", bad, problem)
        return path

    def resolve(self, spec: Optional[str] = None) -> str:
        """The readable checkpoint that ``spec`` names.

        Args:
          spec: None (this run's :meth:`latest`), a run directory (its latest), a ``ckpt-N``
            prefix or a ``ckpt-N.weights.h5`` file.

        Raises:
          FileNotFoundError: no checkpoint there (the message lists the directory's).
          CheckpointError: the named checkpoint is damaged.
        """
        if spec is None:
            path = self.latest()
            if path is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            return path
        spec = os.fspath(spec)
        if os.path.isdir(spec):
            return CheckpointStore(spec).resolve()
        fmt = format_of(spec)
        if not fmt.exists(spec):
            store = CheckpointStore.of(spec)
            known = ", ".join(os.path.basename(p) for p in store.list()) or "none"
            raise FileNotFoundError(f"{spec}: no such checkpoint ({fmt.main_file(spec)} not "
                                    f"found; checkpoints in {store.directory}: {known})")
        problem = fmt.problem(spec)
        if problem:
            raise CheckpointError(f"checkpoint {spec} cannot be read: {problem}")
        return spec

    def restore_model(self, model, spec: Optional[str] = None) -> str:
        """Loads the model weights of :meth:`resolve`'s checkpoint into a built ``model`` (its
        format's restore: variables checked first for a ``ckpt-N``); returns the path.

        Raises:
          FileNotFoundError, CheckpointError: see :meth:`resolve`; CheckpointError or
            ValueError also for a checkpoint of another model.
        """
        path = self.resolve(spec)
        format_of(path).restore_model(model, path)
        return path

    # -- resuming -----------------------------------------------------------------------------
    def resume_point(self, kind: str, start_over: bool = False,
                     start_over_hint: str = "pass --start_over (Runner(start_over=True)) to "
                                            "train from step 0") -> Resume:
        """Where a training run of checkpoint ``kind`` resumes: the newest valid checkpoint of
        that kind and the newer ones skipped; changes nothing.

        Raises:
          CheckpointError: checkpoint files of the kind exist but none can be read, and not
            ``start_over`` (naming each file and its problem); or ``start_over`` although one
            can be read.
        """
        path, skipped = self._newest_valid([kind])
        if path is not None and start_over:
            raise CheckpointError(
                f"{self.directory} has a valid checkpoint, {path}: --start_over only starts "
                "over in a run directory whose checkpoints cannot be read; resume from it "
                "(drop --start_over) or use a new --model_dir")
        if skipped and path is None and not start_over:
            listing = "; ".join(f"{bad}: {problem}" for bad, problem in skipped)
            raise CheckpointError(
                f"{self.directory} has checkpoints but none can be read ({listing}). Nothing "
                f"was changed. Restore the files, or {start_over_hint} (the unreadable files "
                f"are kept, renamed *{UNREADABLE_SUFFIX})")
        return path, skipped

    def set_aside_skipped(self, resume: Resume, chief: bool = True) -> Optional[str]:
        """Logs the resume point's skipped checkpoints and (``chief``) renames their files
        ``*.unreadable``; returns the path to resume from (None: step 0)."""
        path, skipped = resume
        for bad, problem in skipped:
            logging.warning("Skipping checkpoint %s: %s", bad, problem)
            if chief:
                for moved in format_of(bad).set_aside(bad):
                    logging.warning("Kept the unreadable file as %s", moved)
        if skipped and path is not None:
            logging.warning("Resuming from %s, the newest checkpoint that can be read", path)
        elif skipped:
            logging.warning("Starting over from step 0 in %s (--start_over)", self.directory)
        return path

    # -- writing ------------------------------------------------------------------------------
    def saver(self, checkpoint, max_to_keep: int, step_counter, chief: bool = True):
        """The custom loop's writer of ``ckpt-N``: a :class:`deep_nmt_tf.checkpointing.
        CheckpointSaver` of ``checkpoint`` (a ``tf.train.Checkpoint``) numbered by
        ``step_counter``, keeping ``max_to_keep``."""
        from deep_nmt_tf.checkpointing import CheckpointSaver

        return CheckpointSaver(checkpoint, self.directory, max_to_keep=max_to_keep,
                               step_counter=step_counter, chief=chief, store=self)

    def save(self, model, step: int, keep: int) -> str:
        """``fit``'s checkpoint: ``model.save_weights`` to ``ckpt-<step>.weights.h5`` (model and
        optimizer weights); the older ``.weights.h5`` beyond the newest ``keep`` are deleted.

        The file is written as ``ckpt-<step>.partial.weights.h5`` (never listed) and renamed
        when complete, so a failed or killed save never leaves a partial file under a
        checkpoint's name.

        Raises:
          DiskFullError: the disk is full (:meth:`disk_full`; the partial file removed).
        """
        os.makedirs(self.directory, exist_ok=True)
        path = self.run_dir.keras_weights_path(step)
        full = False
        hooks = sys.unraisablehook, sys.excepthook
        try:
            model.save_weights(partial_name(path), overwrite=True)
            os.replace(partial_name(path), path)
        except Exception as e:  # noqa: BLE001 - h5py's OSError, Keras' errors ...
            full = is_disk_full(e)
            if not full:
                format_of(path).remove_partial(path)
                raise
            # Keras leaves the h5py file open: it is closed when the error's frames go, and
            # h5py, unable to flush to a full disk, prints tracebacks (through both hooks).
            sys.unraisablehook = sys.excepthook = _ignore
        if full:
            try:
                gc.collect()
            finally:
                sys.unraisablehook, sys.excepthook = hooks
            raise self.disk_full(f"checkpoint {os.path.basename(path)}", [path])
        for old in self.run_dir.list_keras_weights()[:-max(1, int(keep))]:
            os.remove(old)
        return path

    # -- a full disk ---------------------------------------------------------------------------
    def disk_full(self, target: str, partial: Sequence[str] = (), kind: Optional[str] = None
                  ) -> DiskFullError:
        """The error of a write into the run directory that failed because the disk is full,
        once its partial files are removed: the ``partial`` checkpoints' leftovers (each by its
        format's :meth:`~deep_nmt_tf.checkpoints.formats.CheckpointFormat.remove_partial`) and
        the run directory's temporary files (``config.yaml``, ``run.json``,
        ``data_stats.json`` and ``checkpoint`` are written as ``<file>.tmp*`` and renamed).

        Args:
          target: what could not be saved (``checkpoint ckpt-400``, ``config.yaml`` ...).
          partial: the checkpoints being written (``DIR/ckpt-N``, ``DIR/ckpt-N.weights.h5``).
          kind: the kind of checkpoint a rerun resumes from, for "the last intact checkpoint"
            (default: the kind of ``partial``'s first, or either kind).
        """
        removed = []
        for path in partial:
            removed += format_of(path).remove_partial(path)
        for name in (CONFIG_FILENAME, METADATA_FILENAME, DATA_STATS_FILENAME,
                     CHECKPOINT_STATE_FILENAME):
            for leftover in glob.glob(glob.escape(self.run_dir.join(name)) + ".tmp*"):
                os.remove(leftover)
                removed.append(leftover)
        for name in removed:
            logging.info("Removed %s (a partial write)", name)
        if kind is None and partial:
            kind = format_of(partial[0]).kind
        last = self.latest(kinds=None if kind is None else [kind])
        return DiskFullError(self.directory, free_bytes(self.directory), last, target)

    @contextlib.contextmanager
    def writing(self, target: Optional[str] = None, partial: Sequence[str] = (),
                kind: Optional[str] = None):
        """A block that writes into the run directory: an exception that says the disk is full
        (:func:`~deep_nmt_tf.checkpoints.disk.is_disk_full`) becomes :meth:`disk_full`'s
        error (arguments as there; ``target`` None: the name of the file the error names, or
        "a file"); any other exception passes unchanged."""
        try:
            yield self
        except Exception as e:  # noqa: BLE001 - TensorFlow's, h5py's and Python's errors alike
            if isinstance(e, DiskFullError) or not is_disk_full(e):
                raise
            if target is None:
                filename = getattr(e, "filename", None)
                target = os.path.basename(os.fspath(filename)) if filename else "a file"
        else:
            return
        raise self.disk_full(target, partial, kind) from None

    def average(self, output_dir: str, last: int = 5,
                checkpoints: Optional[Sequence[str]] = None, overwrite: bool = False,
                output_format: Optional[str] = None) -> str:
        """The average of the ``last`` newest checkpoints (or of ``checkpoints``) written as a
        new run directory (:func:`deep_nmt_tf.checkpoints.averaging.average_checkpoints`;
        ``output_format``: its checkpoint's kind, default ``ckpt-N`` on the TensorFlow
        backend, else a model-only ``.weights.h5``); returns the written checkpoint."""
        from deep_nmt_tf.checkpoints.averaging import average_checkpoints

        return average_checkpoints(self.directory, output_dir, last=last,
                                   checkpoints=checkpoints, overwrite=overwrite,
                                   output_format=output_format)

    def keep(self, checkpoint: str, destination: str) -> str:
        """Copies ``checkpoint`` with the run directory's files into ``destination``, a new
        run directory that resumes from it (``deep-nmt-train --config=DEST/config.yaml
        --model_dir=DEST``, keys such as ``training.adaptive_clipping.enabled`` overridable
        there like at any resume); returns the checkpoint's path in it.

        Copied: the run directory's top-level files (``config.yaml``, ``run.json``, the
        vocabulary, ``data_stats.json`` ...) and its ``data/`` token files, but not its other
        checkpoints, its ``checkpoint`` state file (``destination`` gets one naming only this
        checkpoint), its lock or temporary files; TensorBoard logs stay behind.  Files are
        hard-linked where the file system allows (no space used; every file the run writes
        is written once or replaced by a rename, so a link never changes afterwards), else
        copied.

        Raises:
          RunDirError: ``destination`` already holds a run.
          OSError: a file could not be linked or copied (the partial ``destination`` is
            removed).
        """
        source = self.run_dir.path
        existing = RunDir(destination).run_files()
        if existing:
            raise RunDirError(f"{destination} already holds a run ({', '.join(existing[:6])}): "
                              f"{checkpoint} is not kept there")
        write_state = None  # ckpt-N: the state file naming it (fit's .weights.h5 needs none)
        if is_keras_weights(checkpoint):
            files = [checkpoint]
        else:
            from deep_nmt_tf.checkpointing import checkpoint_files
            from deep_nmt_tf.checkpointing import write_checkpoint_state as write_state

            files = checkpoint_files(checkpoint)
        for name in sorted(os.listdir(source)):
            path = os.path.join(source, name)
            if not os.path.isfile(path) or name.startswith(CHECKPOINT_PREFIX + "-") or name in (
                    CHECKPOINT_STATE_FILENAME, LOCK_NAME) or ".tmp" in name or \
                    name.endswith(UNREADABLE_SUFFIX):
                continue
            files.append(path)
        data = os.path.join(source, DATA_DIRNAME)
        os.makedirs(destination, exist_ok=True)
        try:
            for path in files:
                _link_or_copy(path, os.path.join(destination, os.path.basename(path)))
            if os.path.isdir(data):
                shutil.copytree(data, os.path.join(destination, DATA_DIRNAME),
                                copy_function=_link_or_copy)
            kept = os.path.join(destination, os.path.basename(checkpoint))
            if write_state is not None:
                write_state(destination, [kept])
        except OSError:
            shutil.rmtree(destination, ignore_errors=True)
            raise
        return kept


def _link_or_copy(source: str, destination: str) -> str:
    """A hard link of ``source`` at ``destination``, or a copy where links do not work."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
    return destination


def _ignore(*args) -> None:
    """A ``sys.unraisablehook`` (``sys.excepthook``) that prints nothing."""
