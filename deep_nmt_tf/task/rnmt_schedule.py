"""The RNMT+ learning-rate schedule (Chen et al. 2018, Eq. 1) with its floor.

::

    lr(t) = max( base * min( 1 + t*(n-1)/(n*p),  n,  n * (2n)^((s - n*t)/(e - s)) ),  floor )

``t``: the optimizer's update counter (``optimizer.iterations``, 0 for the first update);
``n``: concurrent model replicas; ``p``: warm-up steps; ``s``/``e``: start/end of the
exponential decay; ``base`` = 1e-4; ``floor`` = 5e-5.

Shape of the curve, read off the closed form:

* warm-up: linear from ``base`` (t = 0) towards ``n * base``, which the ramp reaches at
  ``t = n * p`` (not ``p``: the ramp's slope is ``(n-1)/(n*p)``); with ``n = 1`` there is no
  warm-up at all (the rate starts at ``base``);
* plateau at ``n * base`` until ``n * t = s``;
* exponential decay by a factor ``2n`` over ``n * t`` in ``[s, e]``: at ``n * t = e`` the
  rate is ``base / 2`` (= 5e-5 for the paper's base);
* the closed form keeps decaying after ``e``; the paper holds the rate at 5e-5 from then on.
  ``max(., floor)`` does that: with the paper's values (floor = base / 2) the floor takes over
  exactly at ``n * t = e``.  (A floor below ``base / 2`` lets the decay continue until it
  reaches the floor; one above it starts earlier.)

Registered in :mod:`deep_nmt_tf.task.schedules` as ``training.schedule.type: rnmt_plus``
(options: ``training.schedule.rnmt_plus``).

References:
  Chen et al. 2018, "The Best of Both Worlds", section 4.2, Eq. 1 (the formula above); the
  paper's WMT'14 En-De values: p = 500, s = 600000, e = 1200000 with n = the number of
  replicas (Chen et al. appendix); Lingvo's ``WmtEnDeRNMT`` params start the decay at
  s = 400000.
"""

from __future__ import annotations

import math

import keras
from keras import ops

__all__ = ["RNMTPlusSchedule", "rnmt_plus_learning_rate"]


def rnmt_plus_learning_rate(step, num_replicas, warmup_steps, decay_start, decay_end,
                            base_learning_rate=1e-4, min_learning_rate=5e-5):
    """Eq. 1 with the floor, in plain Python floats (reference for tests and plots)."""
    n, t = float(num_replicas), float(step)
    p, s, e = float(warmup_steps), float(decay_start), float(decay_end)
    warm = n if p == 0 else 1.0 + t * (n - 1.0) / (n * p)
    exponent = (s - n * t) / (e - s)
    decay = n * math.exp(min(exponent * math.log(2.0 * n), 700.0))
    return max(base_learning_rate * min(warm, n, decay), min_learning_rate)


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class RNMTPlusSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """RNMT+ schedule: Chen et al. 2018, Eq. 1, held at ``min_learning_rate`` after the decay.

    Args:
      num_replicas: ``n``, the number of concurrent model replicas (>= 1).
      warmup_steps: ``p`` (>= 0; 0 = no warm-up).
      decay_start: ``s`` (>= 0).
      decay_end: ``e`` (> ``s``).
      base_learning_rate: the 1e-4 of Eq. 1.
      min_learning_rate: the floor (5e-5 in the paper).

    Example:
      >>> sched = RNMTPlusSchedule(num_replicas=16, warmup_steps=500, decay_start=600000,
      ...                          decay_end=1200000)
      >>> [round(float(sched(t)), 7) for t in (0, 8000, 10**6)]  # start, plateau (16 x), floor
      [0.0001, 0.0016, 5e-05]

    References:
      Chen et al. 2018, Eq. 1 and the sentence after it (the 5e-5 floor).
    """

    def __init__(self, num_replicas=1, warmup_steps=500, decay_start=600000, decay_end=1200000,
                 base_learning_rate=1e-4, min_learning_rate=5e-5):
        if int(num_replicas) < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if warmup_steps < 0 or decay_start < 0:
            raise ValueError(f"warmup_steps and decay_start must be >= 0, got "
                             f"{warmup_steps} and {decay_start}")
        if decay_end <= decay_start:
            raise ValueError(f"decay_end ({decay_end}) must be > decay_start ({decay_start})")
        if base_learning_rate <= 0 or min_learning_rate < 0:
            raise ValueError("base_learning_rate must be > 0 and min_learning_rate >= 0")
        self.num_replicas = int(num_replicas)
        self.warmup_steps = int(warmup_steps)
        self.decay_start = int(decay_start)
        self.decay_end = int(decay_end)
        self.base_learning_rate = float(base_learning_rate)
        self.min_learning_rate = float(min_learning_rate)

    @classmethod
    def from_options(cls, options, num_replicas):
        """Builds from ``training.schedule.rnmt_plus`` (``learning_rate`` is the base,
        ``warmup_steps`` is ``p``, ``decay_start``/``decay_end`` are ``s``/``e``)."""
        return cls(num_replicas=num_replicas, warmup_steps=options.warmup_steps,
                   decay_start=options.decay_start, decay_end=options.decay_end,
                   base_learning_rate=options.learning_rate,
                   min_learning_rate=options.min_learning_rate)

    def __call__(self, step):
        t = ops.cast(step, "float32")
        n = float(self.num_replicas)
        s, e = float(self.decay_start), float(self.decay_end)
        if self.warmup_steps == 0:
            warm = ops.full_like(t, n)
        else:
            warm = 1.0 + t * ((n - 1.0) / (n * self.warmup_steps))
        exponent = (s - n * t) / (e - s)
        # (2n)^x as exp(x * log 2n), the exponent capped so that float32 cannot overflow to inf
        # (the minimum with n makes large values irrelevant anyway).
        decay = n * ops.exp(ops.minimum(exponent * math.log(2.0 * n), 80.0))
        lr = self.base_learning_rate * ops.minimum(ops.minimum(warm, n), decay)
        return ops.maximum(lr, self.min_learning_rate)

    def get_config(self):
        return {
            "num_replicas": self.num_replicas,
            "warmup_steps": self.warmup_steps,
            "decay_start": self.decay_start,
            "decay_end": self.decay_end,
            "base_learning_rate": self.base_learning_rate,
            "min_learning_rate": self.min_learning_rate,
        }
