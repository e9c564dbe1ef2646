"""Training health: stop with a clear message instead of failing silently or losing work.

Both training routes use it: the custom loop's runner (:mod:`deep_nmt_tf.training.runner`) all
of it, fed with values the loop already reads (the step's metrics are fetched as Python floats
after every update), so none of it adds work to a training step; ``fit``
(:mod:`deep_nmt_tf.fit.callbacks`) the signals and the loss-explosion warning.  No TensorFlow
(``fit`` runs on a machine with only JAX).

* :class:`StopSignals`: while a run trains, SIGTERM (what clusters and schedulers send before
  preempting a job) and SIGINT (Ctrl-C) only *request* a stop.  The run finishes the current
  update, saves a checkpoint at that step and raises :class:`TrainingInterrupted` (a
  ``KeyboardInterrupt``), whose message says how to resume.  A second signal stops at once.
  Under ``MultiWorkerMirroredStrategy`` the request travels with the update's all-reduce
  (``Trainer.stop_requested``), so every worker stops after the same update and the checkpoint
  (a collective) is consistent, whichever worker got the signal.
* :class:`HealthMonitor`: an update skipped because its gradient norm or loss is not finite
  starts a streak; ``training.max_consecutive_skipped`` such updates in a row stop the run with
  :class:`TrainingDiverged`, naming the last checkpoint written before the streak (periodic
  checkpoints are put off while a streak lasts, so the rotation never deletes it).  A log
  window whose mean loss exceeds ``training.loss_explosion_factor`` times the lowest window mean
  so far gets a WARNING (again at each further factor).  An applied update whose gradient norm
  exceeds ``training.grad_spike_factor`` times the median of the previous
  :data:`SPIKE_HISTORY` applied updates also gets one (at most one per :data:`SPIKE_HISTORY`
  updates), and the runner rolls back to the newest checkpoint written before it
  (``training.spike_rollbacks``) or keeps it as a resumable run directory
  (``MODEL_DIR/kept/before_spike_<step>``; :mod:`~deep_nmt_tf.training.spikes`): a spike can
  start a collapse whose loss stays well under the explosion factor (the Tatoeba Admin run of
  docs/RESULTS.md: the loss went from 2.55 to 4.59 while the gradient norm rose 50-fold), and
  by the time anyone looks the rotation has deleted the checkpoints before it.
* :class:`WorkerLost`: under ``MultiWorkerMirroredStrategy`` a worker that stops responding
  (killed, machine lost) makes the collectives of the others fail once the coordination
  service's heartbeat times out (``deep-nmt-train --worker_timeout``); the runner turns that
  error into this one, which says how to restart.
"""

from __future__ import annotations

import collections
import math
import os
import re
import signal
import statistics
import threading
from typing import Dict, Optional, Tuple

from absl import logging

__all__ = ["TrainingInterrupted", "TrainingDiverged", "WorkerLost", "StopSignals",
           "HealthMonitor", "SPIKE_HISTORY", "SPIKE_MIN_HISTORY"]

#: Applied updates whose gradient norms make the median a spike is measured against; also the
#: least number of updates between two spike warnings.
SPIKE_HISTORY = 200
#: Applied updates seen before a spike can be reported (the median needs a history).
SPIKE_MIN_HISTORY = 100


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped at a signal after saving a checkpoint.

    Attributes:
      signal_name: ``SIGTERM``, ``SIGINT``, or ``a signal to another worker`` (multi-worker).
      step: the step reached (and saved).
      checkpoint: the checkpoint written (None on non-chief workers).
    """

    def __init__(self, signal_name: str, step: int, checkpoint: Optional[str]):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        if checkpoint:
            saved = f"saved {checkpoint}"
        elif step:
            saved = "the chief saved a checkpoint"
        else:
            saved = "no update was made, nothing to save"
        super().__init__(f"interrupted by {signal_name} at step {step}; {saved}. Run the same "
                         "command again to resume from it.")

    def __str__(self) -> str:
        return self.args[0]


class StopSignals:
    """A context manager: SIGTERM and SIGINT request a stop (module docstring) while inside.

    Handlers are installed only in the main thread (Python delivers signals there) and only for
    signals that are not ignored; elsewhere the signals keep their previous behaviour.  The
    previous handlers are restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: Optional[str] = None
        self._previous: Dict[int, object] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self.received is not None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) != signal.SIG_IGN:  # (e.g. SIGINT of a background job)
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:  # The second one: stop now, as without this handler.
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        self.received = name
        logging.warning("%s received: stopping after the current update (a checkpoint is "
                        "saved; send %s again to stop at once, without one)", name, name)


class TrainingDiverged(RuntimeError):
    """Too many consecutive updates were skipped as non-finite (the message names the last
    good checkpoint)."""


class WorkerLost(RuntimeError):
    """Another worker of a multi-worker run stopped responding."""


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


class HealthMonitor:
    """Non-finite streaks and exploding losses (module docstring).

    Args:
      max_consecutive_skipped: stop after this many consecutive non-finite skipped updates
        (0: never).
      loss_explosion_factor: warn when a window's mean loss exceeds this many times the lowest
        one so far (0: never).
      grad_spike_factor: warn when an applied update's gradient norm exceeds this many times
        the median of the previous :data:`SPIKE_HISTORY` applied updates (0: never).
    """

    def __init__(self, max_consecutive_skipped: int, loss_explosion_factor: float,
                 grad_spike_factor: float = 0.0):
        self.max_consecutive_skipped = int(max_consecutive_skipped)
        self.loss_explosion_factor = float(loss_explosion_factor)
        self.grad_spike_factor = float(grad_spike_factor)
        #: ``(step, gradient norm)`` of the last applied updates.
        self._norms: "collections.deque[Tuple[int, float]]" = collections.deque(
            maxlen=SPIKE_HISTORY)
        self._next_spike_warning = 0
        #: The last spike: ``{"step", "grad_norm", "median", "history"}`` (None before one).
        self.last_spike: Optional[Dict[str, float]] = None
        self.streak = 0
        self.streak_start = 0
        self.last_checkpoint: Tuple[int, Optional[str]] = (0, None)
        self._lowest: Optional[Tuple[float, int]] = None
        self._warned_ratio = 1.0

    @property
    def in_streak(self) -> bool:
        """Whether the last update was skipped as non-finite."""
        return self.streak > 0

    def checkpoint_saved(self, step: int, path: Optional[str]) -> None:
        """Records the newest checkpoint (restored or written) for the divergence message."""
        self.last_checkpoint = (step, path)

    def after_step(self, step: int, logs: Dict[str, float]) -> bool:
        """Updates the streak and the gradient-norm history from the step's metrics.

        Returns:
          Whether the update's gradient norm is a spike (warned about here).
        Raises:
          TrainingDiverged: the streak reached ``max_consecutive_skipped``.
        """
        if not (logs["skipped"] and not _finite(logs["grad_norm"], logs["loss"])):
            self.streak = 0
            return self._spike(step, logs)
        if self.streak == 0:
            self.streak_start = step
        self.streak += 1
        if self.max_consecutive_skipped and self.streak >= self.max_consecutive_skipped:
            raise TrainingDiverged(self._diverged_message(step, logs))
        return False

    def _spike(self, step: int, logs: Dict[str, float]) -> bool:
        norm = logs["grad_norm"]
        if not self.grad_spike_factor or logs["skipped"] or not math.isfinite(norm):
            return False  # Skipped updates changed nothing (adaptive clipping's outliers).
        spike = False
        if len(self._norms) >= min(SPIKE_MIN_HISTORY, SPIKE_HISTORY):
            typical = statistics.median(n for _, n in self._norms)
            if norm > self.grad_spike_factor * typical and step >= self._next_spike_warning:
                spike = True
                self._next_spike_warning = step + SPIKE_HISTORY
                self.last_spike = {"step": step, "grad_norm": float(norm),
                                   "median": float(typical), "history": len(self._norms)}
                logging.warning(
                    "step %d: gradient-norm spike: %.4g is %.3gx the median of the last %d "
                    "updates (%.4g; training.grad_spike_factor=%g). A spike can start a "
                    "collapse that the loss shows only mildly: watch the next log windows (and "
                    "the grad-norm ratio r_t).", step, norm, norm / max(typical, 1e-30),
                    len(self._norms), typical, self.grad_spike_factor)
        self._norms.append((step, norm))
        return spike

    def rolled_back(self, step: int) -> None:
        """The runner went back to ``step`` (``training.spike_rollbacks``): the norms of the
        updates after it leave the history, and the next spike is reported however soon it
        comes."""
        while self._norms and self._norms[-1][0] > step:
            self._norms.pop()
        self._next_spike_warning = 0

    def _diverged_message(self, step: int, logs: Dict[str, float]) -> str:
        good_step, good = self.last_checkpoint
        if good:
            last = (f"The last good checkpoint is {good} (step {good_step}, before the first "
                    "skipped update); a restart resumes from it")
        else:
            last = ("No checkpoint was written before the first skipped update; a restart "
                    "begins again")
        return (f"training stopped: the last {self.streak} updates (steps {self.streak_start}-"
                f"{step}) were all skipped because the loss or the gradient norm was not finite "
                f"(loss {logs['loss']:g}, gradient norm {logs['grad_norm']:g}; "
                f"training.max_consecutive_skipped={self.max_consecutive_skipped}). {last}. "
                "Lower the learning rate (training.schedule), set training.clip_norm, or look "
                "for bad data.")

    def after_log(self, step: int, loss: float) -> None:
        """Warns when the window's mean ``loss`` grew by ``loss_explosion_factor`` or more."""
        if not self.loss_explosion_factor or not math.isfinite(loss):
            return
        if self._lowest is None or loss < self._lowest[0]:
            self._lowest, self._warned_ratio = (loss, step), 1.0
            return
        lowest, lowest_step = self._lowest
        ratio = loss / max(lowest, 1e-12)
        if ratio >= self.loss_explosion_factor * self._warned_ratio:
            self._warned_ratio = ratio
            logging.warning("step %d: the loss is exploding: %.4g is %.3gx the lowest so far "
                            "(%.4g at step %d; training.loss_explosion_factor=%g). Lower the "
                            "learning rate or set training.clip_norm.", step, loss, ratio,
                            lowest, lowest_step, self.loss_explosion_factor)


_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


def worker_lost(error: Exception, checkpoint: Optional[str]) -> WorkerLost:
    """The :class:`WorkerLost` for a collective error (``UnavailableError`` ...) of a
    multi-worker run, naming the tasks TensorFlow names and the checkpoint to resume from."""
    text = str(error)
    tasks = sorted({f"/job:{job}/task:{task}" for job, task in _TASK.findall(text)})
    who = f" ({', '.join(tasks)})" if tasks else ""
    if "heartbeat" in text:
        reason = ("it stopped sending heartbeats to the coordination service (deep-nmt-train "
                  "--worker_timeout sets how long the others wait)")
    else:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        reason = f"{type(error).__name__}: {lines[0] if lines else ''}"
    resume = (f"from the chief's last checkpoint, {checkpoint}" if checkpoint else
              "from step 0 (no checkpoint was written yet)")
    return WorkerLost(f"another worker of the cluster stopped responding{who}: {reason}. This "
                      "worker stops too. Restart every worker with the same command: training "
                      f"resumes {resume}.")
