"""The learning-rate schedules and their registry: :mod:`deep_nmt_tf.fit.schedules` (pure
Keras, every backend), re-exported here for the custom loop and older code."""

from deep_nmt_tf.fit.schedules import (SCHEDULE_BUILDERS, ConstantSchedule, InverseSqrtSchedule,
                                       TransformerSchedule, UpdateCountSchedule, build_schedule,
                                       register_schedule)

__all__ = ["TransformerSchedule", "InverseSqrtSchedule", "ConstantSchedule",
           "UpdateCountSchedule", "SCHEDULE_BUILDERS", "register_schedule", "build_schedule"]
