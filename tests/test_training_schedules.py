"""Learning-rate schedules against their formulas; serialisation; the registry."""

import math

import keras
import numpy as np
import pytest

from deep_nmt_tf.task.schedules import (SCHEDULE_BUILDERS, ConstantSchedule,
                                        InverseSqrtSchedule, TransformerSchedule,
                                        build_schedule, register_schedule)
from test_training_helpers import tiny_config


def _lr(schedule, step):
    return float(keras.ops.convert_to_numpy(schedule(np.int64(step))))


@pytest.mark.parametrize("step", [0, 1, 99, 3999, 4000, 10000, 99999])
def test_transformer_schedule_is_eq2(step):
    s = TransformerSchedule(2.0, 512, 4000)
    t1 = step + 1
    expected = 2.0 * 512 ** -0.5 * min(t1 * 4000 ** -1.5, t1 ** -0.5)
    assert _lr(s, step) == pytest.approx(expected, rel=1e-6)


def test_transformer_schedule_peak():
    s = TransformerSchedule(2.0, 512, 4000)
    peak = 2.0 * (512 * 4000) ** -0.5
    assert _lr(s, 3999) == pytest.approx(peak, rel=1e-6)
    assert _lr(s, 3998) < _lr(s, 3999) and _lr(s, 4000) < _lr(s, 3999)


@pytest.mark.parametrize("step", [0, 1, 500, 999, 1000, 1001, 4000, 250000])
def test_inverse_sqrt_schedule(step):
    s = InverseSqrtSchedule(2e-3, 1000, 1e-7)
    if step < 1000:
        expected = 1e-7 + step * (2e-3 - 1e-7) / 1000
    else:
        expected = 2e-3 * math.sqrt(1000 / step)
    assert _lr(s, step) == pytest.approx(expected, rel=1e-5)


def test_inverse_sqrt_without_warmup_and_constant():
    s = InverseSqrtSchedule(1e-3, 0)
    assert _lr(s, 0) == pytest.approx(1e-3) and _lr(s, 4) == pytest.approx(5e-4)
    c = ConstantSchedule(5e-4)
    assert _lr(c, 0) == _lr(c, 10 ** 6) == pytest.approx(5e-4)
    w = ConstantSchedule(5e-4, warmup_steps=10)
    assert _lr(w, 0) == pytest.approx(5e-5) and _lr(w, 9) == _lr(w, 50) == pytest.approx(5e-4)


@pytest.mark.parametrize("schedule", [TransformerSchedule(3.0, 256, 100),
                                      InverseSqrtSchedule(1e-3, 50, 1e-6),
                                      ConstantSchedule(1e-4, 7)])
def test_serialisation_roundtrip(schedule):
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()
    opt = keras.optimizers.Adam(learning_rate=schedule)
    clone = keras.optimizers.Adam.from_config(opt.get_config())
    assert clone.learning_rate.numpy() == pytest.approx(_lr(schedule, 0))


def test_build_schedule_from_config_and_registry():
    cfg = tiny_config(schedule={"type": "transformer",
                                "transformer": {"scale": 2.0, "warmup_steps": 8}})
    s = build_schedule(cfg)
    assert isinstance(s, TransformerSchedule) and s.d_model == 16 and s.warmup_steps == 8
    s = build_schedule(tiny_config(schedule={"type": "inverse_sqrt", "inverse_sqrt": {
        "learning_rate": 1e-3, "warmup_steps": 8, "warmup_init_lr": 1e-6}}))
    assert isinstance(s, InverseSqrtSchedule) and s.warmup_init_lr == 1e-6
    assert set(SCHEDULE_BUILDERS) >= {"transformer", "inverse_sqrt", "constant", "rnmt_plus"}
    s = build_schedule(tiny_config(schedule={"type": "rnmt_plus", "rnmt_plus": {
        "learning_rate": 1e-4, "warmup_steps": 5}}), 4)
    assert s.get_config()["num_replicas"] == 4 and s.get_config()["warmup_steps"] == 5
    with pytest.raises(ValueError, match="already registered"):
        register_schedule("constant")(lambda options, config, n: None)
    cfg.training.schedule.type = "nope"
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        build_schedule(cfg)
    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        TransformerSchedule(2.0, 512, 0)
