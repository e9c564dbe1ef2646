"""The translation task shared by both training routes (``keras.ops``, every backend).

* :mod:`.translation`: :class:`TranslationTask` (model, loss, schedule, optimizer, weight-decay
  mask, metrics of a config), :func:`build_optimizer` (the one Adam builder),
  :func:`decayed_variable_mask`, :func:`per_token_metrics`;
* :mod:`.losses`: the label-smoothed cross-entropy (sums for the custom loop,
  :class:`LabelSmoothedCrossEntropy` for ``compile``);
* :mod:`.schedules`, :mod:`.rnmt_schedule`: the learning-rate schedules and their registry
  (``register_schedule``);
* :mod:`.skipping`: :class:`SkipNonFiniteUpdates`, the optimizer wrapper that gives ``fit``
  the custom loop's skipping of non-finite updates.

The custom ``tf.distribute`` loop (:mod:`deep_nmt_tf.training`) and Keras ``compile``/``fit``
(:mod:`deep_nmt_tf.fit`) both build on this package, and on nothing of each other.
"""

from deep_nmt_tf.task.losses import (LabelSmoothedCrossEntropy, LossSums, cross_entropy_sums,
                                     loss_denominator)
from deep_nmt_tf.task.rnmt_schedule import RNMTPlusSchedule, rnmt_plus_learning_rate
from deep_nmt_tf.task.schedules import (SCHEDULE_BUILDERS, ConstantSchedule,
                                        InverseSqrtSchedule, TransformerSchedule,
                                        UpdateCountSchedule, build_schedule, register_schedule)
from deep_nmt_tf.task.skipping import (SkipNonFiniteUpdates, batches_consumed, skip_counts,
                                      updates_read)
from deep_nmt_tf.task.translation import (TranslationTask, build_optimizer,
                                          decayed_variable_mask, per_token_metrics)

__all__ = [
    "LabelSmoothedCrossEntropy",
    "LossSums",
    "cross_entropy_sums",
    "loss_denominator",
    "RNMTPlusSchedule",
    "rnmt_plus_learning_rate",
    "SCHEDULE_BUILDERS",
    "ConstantSchedule",
    "InverseSqrtSchedule",
    "TransformerSchedule",
    "UpdateCountSchedule",
    "build_schedule",
    "register_schedule",
    "SkipNonFiniteUpdates",
    "batches_consumed",
    "skip_counts",
    "updates_read",
    "TranslationTask",
    "build_optimizer",
    "decayed_variable_mask",
    "per_token_metrics",
]
