"""The runner's periodic actions: what the loop does after a step, declared as a list.

A :class:`PeriodicAction` is ``fn(step, logs)`` every ``every`` steps (and after the last one).
The runner (:meth:`deep_nmt_tf.training.runner.Runner.actions`) declares its own, in this
order: ``progress`` (a terminal's bar), ``log``, ``diagnostics``, ``checkpoint``, ``eval``; a
caller adds hooks ``hook(trainer, step, logs)`` or actions of its own.  An action asks the run to
stop through the runner (:meth:`~deep_nmt_tf.training.runner.Runner.request_stop`): the loop ends
after that step's actions and the runner writes a checkpoint there (no exception travels
through the loop).

No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

__all__ = ["PeriodicAction", "TrainHook", "hook_action"]

#: ``hook(trainer, step, logs)`` called after every update (after logging, checkpointing and
#: evaluation of that step); ``logs`` holds the step's float metrics.
TrainHook = Callable[..., None]


@dataclasses.dataclass
class PeriodicAction:
    """Something the loop does after a step: ``fn(step, logs)`` every ``every`` steps.

    Attributes:
      name: what it is (for readers and error messages).
      every: period in steps; 0 or None: never.
      fn: ``fn(step, logs) -> Optional[dict]``; a returned dict of floats is added to the
        step's ``logs`` (what later actions and hooks see) and to the run's summary.
      at_end: also after the last step of :meth:`Runner.run`.
      exclude_time: leave its time out of the throughput (``tokens_per_second``).
    """

    name: str
    every: Optional[int]
    fn: Callable[[int, Dict[str, float]], Optional[Dict[str, float]]]
    at_end: bool = True
    exclude_time: bool = True

    def due(self, step: int, last: int) -> bool:
        """Whether it runs after ``step`` of a run ending at ``last``."""
        if not self.every:
            return False
        return step % self.every == 0 or (self.at_end and step == last)


def hook_action(trainer, hook: TrainHook) -> PeriodicAction:
    """A ``hook(trainer, step, logs)`` as an action of every step (its time counts as training
    time, as it always did)."""

    def call(step, logs):
        hook(trainer, step, logs)

    return PeriodicAction(getattr(hook, "__name__", "hook"), 1, call, exclude_time=False)
