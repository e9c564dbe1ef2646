"""Learning-rate schedules (Keras 3 ``LearningRateSchedule`` subclasses in ``keras.ops``,
serialisable; every backend: the custom loop and ``compile``/``fit`` use the same objects).

Every schedule is called with the optimizer's update counter ``t`` (``optimizer.iterations``):
the number of updates already applied, so the first update uses ``t = 0``.

* :class:`TransformerSchedule`: Chen et al. 2018, Eq. 2 (Vaswani et al. 2017, "noam")::

      lr(t) = r0 * d_model^-0.5 * min((t+1) * p^-1.5, (t+1)^-0.5)

* :class:`InverseSqrtSchedule`: Fairseq's ``inverse_sqrt`` (used by Wang et al. 2019): linear
  warm-up from ``warmup_init_lr`` to the peak over ``p`` updates, then ``peak * sqrt(p / t)``.
* :class:`ConstantSchedule`: the peak rate, optionally after a linear warm-up.
* ``rnmt_plus``: Chen et al. 2018, Eq. 1, with the replica count ``n`` and the floor
  (:class:`deep_nmt_tf.task.rnmt_schedule.RNMTPlusSchedule`).
* :class:`UpdateCountSchedule`: any of them read at ``t // k``, for Keras optimizers with
  ``gradient_accumulation_steps=k`` (they call the schedule with the micro-batch counter).

:func:`build_schedule` builds the schedule that ``training.schedule.type`` names, from its own
option section (``training.schedule.<type>``).  A new schedule registers its builder and its
options dataclass together (the config then accepts ``training.schedule.type: my_schedule``)::

    @dataclasses.dataclass
    class MyScheduleOptions:
        learning_rate: float = field(1e-3, "The rate.", min=0.0, min_exclusive=True)

    @register_schedule("my_schedule", options=MyScheduleOptions)
    def _build_my_schedule(options, config, num_replicas):
        return MySchedule(options.learning_rate)
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import keras
from keras import ops

__all__ = [
    "TransformerSchedule",
    "InverseSqrtSchedule",
    "ConstantSchedule",
    "UpdateCountSchedule",
    "SCHEDULE_BUILDERS",
    "register_schedule",
    "build_schedule",
]


def _step_as_float(step):
    return ops.cast(step, "float32")


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Chen et al. 2018, Eq. 2: ``r0 * d_model^-0.5 * min((t+1) * p^-1.5, (t+1)^-0.5)``.

    The rate grows linearly for ``p`` updates, peaks at ``r0 * (d_model * p)^-0.5`` (at
    ``t + 1 = p``) and then decays with the inverse square root of the step.

    Args:
      scale: ``r0`` (``training.schedule.transformer.scale``; 2.0 for Transformer Base, 3.0
        for Big).
      d_model: model dimension.
      warmup_steps: ``p`` (>= 1).

    Example:
      >>> s = TransformerSchedule(2.0, 512, 4000)
      >>> round(float(s(3999)), 8)  # the peak: 2 * (512 * 4000) ** -0.5
      0.00139754
    """

    def __init__(self, scale: float, d_model: int, warmup_steps: int):
        if warmup_steps < 1:
            raise ValueError(f"TransformerSchedule needs warmup_steps >= 1, got {warmup_steps}")
        if d_model < 1:
            raise ValueError(f"TransformerSchedule needs d_model >= 1, got {d_model}")
        self.scale = float(scale)
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        t1 = _step_as_float(step) + 1.0
        factor = self.scale * self.d_model ** -0.5
        return factor * ops.minimum(t1 * self.warmup_steps ** -1.5, ops.rsqrt(t1))

    def get_config(self):
        return {"scale": self.scale, "d_model": self.d_model, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Fairseq ``inverse_sqrt``: linear warm-up, then ``peak * sqrt(warmup / t)``.

    ::

        lr(t) = warmup_init_lr + t * (peak - warmup_init_lr) / p     for t < p
        lr(t) = peak * sqrt(p / t)                                   for t >= p

    ``t`` is the number of updates done (Fairseq sets the rate of update ``t + 1`` from
    ``num_updates = t``), so the first update uses ``warmup_init_lr`` and update ``p`` (0-based)
    the peak.  With ``p = 0`` there is no warm-up: ``lr(t) = peak / sqrt(max(t, 1))``.

    Args:
      peak_learning_rate: the rate reached at the end of the warm-up.
      warmup_steps: ``p`` (>= 0).
      warmup_init_lr: the rate of the first update.
    """

    def __init__(self, peak_learning_rate: float, warmup_steps: int, warmup_init_lr: float = 0.0):
        if warmup_steps < 0:
            raise ValueError(f"InverseSqrtSchedule needs warmup_steps >= 0, got {warmup_steps}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.warmup_init_lr = float(warmup_init_lr)

    def __call__(self, step):
        t = _step_as_float(step)
        peak = self.peak_learning_rate
        if self.warmup_steps == 0:
            return peak * ops.rsqrt(ops.maximum(t, 1.0))
        p = float(self.warmup_steps)
        warm = self.warmup_init_lr + t * ((peak - self.warmup_init_lr) / p)
        decay = (peak * math.sqrt(p)) * ops.rsqrt(ops.maximum(t, p))
        return ops.where(t < p, warm, decay)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate, "warmup_steps": self.warmup_steps,
                "warmup_init_lr": self.warmup_init_lr}


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class ConstantSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A constant rate, optionally reached by a linear warm-up.

    ::

        lr(t) = lr * min(1, (t + 1) / p)      (p = warmup_steps; p = 0: lr(t) = lr)

    Args:
      learning_rate: the constant rate.
      warmup_steps: ``p`` (>= 0); 0 disables the warm-up.
    """

    def __init__(self, learning_rate: float, warmup_steps: int = 0):
        if warmup_steps < 0:
            raise ValueError(f"ConstantSchedule needs warmup_steps >= 0, got {warmup_steps}")
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        t1 = _step_as_float(step) + 1.0
        if self.warmup_steps == 0:
            return ops.ones_like(t1) * self.learning_rate
        return self.learning_rate * ops.minimum(1.0, t1 / float(self.warmup_steps))

    def get_config(self):
        return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class UpdateCountSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule(t // k)``: a schedule of updates, driven by a counter of micro-batches.

    A Keras optimizer built with ``gradient_accumulation_steps=k`` applies an update every
    ``k`` calls and reads its learning-rate schedule with the number of calls (Keras documents
    this: "learning rate schedules will look at 'real' iterations value").  Wrapped in this
    class, the schedule sees the number of updates applied, as in the custom loop: update
    ``j`` (0-based, applied on call ``j*k + k-1``) uses ``schedule(j)``.

    Args:
      schedule: a ``LearningRateSchedule`` of updates.
      steps: ``k`` (>= 1).
    """

    def __init__(self, schedule, steps: int):
        if int(steps) < 1:
            raise ValueError(f"UpdateCountSchedule needs steps >= 1, got {steps}")
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        self.schedule = schedule
        self.steps = int(steps)

    def __call__(self, step):
        return self.schedule(ops.floor_divide(step, self.steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "steps": self.steps}


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

#: ``training.schedule.type`` -> ``builder(options, config, num_replicas) -> schedule``.
SCHEDULE_BUILDERS: Dict[str, Callable] = {}


def register_schedule(name: str, options: Optional[type] = None):
    """Decorator registering ``builder(options, config, num_replicas)`` as
    ``training.schedule.type: name``; ``options`` is its options dataclass (the section
    ``training.schedule.<name>``; the package's own are in ``deep_nmt_tf.config.schema``)."""
    from deep_nmt_tf.config import SCHEDULE_TYPES

    def wrap(builder):
        if name in SCHEDULE_BUILDERS:
            raise ValueError(f"learning-rate schedule {name!r} is already registered")
        if options is not None:
            SCHEDULE_TYPES.register(name, options)
        elif name not in SCHEDULE_TYPES:
            raise ValueError(f"register_schedule({name!r}): no options dataclass registered for "
                             "this schedule; pass options=...")
        SCHEDULE_BUILDERS[name] = builder
        return builder

    return wrap


@register_schedule("transformer")
def _build_transformer(options, config, num_replicas):
    return TransformerSchedule(options.scale, config.model.d_model, options.warmup_steps)


@register_schedule("inverse_sqrt")
def _build_inverse_sqrt(options, config, num_replicas):
    return InverseSqrtSchedule(options.learning_rate, options.warmup_steps,
                               options.warmup_init_lr)


@register_schedule("constant")
def _build_constant(options, config, num_replicas):
    return ConstantSchedule(options.learning_rate, options.warmup_steps)


@register_schedule("rnmt_plus")
def _build_rnmt_plus(options, config, num_replicas):
    from deep_nmt_tf.task.rnmt_schedule import RNMTPlusSchedule

    return RNMTPlusSchedule.from_options(options, num_replicas)


def build_schedule(config, num_replicas: int = 1
                   ) -> keras.optimizers.schedules.LearningRateSchedule:
    """The schedule that ``config.training.schedule`` describes.

    Args:
      config: a :class:`deep_nmt_tf.config.Config` (the model section gives ``d_model``).
      num_replicas: replicas training concurrently (the RNMT+ schedule depends on it).
    """
    schedule = config.training.schedule
    try:
        builder = SCHEDULE_BUILDERS[schedule.type]
    except KeyError:
        raise ValueError(f"training.schedule.type: unknown schedule {schedule.type!r} (known: "
                         f"{', '.join(sorted(SCHEDULE_BUILDERS))})") from None
    return builder(schedule.get(), config, num_replicas)
