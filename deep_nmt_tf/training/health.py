"""Training health: stop with a clear message instead of failing silently or losing work.

The runner (:mod:`deep_nmt_tf.training.runner`) uses three pieces, each fed with values the loop
already reads (the step's metrics are fetched as Python floats after every update), so none of
them adds work to a training step:

* :class:`StopSignals`: while the loop runs, SIGTERM (what clusters and schedulers send before
  preempting a job) and SIGINT (Ctrl-C) only *request* a stop.  The runner finishes the current
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
  so far gets a WARNING (again at each further factor).
* :class:`WorkerLost`: under ``MultiWorkerMirroredStrategy`` a worker that stops responding
  (killed, machine lost) makes the collectives of the others fail once the coordination
  service's heartbeat times out (``deep-nmt-train --worker_timeout``); the runner turns that
  error into this one, which says how to restart.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
from typing import Dict, Optional, Tuple

from absl import logging

__all__ = ["TrainingInterrupted", "TrainingDiverged", "WorkerLost", "StopSignals",
           "HealthMonitor"]


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


class TrainingDiverged(RuntimeError):
    """Too many consecutive updates were skipped as non-finite (the message names the last
    good checkpoint)."""


class WorkerLost(RuntimeError):
    """Another worker of a multi-worker run stopped responding."""


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


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


class HealthMonitor:
    """Non-finite streaks and exploding losses (module docstring).

    Args:
      max_consecutive_skipped: stop after this many consecutive non-finite skipped updates
        (0: never).
      loss_explosion_factor: warn when a window's mean loss exceeds this many times the lowest
        one so far (0: never).
    """

    def __init__(self, max_consecutive_skipped: int, loss_explosion_factor: float):
        self.max_consecutive_skipped = int(max_consecutive_skipped)
        self.loss_explosion_factor = float(loss_explosion_factor)
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

    def after_step(self, step: int, logs: Dict[str, float]) -> None:
        """Updates the streak from the step's metrics.

        Raises:
          TrainingDiverged: the streak reached ``max_consecutive_skipped``.
        """
        if not (logs["skipped"] and not _finite(logs["grad_norm"], logs["loss"])):
            self.streak = 0
            return
        if self.streak == 0:
            self.streak_start = step
        self.streak += 1
        if self.max_consecutive_skipped and self.streak >= self.max_consecutive_skipped:
            raise TrainingDiverged(self._diverged_message(step, logs))

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
