"""The translation task: what defines training, whichever loop runs it (``keras.ops``, every
backend; TF Model Garden's ``Task``).

Both training routes take a :class:`TranslationTask` and ask it for the same parts:

=============================  ===================================  ========================
part                           the custom loop (``training/``)      ``compile``/``fit``
=============================  ===================================  ========================
:meth:`~TranslationTask.       inside the strategy scope            before ``compile``
build_model`` (config, dtype
policy of ``precision``)
:meth:`~TranslationTask.       :meth:`~TranslationTask.loss_sums`:  :meth:`~TranslationTask.
loss_sums` / ``build_loss``    numerators and denominators, added   build_loss`` (the same
                               over micro-batches and replicas      value, for ``compile``)
:meth:`~TranslationTask.       read at ``optimizer.iterations``     read at the update count
build_schedule`` (registry:                                         (:class:`~.schedules.
:mod:`.schedules`)                                                  UpdateCountSchedule`)
:func:`build_optimizer`        Adam; the loop clips, accumulates,   Adam that clips,
(Adam from ``adam_*``)         skips non-finite updates and scales  accumulates, skips
                               the loss itself                      non-finite updates
                                                                    (:mod:`.skipping`; and,
                                                                    for float16, scales)
:meth:`~TranslationTask.       ``g + wd * w`` on the masked         L2 regularizers on the
decayed_mask` (weight decay:   variables                            masked variables
rank >= 2)
:meth:`~TranslationTask.       the log window and dev evaluation    the progress line
metrics`
=============================  ===================================  ========================

So the loss, the schedules, the optimizer's hyper-parameters and the weight-decay rule are
written once; what stays route-specific is how an update is run (``tf.distribute`` replicas and
gradient transforms, or ``model.fit``).  No TensorFlow here (the layering test checks it).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import keras

from deep_nmt_tf.task.losses import LabelSmoothedCrossEntropy, LossSums, cross_entropy_sums
from deep_nmt_tf.task.schedules import UpdateCountSchedule, build_schedule
from deep_nmt_tf.task.skipping import SkipNonFiniteUpdates

__all__ = ["TranslationTask", "build_optimizer", "decayed_variable_mask", "per_token_metrics"]


def decayed_variable_mask(variables: Sequence) -> List[bool]:
    """True for the variables L2 weight decay applies to: kernels and embeddings (rank >= 2).

    Biases, LayerNorm scales/offsets, gate biases and other vectors are not decayed; rank-2
    mixing matrices (DLCL, transparent attention) count as kernels under this rule.
    """
    return [len(v.shape) >= 2 for v in variables]


def build_optimizer(config, learning_rate, optimizer_class=None,
                    keras_update: bool = False) -> keras.optimizers.Optimizer:
    """Adam with ``training.adam_beta1/beta2/epsilon`` and the given rate or schedule.

    Args:
      config: the run's :class:`~deep_nmt_tf.config.Config`.
      learning_rate: a float or a ``LearningRateSchedule`` of updates.
      optimizer_class: an ``keras.optimizers.Adam`` subclass (default Adam itself; the custom
        loop passes its :class:`~deep_nmt_tf.training.optimizers.ReducedGradientsAdam`).
      keras_update: the optimizer does what the custom loop does around it (``compile``/
        ``fit``): global-norm clipping (``training.clip_norm``), gradient accumulation
        (``training.gradient_accumulation_steps``, the schedule then read at the update count),
        skipping non-finite updates (:class:`~deep_nmt_tf.task.skipping.SkipNonFiniteUpdates`)
        and, for ``mixed_float16``, dynamic loss scaling (its ``loss_scaling``).

    Build it inside the strategy scope for the custom loop, and call
    ``optimizer.build(trainable_variables)`` before the first ``strategy.run`` (Keras 3
    optimizers cannot create their slots inside a replica function).
    """
    t = config.training
    options = {}
    if keras_update:
        k = t.gradient_accumulation_steps
        if k > 1:
            learning_rate = UpdateCountSchedule(learning_rate, k)
        options = dict(global_clipnorm=t.clip_norm if t.clip_norm > 0 else None,
                       gradient_accumulation_steps=k if k > 1 else None)
    optimizer_class = optimizer_class or keras.optimizers.Adam
    optimizer = optimizer_class(learning_rate=learning_rate, beta_1=t.adam_beta1,
                                beta_2=t.adam_beta2, epsilon=t.adam_epsilon, name="adam",
                                **options)
    if keras_update:
        optimizer = SkipNonFiniteUpdates(optimizer,
                                         loss_scaling=t.precision == "mixed_float16")
    return optimizer


def per_token_metrics(loss_sum: float, nll_sum: float, num_tokens: float) -> Dict[str, float]:
    """``loss`` (label-smoothed) and ``nll`` per target token, and ``perplexity`` (of the
    unsmoothed NLL, capped at ``exp(100)``)."""
    tokens = max(float(num_tokens), 1.0)
    nll = float(nll_sum) / tokens
    return {"loss": float(loss_sum) / tokens, "nll": nll,
            "perplexity": math.exp(min(nll, 100.0))}


class TranslationTask:
    """Model, loss, schedule, optimizer, weight decay and metrics of a config (module
    docstring).

    Args:
      config: the run's resolved :class:`~deep_nmt_tf.config.Config` (``model.vocab_size``
        set).

    Example:
      >>> task = TranslationTask(config)
      >>> model = task.build_model()
      >>> model.compile(optimizer=task.build_optimizer(keras_update=True),
      ...               loss=task.build_loss())
    """

    def __init__(self, config):
        self.config = config

    # -- settings of the update -------------------------------------------------------------
    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per update (``training.gradient_accumulation_steps``)."""
        return self.config.training.gradient_accumulation_steps

    @property
    def clip_norm(self) -> float:
        """Global-norm clipping threshold (``training.clip_norm``; 0: none)."""
        return self.config.training.clip_norm

    @property
    def weight_decay(self) -> float:
        """L2 weight decay ``wd`` (``training.weight_decay``): ``wd * ||w||^2 / 2``."""
        return self.config.training.weight_decay

    # -- parts --------------------------------------------------------------------------------
    def build_model(self, dtype: Optional[str] = None):
        """The :class:`~deep_nmt_tf.models.Seq2SeqModel` of ``config.model``, built, with the
        dtype policy of ``training.precision`` (or ``dtype``)."""
        from deep_nmt_tf.models import build_model

        return build_model(self.config, dtype=dtype or self.config.training.precision)

    def loss_sums(self, logits, target_output_ids) -> LossSums:
        """The label-smoothed loss of a batch as sums (numerator and denominators)."""
        return cross_entropy_sums(logits, target_output_ids,
                                  self.config.training.label_smoothing)

    def build_loss(self) -> LabelSmoothedCrossEntropy:
        """The same loss as a Keras loss (the sum over ``training.loss_normalization``'s
        denominator), for ``compile``."""
        t = self.config.training
        return LabelSmoothedCrossEntropy(t.label_smoothing, t.loss_normalization)

    def build_schedule(self, num_replicas: int = 1):
        """The ``training.schedule`` of updates (``num_replicas``: the RNMT+ schedule's ``n``)."""
        return build_schedule(self.config, num_replicas=num_replicas)

    def build_optimizer(self, num_replicas: int = 1, optimizer_class=None,
                        keras_update: bool = False) -> keras.optimizers.Optimizer:
        """:func:`build_optimizer` with :meth:`build_schedule`."""
        return build_optimizer(self.config, self.build_schedule(num_replicas),
                               optimizer_class=optimizer_class, keras_update=keras_update)

    def decayed_mask(self, variables: Sequence) -> List[bool]:
        """:func:`decayed_variable_mask`."""
        return decayed_variable_mask(variables)

    def metrics(self, loss_sum: float, nll_sum: float, num_tokens: float) -> Dict[str, float]:
        """:func:`per_token_metrics`."""
        return per_token_metrics(loss_sum, nll_sum, num_tokens)
