"""The RNMT+ schedule: :mod:`deep_nmt_tf.fit.rnmt_schedule`, re-exported here."""

from deep_nmt_tf.fit.rnmt_schedule import RNMTPlusSchedule, rnmt_plus_learning_rate

__all__ = ["RNMTPlusSchedule", "rnmt_plus_learning_rate"]
