"""Stopping a training run cleanly on SIGTERM or Ctrl-C, for both routes (the custom loop's
:class:`~deep_nmt_tf.training.runner.Runner` and ``fit``'s
:class:`~deep_nmt_tf.fit.callbacks.RunDirCheckpoint`).

While a run trains, SIGTERM (what clusters and schedulers send before preempting a job) and
SIGINT (Ctrl-C) only *request* a stop (:class:`StopSignals`); the training finishes the current
update, saves a checkpoint at that step and raises :class:`TrainingInterrupted` (a
``KeyboardInterrupt``), whose message says how to resume.  A second signal stops at once.

No TensorFlow here (``fit`` runs on a machine with only JAX).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Optional

from absl import logging

__all__ = ["StopSignals", "TrainingInterrupted"]


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
