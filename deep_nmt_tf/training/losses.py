"""The label-smoothed loss of the custom loop: :mod:`deep_nmt_tf.fit.losses` (``keras.ops``,
every backend), re-exported here where the trainer and older code import it."""

from deep_nmt_tf.fit.losses import LossSums, cross_entropy_sums, loss_denominator

__all__ = ["LossSums", "cross_entropy_sums", "loss_denominator"]
