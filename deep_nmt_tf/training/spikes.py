"""What the runner does after a gradient-norm spike.

:class:`~deep_nmt_tf.health.HealthMonitor` finds the spikes (an applied update whose
gradient norm is over ``training.grad_spike_factor`` times the median of the last 200) and warns;
:class:`SpikeResponse` then does one of two things with the newest checkpoint written before it:

* **roll back** (``training.spike_rollbacks`` > 0, at most that many times per start of the
  run): the model, the optimizer, the counters and the gradient transforms' state are restored
  from that checkpoint, in the running process, and training goes on from its step.  The data
  iterator is not restored: it stays where the spike left it, so the micro-batches read since
  the checkpoint are skipped (``data_position`` keeps counting them, and a later resume is
  exact).  This is PaLM's remedy for loss spikes (Chowdhery et al. 2022, section 5.1: restart
  about 100 steps before the spike and skip 200-500 batches), and what docs/RESULTS.md found on
  Tatoeba: an 18-layer Admin run that collapsed at update 6,700 trained on normally when resumed
  from its checkpoint at 6,600.
* **keep** (otherwise, and when the rollbacks are used up): the checkpoint is copied out of the
  rotation's reach as the resumable run directory ``MODEL_DIR/kept/before_spike_<step>``
  (:meth:`~deep_nmt_tf.checkpoints.CheckpointStore.keep`; hard links, else copies) and training
  goes on; the log says how to go on from it should the run collapse.  Once the rotation has
  deleted the original, each kept copy is a full checkpoint on disk (a Tatoeba DeepNorm run
  trained through 18 spikes in 12,000 updates, 80 MB each), so only the newest
  ``training.max_kept_spikes`` are kept (:func:`prune_kept`): the run has trained past the
  older ones, through later spikes.  A kept directory trained from since (a lock, or a
  checkpoint of its own) is never removed, and not counted.

Either way the spike is recorded in ``MODEL_DIR/spikes.json`` (:func:`read_spikes`; the chief
writes it, replacing it by a rename so that the hard links of kept copies never change): the
update, its gradient norm, the median it was measured against, and what was done. The record
outlives rollbacks and resumes (it is the run's history, undone updates included), and
``deep-nmt-experiment`` reports it beside each run's scores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Dict, List, Optional

import tensorflow as tf
from absl import logging

from deep_nmt_tf.checkpointing import object_names
from deep_nmt_tf.checkpoints.store import CheckpointStore
from deep_nmt_tf.run_dir import (CONFIG_FILENAME, KEPT_DIRNAME, TRAIN_LOGS, UNREADABLE_SUFFIX,
                                 RunDirError)
from deep_nmt_tf.run_lock import LOCK_NAME
from deep_nmt_tf.training import metrics
from deep_nmt_tf.training.gradient_transforms import new_transform_items

__all__ = ["SpikeResponse", "SPIKES_FILENAME", "read_spikes", "prune_kept"]

#: The run directory's record of its gradient-norm spikes.
SPIKES_FILENAME = "spikes.json"


def read_spikes(model_dir: str) -> List[Dict]:
    """The spikes recorded in ``MODEL_DIR/spikes.json``, oldest first (none: ``[]``).  Each is
    ``{"step", "grad_norm", "median", "history", "action"}``, ``action`` one of
    ``"rolled_back"`` (with ``"to_step"``, ``"checkpoint"``, ``"skipped_micro_batches"``),
    ``"kept"`` (with ``"checkpoint"``, ``"kept_as"``, and ``"removed_kept"`` when keeping it
    removed older kept directories, :func:`prune_kept`) or ``"none"`` (no checkpoint was written
    before it, or it could not be kept).

    Raises:
      ValueError: the file is not such a record (naming it).
    """
    path = os.path.join(model_dir, SPIKES_FILENAME)
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path, "r") as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not a record of gradient-norm spikes ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("spikes"), list):
        raise ValueError(f"{path}: not a record of gradient-norm spikes (no 'spikes' list)")
    return data["spikes"]


def _record_spike(model_dir: str, record: Dict) -> None:
    """Adds ``record`` to ``MODEL_DIR/spikes.json`` (a new file replaces the old by a rename;
    an unreadable one is set aside, never overwritten)."""
    path = os.path.join(model_dir, SPIKES_FILENAME)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        try:
            spikes = read_spikes(model_dir)
        except ValueError as e:
            logging.warning("%s; set aside as %s, and a new record started", e,
                            path + UNREADABLE_SUFFIX)
            tf.io.gfile.rename(path, path + UNREADABLE_SUFFIX, overwrite=True)
            spikes = []
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(json.dumps({"spikes": spikes + [record]}, indent=1) + "\n")
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except (OSError, tf.errors.OpError) as e:  # (The log has it; training goes on.)
        logging.warning("Could not record the spike at step %s in %s (%s)", record["step"],
                        path, e)


_KEPT_NAME = re.compile(r"before_spike_(\d+)$")


def prune_kept(kept_root: str, limit: int) -> List[str]:
    """Removes all but the newest ``limit`` checkpoints kept before spikes under ``kept_root``
    (``MODEL_DIR/kept``; 0: none is removed); returns the removed directories.  A
    ``before_spike_<step>`` directory that has been trained from since it was kept (it holds a
    lock, or another checkpoint than its one) is the user's run: never removed, not counted.
    One that cannot be removed is named in a WARNING and left."""
    if limit <= 0 or not os.path.isdir(kept_root):
        return []
    untouched = []
    for name in os.listdir(kept_root):
        match = _KEPT_NAME.match(name)
        path = os.path.join(kept_root, name)
        if not match or not os.path.isdir(path):
            continue
        if os.path.exists(os.path.join(path, LOCK_NAME)) or len(CheckpointStore(path).list()) != 1:
            continue
        untouched.append((int(match.group(1)), path))
    removed = []
    for _, path in sorted(untouched, reverse=True)[limit:]:
        try:
            shutil.rmtree(path)
        except OSError as e:
            logging.warning("Could not remove %s, an older checkpoint kept before a spike (%s)",
                            path, e)
            continue
        removed.append(path)
    if removed:
        logging.info("training.max_kept_spikes=%d: removed the oldest checkpoint(s) kept before "
                     "spikes, trained past since: %s", limit, ", ".join(removed))
    return removed


class SpikeResponse:
    """Rolls a runner back to the checkpoint before a spike, or keeps that checkpoint (module
    docstring).

    Args:
      runner: the :class:`~deep_nmt_tf.training.runner.Runner` (its trainer, checkpoint items,
        health monitor, run directory and checkpoint store are used).
      rollbacks: ``training.spike_rollbacks``.
      max_kept: ``training.max_kept_spikes`` (:func:`prune_kept`).
    """

    def __init__(self, runner, rollbacks: int, max_kept: int = 0):
        self.runner = runner
        self.allowed = int(rollbacks)
        self.max_kept = int(max_kept)
        #: Rollbacks made since this process started the run.
        self.done = 0

    def __call__(self, step: int) -> Optional[int]:
        """Responds to the spike of update ``step`` and records it (:func:`read_spikes`);
        returns the step training goes on from after a rollback, or None (training goes on
        from ``step``)."""
        record = dict(self.runner.health.last_spike or {}, step=step, action="none")
        back = None
        if self.done < self.allowed:
            back = self.roll_back(step, record)
        elif self.allowed:
            logging.warning("training.spike_rollbacks=%d: every rollback is used; keeping the "
                            "checkpoint before the spike instead", self.allowed)
        if back is None and self.runner.is_chief:
            self.keep(step, record)
        if self.runner.is_chief:
            _record_spike(self.runner.run_dir.path, record)
        return back

    def _checkpoint_before(self, step: int, otherwise: str):
        """``(step, path)`` of the newest checkpoint before the spike at ``step`` (path None,
        with a WARNING ending in ``otherwise``, when none was written)."""
        saved_step, saved = self.runner.health.last_checkpoint
        if not saved:
            logging.warning("No checkpoint was written before the spike at step %d: %s", step,
                            otherwise)
        return saved_step, saved

    def roll_back(self, step: int, record: Optional[Dict] = None) -> Optional[int]:
        """Restores the newest checkpoint before the spike at ``step`` except the data iterator
        (the batches since then are skipped); returns its step, or None when there is none.
        ``record`` (the spike's record) gets what was done."""
        runner = self.runner
        trainer = runner.trainer
        saved_step, saved = self._checkpoint_before(step, "cannot roll back")
        if not saved:
            return None
        position = int(trainer.data_position.numpy())
        # A gradient transform turned on at the resume that restored that checkpoint has no
        # state there: it keeps its own.
        fresh = new_transform_items(runner.checkpoint_items, object_names(saved))
        status = tf.train.Checkpoint(**{k: v for k, v in runner.checkpoint_items.items()
                                        if k not in fresh}).restore(saved)
        status.assert_existing_objects_matched()
        status.expect_partial()  # The data iterator's saved state is left alone.
        skipped = position - int(trainer.data_position.numpy())
        trainer.data_position.assign(position)
        self.done += 1
        runner.health.rolled_back(saved_step)
        metrics.write_scalars(runner.writer(TRAIN_LOGS), saved_step,
                              {"spike_rollbacks": float(self.done)})
        logging.warning(
            "Rolled back to %s (step %d) after the gradient-norm spike at step %d: training goes "
            "on from step %d, and the %d micro-batch(es) read since that checkpoint are skipped "
            "(rollback %d of training.spike_rollbacks=%d)", saved, saved_step, step, saved_step,
            skipped, self.done, self.allowed)
        if record is not None:
            record.update(action="rolled_back", to_step=saved_step, checkpoint=saved,
                          skipped_micro_batches=skipped)
        return saved_step

    def keep(self, step: int, record: Optional[Dict] = None) -> Optional[str]:
        """Keeps the newest checkpoint written before the update of ``step`` as the resumable
        run directory ``MODEL_DIR/kept/before_spike_<step>``, out of the rotation's reach;
        returns its checkpoint (None: none was written yet, or it could not be kept).
        ``record`` (the spike's record) gets what was done."""
        runner = self.runner
        saved_step, saved = self._checkpoint_before(step, "nothing to keep")
        if not saved:
            return None
        destination = runner.run_dir.join(KEPT_DIRNAME, f"before_spike_{step}")
        try:
            kept = runner.checkpoints.keep(saved, destination)
        except (OSError, RunDirError) as e:
            logging.warning("Could not keep %s, the checkpoint before the spike (%s)", saved, e)
            return None
        logging.warning(
            "Kept %s (step %d, the newest checkpoint before the spike) as %s, a run directory "
            "the checkpoint rotation does not touch. Training goes on here; should it collapse, "
            "go on from the kept one instead, e.g. with RNMT+'s adaptive clipping: "
            "deep-nmt-train --config=%s --model_dir=%s "
            "--override=training.adaptive_clipping.enabled=true (or set "
            "training.spike_rollbacks to roll back by itself)", saved, saved_step, kept,
            os.path.join(destination, CONFIG_FILENAME), destination)
        if record is not None:
            record.update(action="kept", checkpoint=saved, kept_as=destination)
        removed = prune_kept(runner.run_dir.join(KEPT_DIRNAME), self.max_kept)
        if removed and record is not None:
            record["removed_kept"] = removed
        return kept
