"""``compile`` from a config: the custom loop's loss, schedule, Adam, clipping, accumulation
and weight decay as Keras objects, for ``model.fit`` on any backend.

Every part comes from the :class:`~deep_nmt_tf.task.TranslationTask` that the custom loop
builds on too; :func:`compile_model` maps the ``training`` keys to Keras:

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
                                    ``mixed_float16`` adds dynamic loss scaling
``max_consecutive_skipped``         non-finite updates are skipped and counted (:class:`~.
                                    skipping.SkipNonFiniteUpdates`); the run stops at this
                                    many in a row (:class:`~deep_nmt_tf.fit.callbacks.
                                    RunDirCheckpoint`)
==================================  ========================================================

Two differences remain.  Under gradient accumulation Keras averages the ``k`` micro-batch
gradients, each normalised by its own token (or sentence) count, where the custom loop divides
their sum by the total count: the same update when the micro-batches hold as many tokens,
close to it with token-bucketed batches.  And the dropout masks differ (another random stream).

What ``fit`` cannot do is refused by :func:`check_fit_config` with a
:class:`~deep_nmt_tf.config.ConfigError` naming the key (:data:`UNSUPPORTED`): adaptive
clipping (it skips updates by their gradient norm's history, which fit's step does not
keep), the grad-norm ratio (it
differentiates the encoder layer outputs), spike rollbacks (mid-run restores), warm start (it
reads TensorFlow checkpoints) and freezing.

Distribution: :func:`setup_distribution` turns on ``keras.distribution.DataParallel`` on JAX
when there are several devices (call it before building the model); the batch is then the
global batch, split across the devices, and the loss's denominator is the global count.

No TensorFlow (the layering test checks it).
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence, Tuple

import keras
from absl import logging

from deep_nmt_tf import hardware
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.task import TranslationTask

__all__ = ["UNSUPPORTED", "CACHE_ENV", "check_fit_config", "setup_distribution",
           "use_compilation_cache", "build_fit_model", "compile_model"]

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
    ("training.spike_rollbacks", lambda t: t.spike_rollbacks > 0,
     "rolling back to a checkpoint in the middle of training is the custom loop's (fit's "
     "checkpoints do not record the data position to skip from)"),
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


#: Set to ``off`` to leave JAX's persistent compilation cache as JAX has it (off unless
#: ``JAX_COMPILATION_CACHE_DIR`` names a directory).
CACHE_ENV = "DEEP_NMT_COMPILATION_CACHE"


def use_compilation_cache() -> Optional[str]:
    """On JAX, keeps the compiled training steps across processes: JAX's persistent
    compilation cache in ``$XDG_CACHE_HOME/deep_nmt_tf/jax_compilation_cache`` (default
    ``~/.cache/...``) unless ``JAX_COMPILATION_CACHE_DIR`` already names one or
    ``DEEP_NMT_COMPILATION_CACHE=off``; returns the directory in use (None: no cache, or
    another backend).

    Static shapes compile ``fit``'s step once per length bucket (or shape class:
    ``training.shape_classes``), seconds to a minute each for a deep model; with the cache a
    resumed run, and every run of an architecture already trained on the machine, loads them
    instead (BENCHMARKS.md, "Compiles of fit's step on JAX").
    """
    if _backend() != "jax":
        return None
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current or os.environ.get(CACHE_ENV, "").lower() in ("off", "0", "false", "no"):
        return current or None
    directory = os.path.join(hardware.cache_home(), "jax_compilation_cache")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:  # a read-only home: compile as before
        logging.warning("No JAX compilation cache (%s): %s", directory, e)
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory


def build_fit_model(config: Config):
    """The :class:`~deep_nmt_tf.models.Seq2SeqModel` of ``config.model``, built, with the
    dtype policy of ``training.precision`` (:meth:`~deep_nmt_tf.task.TranslationTask.
    build_model`)."""
    return TranslationTask(config).build_model()


def _add_weight_decay(model, task: TranslationTask) -> List:
    """L2 ``wd * ||w||^2 / 2`` on the trainable variables that the task's weight-decay mask
    selects (the custom loop's rule, :func:`deep_nmt_tf.task.decayed_variable_mask`)."""
    variables = model.trainable_variables
    decayed = [v for v, d in zip(variables, task.decayed_mask(variables)) if d]
    regularizer = (keras.regularizers.L2(task.weight_decay / 2.0) if task.weight_decay > 0
                   else None)
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
    task = TranslationTask(config)
    if num_replicas is None:
        distribution = keras.distribution.distribution()
        num_replicas = len(distribution.device_mesh.devices.flatten()) if distribution else 1
    _add_weight_decay(model, task)
    compile_kwargs.setdefault("jit_compile", True if _backend() == "jax" else
                              bool(config.training.jit_compile) and _backend() == "tensorflow")
    model.compile(optimizer=task.build_optimizer(num_replicas, keras_update=True),
                  loss=task.build_loss(), metrics=metrics, **compile_kwargs)
    return model
