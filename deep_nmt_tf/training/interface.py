"""What the runner asks of a trainer: the declared, narrow interface between them.

The runner (:mod:`deep_nmt_tf.training.runner`, Orbit's ``Controller``) builds the trainer and
owns everything around the update: the run directory, resume, checkpoints, evaluation, logs and
the loop's actions.  The trainer (:class:`deep_nmt_tf.training.Trainer`, or any object with
these members) only knows how to take a step; it holds no reference to the runner.

:class:`TrainerInterface` is what the loop, the checkpoints and the logs use;
:class:`DevEvaluation` what dev evaluation and the gate diagnostics use in addition (a trainer
without it is trained without dev evaluation).  A trainer is made by a factory
``factory(config, run_dir, strategy, **options)`` (a trainer class is one) that prepares its
data and returns the trainer built inside the strategy scope; ``trainer.config`` is then the
resolved config (``model.vocab_size`` filled in), which the runner records in the run
directory.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Protocol, Tuple, runtime_checkable

__all__ = ["TrainerInterface", "DevEvaluation"]


@runtime_checkable
class TrainerInterface(Protocol):
    """The update step, what a checkpoint holds and the counters.

    Attributes:
      config: the resolved config the trainer was built from.
      model: the Keras model being trained (warm start, diagnostics, the run's summary).
      optimizer: its ``iterations`` count the updates applied (the schedule reads them).
      step: ``tf.Variable`` (int64): update attempts, skipped ones included; numbers the
        checkpoints.
      skipped_updates: ``tf.Variable`` (int64): updates skipped (non-finite, or by a transform).
      data_position: ``tf.Variable`` (int64): training micro-batches consumed (a resumed run
        skips them).
      accumulation_steps: micro-batches per update.
      SUM_KEYS: the entries of :meth:`train_step`'s result that are sums over the update's
        batch (added up over a log window; the others are values of the update).
    """

    config: Any
    model: Any
    optimizer: Any
    step: Any
    skipped_updates: Any
    data_position: Any
    accumulation_steps: int
    SUM_KEYS: Tuple[str, ...]

    def train_step(self, iterator, diagnostics: bool = False) -> Dict[str, Any]:
        """One update from ``accumulation_steps`` micro-batches of ``iterator``; returns its
        metrics (float32 scalars): the ``SUM_KEYS`` (``loss_sum``, ``nll_sum``,
        ``num_tokens``, ``source_tokens`` ... of the update), ``grad_norm``, ``skipped``
        (1.0: not applied), ``learning_rate`` and, with ``diagnostics``, the grad-norm ratio
        (``grad_norm_ratio``, ``grad_norm_h1``, ``grad_norm_hN``)."""

    def checkpoint_items(self) -> Dict[str, object]:
        """The objects a training checkpoint holds, by name (``tf.train.Checkpoint``'s
        children): the model, the optimizer, the counters and any other state."""

    def distributed_iterator(self, skip: int = 0):
        """An iterator over the training micro-batches (an endless, deterministic stream),
        after dropping the first ``skip``."""


@runtime_checkable
class DevEvaluation(Protocol):
    """What the dev evaluation (:class:`~deep_nmt_tf.training.evaluation.Evaluator`) and the
    gate diagnostics read of a trainer, besides :class:`TrainerInterface`."""

    def compute_loss(self, batch, training: bool):
        """Loss sums (:class:`~deep_nmt_tf.task.LossSums`) of one batch."""

    def build_eval_dataset(self) -> Optional[Any]:
        """Dev batches in corpus order with ``target_text``, or None without a dev set."""

    def build_train_dataset(self, input_context) -> Any:
        """The training micro-batches (the gates' fixed batch when there is no dev set)."""

    def detokenize(self, ids) -> Any:
        """Output ids ``[B, L]`` -> a list of strings."""
