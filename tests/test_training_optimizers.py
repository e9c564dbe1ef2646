"""Optimizer construction, L2 weight decay, gradient transforms, strategy names."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.task import build_optimizer, decayed_variable_mask
from deep_nmt_tf.training import optimizers
from deep_nmt_tf.training.strategy import is_chief, make_strategy
from test_training_helpers import tiny_config


def test_adam_hyper_parameters_from_config():
    cfg = tiny_config(adam_beta1=0.8, adam_beta2=0.997, adam_epsilon=1e-6)
    opt = build_optimizer(cfg, 1e-3, optimizer_class=optimizers.ReducedGradientsAdam)
    assert isinstance(opt, keras.optimizers.Adam)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.8, 0.997, 1e-6)


def test_adam_without_strategy_is_plain_adam():
    cfg = tiny_config()
    w1 = keras.Variable(np.ones([3, 2], np.float32))
    w2 = keras.Variable(np.ones([3, 2], np.float32))
    ours = build_optimizer(cfg, 0.1, optimizer_class=optimizers.ReducedGradientsAdam)
    ref = keras.optimizers.Adam(0.1, beta_1=cfg.training.adam_beta1,
                                beta_2=cfg.training.adam_beta2,
                                epsilon=cfg.training.adam_epsilon)
    g = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    for _ in range(3):
        ours.apply([g], [w1])
        ref.apply([g], [w2])
    np.testing.assert_array_equal(w1.numpy(), w2.numpy())


def test_weight_decay_is_l2_on_kernels_only():
    kernel = tf.Variable(np.full([2, 3], 2.0, np.float32))
    bias = tf.Variable(np.full([3], 2.0, np.float32))
    variables = [kernel, bias]
    mask = decayed_variable_mask(variables)
    assert mask == [True, False]
    grads = [tf.zeros([2, 3]), tf.zeros([3])]
    out = optimizers.add_l2_gradients(grads, variables, 0.1, mask)
    np.testing.assert_allclose(out[0].numpy(), 0.2)
    np.testing.assert_allclose(out[1].numpy(), 0.0)
    # The added gradient is the gradient of wd * ||w||^2 / 2.
    with tf.GradientTape() as tape:
        penalty = optimizers.l2_penalty(variables, 0.1, mask)
    np.testing.assert_allclose(penalty.numpy(), 0.5 * 0.1 * 6 * 4.0, rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(penalty, kernel).numpy(), out[0].numpy())
    assert optimizers.add_l2_gradients(grads, variables, 0.0, mask) == grads


def test_clip_by_global_norm():
    clip = optimizers.ClipByGlobalNorm(1.0)
    grads = [tf.constant([3.0, 0.0]), tf.constant([4.0])]
    stats = {"grad_norm": tf.linalg.global_norm(grads)}
    out = clip(grads, None, stats)
    np.testing.assert_allclose(tf.linalg.global_norm(out).numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[0].numpy(), [0.6, 0.0], rtol=1e-6)
    assert stats["grad_clipped"].numpy() == 1.0
    small = [tf.constant([0.3]), tf.constant([0.4])]
    stats = {"grad_norm": tf.linalg.global_norm(small)}
    np.testing.assert_allclose(clip(small, None, stats)[1].numpy(), [0.4])
    assert stats["grad_clipped"].numpy() == 0.0
    assert optimizers.build_gradient_transforms(tiny_config(clip_norm=0.0)) == []
    (t,) = optimizers.build_gradient_transforms(tiny_config(clip_norm=5.0))
    assert isinstance(t, optimizers.ClipByGlobalNorm) and t.clip_norm == 5.0
    with pytest.raises(ValueError, match="clip_norm"):
        optimizers.ClipByGlobalNorm(0.0)


def test_strategies(monkeypatch):
    assert make_strategy("default") is tf.distribute.get_strategy()
    assert is_chief(make_strategy("default"))
    with pytest.raises(ValueError, match="unknown strategy 'horovod'.*default, mirrored"):
        make_strategy("horovod")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        make_strategy("multi_worker")
