"""``compile`` from a config: the custom loop's loss, schedule, Adam, clipping, accumulation
and weight decay as Keras objects, for ``model.fit`` on any backend.

:func:`compile_model` maps the ``training`` keys the custom loop reads to Keras:

==================================  ========================================================
``training.schedule``               the same ``LearningRateSchedule`` (:mod:`.schedules`),
                                    read at the update count (:class:`~.schedules.
                                    UpdateCountSchedule` under accumulation)
``adam_beta1/beta2/epsilon``        ``keras.optimizers.Adam``
``clip_norm``                       ``global_clipnorm`` (0: none)
``gradient_accumulation_steps``     ``gradient_accumulation_steps`` (> 1)
``label_smoothing``,                :class:`~.losses.LabelSmoothedCrossEntropy` (token or
``loss_normalization``              sentence normalisation)
``weight_decay``                    L2 (``wd * ||w||^2 / 2``) on kernels and embeddings (rank
                                    >= 2), as Keras weight regularizers (``model.losses``)
``jit_compile``                     ``compile(jit_compile=...)`` on TensorFlow (always on JAX)
``precision``                       the model's dtype policy (:func:`build_fit_model`);
                                    ``mixed_float16`` adds Keras' ``LossScaleOptimizer``
==================================  ========================================================

Two differences remain.  Under gradient accumulation Keras averages the ``k`` micro-batch
gradients, each normalised by its own token (or sentence) count, where the custom loop divides
their sum by the total count: the same update when the micro-batches hold as many tokens,
close to it with token-bucketed batches.  And the dropout masks differ (another random stream).

What ``fit`` cannot do is refused by :func:`check_fit_config` with a
:class:`~deep_nmt_tf.config.ConfigError` naming the key (:data:`UNSUPPORTED`): adaptive
clipping (it skips updates, which a Keras optimizer cannot), the grad-norm ratio (it
differentiates the encoder layer outputs), warm start (it reads TensorFlow checkpoints) and
freezing.

Distribution: :func:`setup_distribution` turns on ``keras.distribution.DataParallel`` on JAX
when there are several devices (call it before building the model); the batch is then the
global batch, split across the devices, and the loss's denominator is the global count.

No TensorFlow (the layering test checks it).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import keras

from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.fit.losses import LabelSmoothedCrossEntropy
from deep_nmt_tf.fit.schedules import UpdateCountSchedule, build_schedule

__all__ = ["UNSUPPORTED", "check_fit_config", "setup_distribution", "build_fit_model",
           "build_fit_optimizer", "compile_model"]

#: ``(key, is_set(training), why)``: what ``fit`` refuses.
UNSUPPORTED: Tuple[Tuple[str, Callable, str], ...] = (
    ("training.adaptive_clipping.enabled", lambda t: t.adaptive_clipping.enabled,
     "adaptive clipping skips outlier updates, which a Keras optimizer in fit cannot do"),
    ("training.grad_norm_ratio_every", lambda t: t.grad_norm_ratio_every > 0,
     "the grad-norm ratio differentiates the encoder layer outputs, which fit's train step "
     "does not expose"),
    ("training.warm_start.checkpoint", lambda t: bool(t.warm_start.checkpoint),
     "warm start reads TensorFlow checkpoints (load weights into the model before fit "
     "instead)"),
    ("training.freeze", lambda t: bool(t.freeze),
     "freezing is done by the custom loop's variable list (set layer.trainable = False "
     "before compile instead)"),
)


def check_fit_config(config: Config) -> None:
    """Raises :class:`~deep_nmt_tf.config.ConfigError` for a key that ``fit`` cannot honour,
    naming it, why, and the way out (the custom loop: ``deep-nmt-train``)."""
    for key, is_set, why in UNSUPPORTED:
        if is_set(config.training):
            raise ConfigError(f"{config.source}: {key}: not supported by compile/fit ({why}); "
                              f"train with deep-nmt-train (the custom loop), or turn it off "
                              f"for fit")


def _backend() -> str:
    return keras.backend.backend()


def setup_distribution(devices: Optional[Sequence] = None) -> int:
    """``keras.distribution.DataParallel`` over the devices when there are several and the
    backend is JAX (the Keras distribution API's backend); returns the number of replicas.

    Call it before building the model.  ``devices``: default ``keras.distribution.
    list_devices()`` (e.g. the GPUs, or ``XLA_FLAGS=--xla_force_host_platform_device_count=2``
    CPU devices).
    """
    if _backend() != "jax":
        return 1
    devices = list(devices if devices is not None else keras.distribution.list_devices())
    if len(devices) < 2:
        return 1
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return len(devices)


def build_fit_model(config: Config):
    """The :class:`~deep_nmt_tf.models.Seq2SeqModel` of ``config.model``, built, with the
    dtype policy of ``training.precision``."""
    from deep_nmt_tf.models import Seq2SeqModel

    precision = config.training.precision
    model = Seq2SeqModel(config.model, name="seq2seq",
                         dtype=None if precision == "float32" else precision)
    model.build()
    return model


def build_fit_optimizer(config: Config, num_replicas: int = 1) -> keras.optimizers.Optimizer:
    """Adam with the config's schedule, betas, epsilon, clipping and accumulation (module
    docstring); wrapped in ``LossScaleOptimizer`` for ``mixed_float16``."""
    t = config.training
    schedule = build_schedule(config, num_replicas=num_replicas)
    k = t.gradient_accumulation_steps
    if k > 1:
        schedule = UpdateCountSchedule(schedule, k)
    optimizer = keras.optimizers.Adam(
        learning_rate=schedule, beta_1=t.adam_beta1, beta_2=t.adam_beta2, epsilon=t.adam_epsilon,
        global_clipnorm=t.clip_norm if t.clip_norm > 0 else None,
        gradient_accumulation_steps=k if k > 1 else None, name="adam")
    if t.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _add_weight_decay(model, weight_decay: float) -> List:
    """L2 ``wd * ||w||^2 / 2`` on the trainable variables of rank >= 2 (the custom loop's
    rule, :func:`deep_nmt_tf.training.optimizers.decayed_variable_mask`)."""
    decayed = [v for v in model.trainable_variables if len(v.shape) >= 2]
    regularizer = keras.regularizers.L2(weight_decay / 2.0) if weight_decay > 0 else None
    for variable in decayed:
        variable.regularizer = regularizer
    return decayed


def compile_model(model, config: Config, num_replicas: Optional[int] = None,
                  metrics: Optional[Sequence] = None, **compile_kwargs):
    """Compiles ``model`` for ``fit`` with everything the config's ``training`` section asks
    for (module docstring); returns the model.

    Args:
      model: a built :class:`~deep_nmt_tf.models.Seq2SeqModel` (or a model with its
        interface: inputs ``{"source_ids", "target_input_ids"}``, logits out).
      config: the run's :class:`~deep_nmt_tf.config.Config`.
      num_replicas: replicas of a data-parallel run (the RNMT+ schedule's ``n``); default: the
        devices of the current ``keras.distribution`` (1 without one).
      metrics: passed to ``compile``.
      **compile_kwargs: more ``compile`` arguments (``steps_per_execution`` ...).

    Raises:
      ConfigError: a key fit cannot honour (:func:`check_fit_config`).

    Example:
      >>> model = build_fit_model(config)
      >>> compile_model(model, config)
      >>> model.fit(TokenBatches.from_config(config, TokenIds.load(path), 100), epochs=3)
    """
    check_fit_config(config)
    t = config.training
    if num_replicas is None:
        distribution = keras.distribution.distribution()
        num_replicas = len(distribution.device_mesh.devices.flatten()) if distribution else 1
    _add_weight_decay(model, t.weight_decay)
    compile_kwargs.setdefault("jit_compile", True if _backend() == "jax" else
                              bool(t.jit_compile) and _backend() == "tensorflow")
    model.compile(optimizer=build_fit_optimizer(config, num_replicas),
                  loss=LabelSmoothedCrossEntropy(t.label_smoothing, t.loss_normalization),
                  metrics=metrics, **compile_kwargs)
    return model
