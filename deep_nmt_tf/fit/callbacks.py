"""Callbacks of a ``fit`` run in a run directory: checkpoints the tools read, and progress.

* :class:`RunDirCheckpoint` writes ``MODEL_DIR/ckpt-N.weights.h5`` (``N`` = updates applied;
  Keras' ``save_weights``: the model's and the optimizer's weights) every
  ``training.checkpoint_every`` updates and at the end, keeping ``training.keep_checkpoints``
  (the run directory's :meth:`deep_nmt_tf.checkpoints.CheckpointStore.save`).
  ``deep-nmt-translate``, ``-evaluate`` and ``-export`` load them on TensorFlow like a
  ``ckpt-N`` (through the same store); :func:`deep_nmt_tf.fit.run.train` resumes from the
  newest that can be read.
* :class:`ProgressLogger`: a progress bar on a terminal (:class:`deep_nmt_tf.progress.
  Progress`: step, loss, tokens/s, ETA) and a plain line per ``fit`` epoch (the run's
  ``training.log_every`` updates): loss, tokens/s, learning rate, ETA and the validation loss
  when there was one; tokens and time are counted in a :class:`deep_nmt_tf.progress.LogWindow`
  and the line is :meth:`~deep_nmt_tf.progress.Progress.log_line`, as in the custom loop;
  so is the WARNING when a line's loss is ``training.loss_explosion_factor`` times the lowest
  so far (:class:`~deep_nmt_tf.health.HealthMonitor`).

``fit``'s optimizer skips every micro-batch whose gradients are not finite, as the custom loop
does (:class:`~deep_nmt_tf.task.skipping.SkipNonFiniteUpdates`, which counts them):
:class:`ProgressLogger` says at each log line how many the window skipped (with a WARNING; the
window's mean loss is then not finite, as it averages them in), and :class:`RunDirCheckpoint`
stops the run when ``training.max_consecutive_skipped`` updates' worth of micro-batches in a row
were skipped (checked at log lines).  It also saves only finite weights: at non-finite weights
(checked at a save, and at a log line whose loss is not finite) or a non-finite loss with an
optimizer that does not skip, it stops the run and writes nothing more, so the rotation never
deletes the last good checkpoint, and :func:`deep_nmt_tf.fit.run.train` raises
:class:`FitDiverged` naming it.

SIGTERM and Ctrl-C (:class:`~deep_nmt_tf.health.StopSignals`, as in the custom loop) stop
the run at the end of the current update with a checkpoint there, and
:func:`~deep_nmt_tf.fit.run.train` raises :class:`~deep_nmt_tf.health.TrainingInterrupted`.

Both count updates themselves (``batches // gradient_accumulation_steps``) and touch
``self.model`` only when they save or read the learning rate: on JAX, reading the model's
variables during ``fit`` copies the training state back into them.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import keras
from absl import logging
from keras import ops

from deep_nmt_tf.checkpoints import CheckpointStore
from deep_nmt_tf.health import HealthMonitor, StopSignals, TrainingDiverged
from deep_nmt_tf.progress import LogWindow, Progress
from deep_nmt_tf.task import per_token_metrics
from deep_nmt_tf.task.skipping import skip_counts

__all__ = ["RunDirCheckpoint", "ProgressLogger", "FitDiverged"]


class FitDiverged(TrainingDiverged):
    """A ``fit`` run met non-finite weights, a non-finite loss it could not skip or too many
    skipped micro-batches in a row, and stopped (the message names the last good
    checkpoint)."""


def _weights_finite(model) -> bool:
    return all(bool(ops.convert_to_numpy(ops.all(ops.isfinite(v))))
               for v in model.trainable_weights)


class _UpdateCounter(keras.callbacks.Callback):
    """Counts updates from training batches (``accumulation`` batches per update)."""

    def __init__(self, start_update: int = 0, accumulation: int = 1):
        super().__init__()
        self.accumulation = max(1, int(accumulation))
        self.start_update = int(start_update)
        self._batches = 0

    @property
    def updates(self) -> int:
        """Updates applied so far (the run's step)."""
        return self.start_update + self._batches // self.accumulation

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1


class RunDirCheckpoint(_UpdateCounter):
    """Saves ``MODEL_DIR/ckpt-N.weights.h5`` every ``every`` updates and at the end.

    Args:
      run_dir: the run directory.
      every: updates between checkpoints (``training.checkpoint_every``).
      keep: newest checkpoints kept (``training.keep_checkpoints``); older ``.weights.h5``
        of the run are deleted.
      start_update: updates applied before this ``fit`` call (a resumed run).
      accumulation: micro-batches per update (``training.gradient_accumulation_steps``).
      signals: the run's :class:`~deep_nmt_tf.health.StopSignals`: after a requested stop,
        the next update's end saves a checkpoint and stops the run (:attr:`interrupted`).
      max_consecutive_skipped: stop when this many updates' worth of micro-batches in a row
        were skipped as non-finite (``training.max_consecutive_skipped``; 0: never).
    """

    def __init__(self, run_dir, every: int, keep: int, start_update: int = 0,
                 accumulation: int = 1, signals: Optional[StopSignals] = None,
                 max_consecutive_skipped: int = 0):
        super().__init__(start_update, accumulation)
        self.signals = signals
        self.max_consecutive_skipped = max(0, int(max_consecutive_skipped))
        #: ``(signal name, update, checkpoint)`` once a signal stopped the run.
        self.interrupted: Optional[Tuple[str, int, Optional[str]]] = None
        self.store = CheckpointStore(run_dir)
        self.every = max(1, int(every))
        self.keep = max(1, int(keep))
        self.last_saved: Optional[int] = None
        #: ``(update, why)`` once the run met a non-finite loss or weights (module docstring).
        self.diverged: Optional[Tuple[int, str]] = None

    def save(self) -> Optional[str]:
        """Writes the checkpoint of the current update count (once per count), unless the run
        diverged or the weights are not finite (then it stops the run)."""
        step = self.updates
        if step == self.last_saved or step == 0 or self.diverged:
            return None
        if not _weights_finite(self.model):
            self._diverge(step, "the model's weights are not finite")
            return None
        path = self.store.save(self.model, step, self.keep)
        self.last_saved = step
        logging.info("Saved checkpoint %s", path)
        return path

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self._batches % self.accumulation:
            return  # (In the middle of an update.)
        if self.signals is not None and self.signals.requested:
            self.save()  # (Once per update: a periodic checkpoint here is not written again.)
            path = self.store.latest() if self.last_saved == self.updates else None
            self.interrupted = (self.signals.received, self.updates, path)
            self.model.stop_training = True
        elif self.updates % self.every == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        if self.diverged:
            return
        counts = skip_counts(self.model.optimizer)
        loss = _float((logs or {}).get("loss"))
        if loss is not None and not math.isfinite(loss):
            if counts is None:
                self._diverge(self.updates, f"the mean training loss of the last log window "
                                            f"is {loss}, and the optimizer does not skip "
                                            "non-finite updates")
                return
            if not _weights_finite(self.model):
                self._diverge(self.updates, "the model's weights are not finite")
                return
        limit = self.max_consecutive_skipped * self.accumulation
        if counts is not None and limit and counts[1] >= limit:
            self._diverge(self.updates, f"the last {counts[1]} micro-batches were all skipped "
                                        "because their loss or gradients were not finite "
                                        f"(training.max_consecutive_skipped="
                                        f"{self.max_consecutive_skipped})")

    def on_train_end(self, logs=None):
        self.save()

    def _diverge(self, step: int, why: str) -> None:
        self.diverged = (step, why)
        self.model.stop_training = True
        logging.error("Update %d: %s; stopping without saving", step, why)

    def diverged_message(self) -> str:
        """What :class:`FitDiverged` says: where, why, the last good checkpoint, what to do."""
        step, why = self.diverged
        latest = self.store.latest()
        last = (f"the last good checkpoint is {latest}, which a rerun resumes from" if latest
                else "no checkpoint was written before it (a rerun starts again)")
        return (f"training stopped at update {step}: {why}. Nothing was saved after it, and "
                f"{last}. Lower the learning rate (training.schedule), set training.clip_norm, "
                "or look for bad data.")


def _float(value) -> Optional[float]:
    if value is None:
        return None
    try:
        return float(ops.convert_to_numpy(value))
    except (TypeError, ValueError):
        return None


class ProgressLogger(_UpdateCounter):
    """Progress of a ``fit`` run (module docstring); stops it at ``last_update``.

    Args:
      last_update: the run ends after this many updates (``training.train_steps``).
      start_update: updates before this ``fit`` call.
      accumulation: micro-batches per update.
      batches: the training :class:`~deep_nmt_tf.data.batching.TokenBatches` (for tokens/s;
        ``fit(..., shuffle=False)``); None: no tokens/s.
      stream: where the bar goes (default stderr).
      loss_explosion_factor: warn when a log line's mean loss exceeds this many times the
        lowest so far (``training.loss_explosion_factor``, as in the custom loop; 0: never).
    """

    def __init__(self, last_update: int, start_update: int = 0, accumulation: int = 1,
                 batches=None, stream=None, loss_explosion_factor: float = 0.0):
        super().__init__(start_update, accumulation)
        self.health = HealthMonitor(0, loss_explosion_factor)
        self.last_update = int(last_update)
        self.batches = batches
        self.progress = Progress(last_update, start_update, stream=stream)
        self.history: Dict[str, float] = {}
        self._window = LogWindow(sum_keys=("tokens",), token_keys=("tokens",))
        self._skipped_before = 0

    def _tokens_per_second(self) -> Optional[float]:
        if self.batches is None:
            return None
        return self._window.tokens_per_second()

    def on_train_begin(self, logs=None):
        self.progress.__enter__()
        logging.info("Training with fit (%s backend) from update %d to %d",
                     keras.backend.backend(), self.start_update, self.last_update)
        counts = skip_counts(self.model.optimizer)
        self._skipped_before = counts[0] if counts else 0

    def on_epoch_begin(self, epoch, logs=None):
        self._window = LogWindow(sum_keys=("tokens",), token_keys=("tokens",))

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.batches is not None:
            self._window.add({"tokens": self.batches.tokens(batch)})
        # Every batch (the ETA's start); the loss, a device read on JAX, only for the bar.
        self.progress.update(self.updates, _float((logs or {}).get("loss")) if
                             self.progress.interactive else None, self._tokens_per_second())
        if self.updates >= self.last_update and self._batches % self.accumulation == 0:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        step = self.updates
        loss = _float(logs.get("loss"))
        rate = _float(self.model.optimizer.learning_rate)
        values = {"loss": loss, "learning_rate": rate,
                  "tokens_per_second": self._tokens_per_second()}
        line = [f"loss {loss:.4f}"] if loss is not None else []
        if rate is not None:
            line.append(f"lr {rate:.3e}")
        if values["tokens_per_second"] is not None:
            line.append(f"{values['tokens_per_second']:.0f} tok/s")
        val = _float(logs.get("val_loss"))
        if val is not None:
            values["eval_loss"] = val
            ppl = per_token_metrics(val, val, 1.0)["perplexity"]
            line.append(f"dev loss {val:.4f} (ppl {ppl:.2f})")
        counts = skip_counts(self.model.optimizer)
        skipped = counts[0] - self._skipped_before if counts else 0
        if counts:
            self._skipped_before = counts[0]
            values["skipped_batches"] = float(counts[0])
        if skipped:
            line.append(f"{skipped} skipped")
        logging.info("%s", self.progress.log_line(step, line))
        if skipped:
            logging.warning("update %d: %d micro-batch(es) of this log window skipped because "
                            "their loss or gradients were not finite (%d in the run so far); "
                            "the window's mean loss counts them", step, skipped, counts[0])
        if loss is not None:
            self.health.after_log(step, loss)
        self.history = {k: v for k, v in values.items() if v is not None}

    def on_train_end(self, logs=None):
        self.progress.close()
