"""Adaptive gradient clipping of RNMT+: skip a step whose gradient norm is an outlier.

Chen et al. 2018 (section 4.2): "we keep track of a moving average and a moving standard
deviation of the log of the gradient norm values, and we abort a step if the norm of the
gradient exceeds four standard deviations of the moving average."  Following Lingvo's
``GradNormTracker``:

* ``x = log(max(|g|, 0.01) + 1)`` with ``|g|`` the global gradient norm;
* exponential moving averages (decay 0.995) of ``x``, ``x^2`` and of the constant 1; dividing
  by the last one removes the start-up bias, so ``mean = E[x]`` and
  ``std = sqrt(max(E[x^2] - mean^2, min_stddev^2))`` are usable from the first steps;
* ``threshold = mean + 4 * std``; once ``warmup_steps`` finite norms have been seen, a step
  with ``x > threshold`` is skipped; a step whose norm is NaN/Inf is always skipped;
* the statistics are updated with ``min(x, threshold)`` (after the warm-up; the raw ``x``
  during it) and never with a non-finite value; skipped steps are counted.

Differences from Lingvo, on purpose: Lingvo caps ``x`` from the very first step, when its
statistics are still empty (mean 0, std 1e-3), so its mean first crawls up by ~4e-3 per step; here
the warm-up steps feed the raw ``x``.  Lingvo's implicit warm-up is "EMA weight > 0.75"
(277 steps at decay 0.995); that is the default of ``warmup_steps`` here.

Replicas: the decision must be the same on every replica, so ``|g|`` must be the norm of the
gradients AFTER the cross-replica reduction (``deep_nmt_tf.training.optimizers`` already
hands transforms reduced gradients).  The statistics variables use
``VariableAggregation.ONLY_FIRST_REPLICA``: every replica computes the same update.
Create the clipper inside ``strategy.scope()``.

How a trainer plugs it in.  With :class:`deep_nmt_tf.training.trainer.Trainer`, pass the
transform (its ``build`` runs inside the strategy scope, its statistics are checkpointed as
``transform_<i>_adaptive_clipping``, its scalars are logged, and the trainer does the
conditional update in cross-replica context and counts skipped updates)::

    Trainer(config, model_dir, gradient_transforms=[AdaptiveClippingTransform()])

In a hand-written loop (replica function inside ``tf.function``)::

    clipper = AdaptiveGradientClipping()                  # inside strategy.scope()
    ...
    grads = all_reduced_and_normalised_grads              # identical on every replica
    should_apply, grad_norm = clipper(grads)              # also updates the statistics
    apply_gradients_if(should_apply, optimizer, grads, variables)  # tf.cond; on a skip the
                                                          # weights, Adam slots and
                                                          # optimizer.iterations are unchanged
    summaries = clipper.summaries()                       # scalars for TensorBoard

(With a plain Keras optimizer under a strategy, pass ``apply_gradients_if`` the per-replica
gradients: Keras 3 sums them across replicas itself; ``ReducedGradientsAdam`` takes the
reduced ones.)  Skipped steps do not advance ``optimizer.iterations``, hence not the schedule.

References:
  Chen et al. 2018, "The Best of Both Worlds", section 4.2; Lingvo ``layers.GradNormTracker``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import tensorflow as tf

from deep_nmt_tf import compat
from deep_nmt_tf.training.gradient_transforms import GradientTransform

__all__ = [
    "AdaptiveGradientClipping",
    "AdaptiveClippingTransform",
    "apply_gradients_if",
    "global_norm",
]


def global_norm(grads: Sequence) -> tf.Tensor:
    """Global L2 norm (float32) of a list of gradients; ``None`` entries are ignored."""
    grads = [g for g in grads if g is not None]
    if not grads:
        return tf.constant(0.0)
    return tf.cast(tf.linalg.global_norm(grads), tf.float32)


class AdaptiveGradientClipping(tf.Module):
    """Moving statistics of the log gradient norm and the skip decision (checkpointable).

    Args:
      decay: EMA decay of the statistics (0.995: a window of ~200 steps).
      num_stddevs: the threshold is ``mean + num_stddevs * std`` (4 in the paper).
      warmup_steps: finite norms to see before any step can be skipped for being large; None
        = Lingvo's equivalent, the steps until the EMA weight ``1 - decay^k`` exceeds 0.75.
      norm_floor: ``|g|`` is floored at this value before the log (Lingvo: 0.01).
      min_stddev: floor of the standard deviation (Lingvo: sqrt(1e-6)).
      name: module name (variable prefix).

    Variables (``tf.Variable``, not trainable, checkpointed with the module): ``ema_x``,
    ``ema_x2``, ``ema_weight``, ``num_updates`` (finite norms seen), ``num_skipped``.

    Call:
      ``should_apply, grad_norm = clipper(grads)``: a boolean scalar and the float32 norm;
      the statistics are updated as a side effect.  ``clipper.update(grad_norm)`` does the same
      from a norm.

    Example:
      >>> clipper = AdaptiveGradientClipping(warmup_steps=10)
      >>> for _ in range(20):
      ...     ok, _ = clipper([tf.ones([3]) * 0.5])
      >>> bool(clipper([tf.ones([3]) * 50.0])[0]), int(clipper.num_skipped)
      (False, 1)
    """

    def __init__(self, decay: float = 0.995, num_stddevs: float = 4.0,
                 warmup_steps: Optional[int] = None, norm_floor: float = 0.01,
                 min_stddev: float = 1e-3, name: str = "adaptive_gradient_clipping"):
        super().__init__(name=name)
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if num_stddevs <= 0:
            raise ValueError(f"num_stddevs must be > 0, got {num_stddevs}")
        self.decay = float(decay)
        self.num_stddevs = float(num_stddevs)
        if warmup_steps is None:
            warmup_steps = int(math.ceil(math.log(0.25) / math.log(self.decay)))
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = int(warmup_steps)
        self.norm_floor = float(norm_floor)
        self.min_stddev = float(min_stddev)

        def var(vname, dtype):
            return tf.Variable(tf.zeros([], dtype), trainable=False, name=vname,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        with self.name_scope:
            self.ema_x = var("ema_x", tf.float32)
            self.ema_x2 = var("ema_x2", tf.float32)
            self.ema_weight = var("ema_weight", tf.float32)
            self.num_updates = var("num_updates", tf.int64)
            self.num_skipped = var("num_skipped", tf.int64)

    # ------------------------------------------------------------------ statistics

    def log_norm(self, grad_norm) -> tf.Tensor:
        """``x = log(max(|g|, norm_floor) + 1)`` (float32)."""
        grad_norm = tf.cast(grad_norm, tf.float32)
        return tf.math.log(tf.maximum(grad_norm, self.norm_floor) + 1.0)

    def mean_and_std(self):
        """Bias-corrected moving mean and standard deviation of ``x``."""
        weight = tf.maximum(self.ema_weight, 1e-6)
        mean = self.ema_x / weight
        variance = self.ema_x2 / weight - tf.square(mean)
        std = tf.sqrt(tf.maximum(variance, self.min_stddev ** 2))
        return mean, std

    def threshold(self) -> tf.Tensor:
        """The current threshold on ``x`` (``mean + num_stddevs * std``)."""
        mean, std = self.mean_and_std()
        return mean + self.num_stddevs * std

    def warmed_up(self) -> tf.Tensor:
        return self.num_updates >= self.warmup_steps

    def summaries(self) -> Dict[str, tf.Tensor]:
        """Scalars for TensorBoard: statistics, threshold on |g|, and the skip count."""
        mean, std = self.mean_and_std()
        return {
            "log_grad_norm_mean": mean,
            "log_grad_norm_std": std,
            "grad_norm_threshold": tf.exp(mean + self.num_stddevs * std) - 1.0,
            "skipped_steps": tf.cast(self.num_skipped, tf.float32),
        }

    # ------------------------------------------------------------------ decision

    def update(self, grad_norm) -> tf.Tensor:
        """Decides on the step of global norm ``grad_norm`` and updates the statistics.

        Returns a boolean scalar: True = apply the step, False = skip it.
        """
        grad_norm = tf.cast(grad_norm, tf.float32)
        finite = tf.math.is_finite(grad_norm)
        x = tf.where(finite, self.log_norm(tf.where(finite, grad_norm, 0.0)), 0.0)
        threshold = self.threshold()
        warmed = self.warmed_up()
        outlier = tf.logical_and(warmed, x > threshold)
        skip = tf.logical_or(outlier, tf.logical_not(finite))
        x_used = tf.where(warmed, tf.minimum(x, threshold), x)

        rate = 1.0 - self.decay
        keep = tf.cast(finite, tf.float32)  # 0: leave the statistics as they are
        self.ema_x.assign_add(keep * rate * (x_used - self.ema_x))
        self.ema_x2.assign_add(keep * rate * (tf.square(x_used) - self.ema_x2))
        self.ema_weight.assign_add(keep * rate * (1.0 - self.ema_weight))
        self.num_updates.assign_add(tf.cast(finite, tf.int64))
        self.num_skipped.assign_add(tf.cast(skip, tf.int64))
        return tf.logical_not(skip)

    def __call__(self, grads: Sequence):
        """``(should_apply, grad_norm)`` for the (cross-replica reduced) gradients."""
        norm = global_norm(grads)
        return self.update(norm), norm


class AdaptiveClippingTransform(GradientTransform):
    """:class:`AdaptiveGradientClipping` as a gradient transform of the trainer.

    Reads ``stats["grad_norm"]`` (the trainer's global norm of the reduced gradients) or
    computes it, ORs the decision into ``stats["skip_update"]`` and adds
    ``adaptive_clip_*`` scalars to ``stats``.  Gradients pass through unchanged.  It must see
    the norm BEFORE any clipping: the trainer's ``stats["grad_norm"]`` is that norm whatever
    the transform order; without it, put this transform first.

    Args:
      **clipper_kwargs: arguments of :class:`AdaptiveGradientClipping`.
    """

    def __init__(self, **clipper_kwargs):
        self._kwargs = clipper_kwargs
        self.clipper: Optional[AdaptiveGradientClipping] = None

    def build(self, variables):
        del variables
        if self.clipper is None:
            self.clipper = AdaptiveGradientClipping(**self._kwargs)

    def checkpoint_items(self):
        self.build(None)
        return {"adaptive_clipping": self.clipper}

    def __call__(self, grads, variables, stats):
        self.build(variables)
        norm = stats.get("grad_norm")
        if norm is None:
            norm = global_norm(grads)
        should_apply = self.clipper.update(norm)
        previous = stats.get("skip_update")
        skip = tf.logical_not(should_apply)
        stats["skip_update"] = skip if previous is None else tf.logical_or(previous, skip)
        for key, value in self.clipper.summaries().items():
            stats[f"adaptive_clip_{key}"] = value
        return grads


def apply_gradients_if(should_apply, optimizer, grads: Sequence, variables: Sequence):
    """``optimizer.apply(grads, variables)`` only when ``should_apply`` (a ``tf.cond``).

    On a skip nothing changes: weights, optimizer slots (Adam moments) and
    ``optimizer.iterations`` (so the learning-rate schedule does not advance either).  The
    untaken branch is not executed, so NaN gradients never reach the optimizer.

    Works in a ``tf.function`` under the default strategy and in replica context under a
    ``tf.distribute`` strategy (``should_apply`` must be identical on every replica, as the
    clipper's decision on reduced gradients is).  Strategies that need ``merge_call`` (e.g.
    ``MirroredStrategy``) get the ``tf.cond`` in cross-replica context, as Keras'
    ``LossScaleOptimizer`` does: a ``merge_call`` cannot sit inside a replica-context cond.

    The optimizer is built on ``variables`` first if needed (variables cannot be created inside
    a ``tf.cond`` branch); under a strategy build it beforehand, inside the scope.

    Returns ``should_apply`` as a boolean tensor.
    """
    variables = list(variables)
    grads = list(grads)
    if not optimizer.built:
        optimizer.build(variables)
    should_apply = tf.convert_to_tensor(should_apply, tf.bool)

    def apply_fn():
        optimizer.apply(grads, variables)
        return tf.constant(True)

    def skip_fn():
        return tf.constant(False)

    replica_context = tf.distribute.get_replica_context()
    needs_merge = (tf.distribute.has_strategy() and replica_context is not None
                   and not compat.strategy_supports_no_merge_call())
    if not needs_merge:
        return tf.cond(should_apply, apply_fn, skip_fn)

    def cross_replica(distribution, should_apply_pr, grads_pr):
        # Every replica made the same decision: take the first replica's.
        decision = distribution.experimental_local_results(should_apply_pr)[0]

        def apply_all():
            distribution.extended.call_for_each_replica(
                lambda g: optimizer.apply(list(g), variables), args=(grads_pr,))
            return tf.constant(True)

        return tf.cond(decision, apply_all, skip_fn)

    return replica_context.merge_call(cross_replica, args=(should_apply, grads))
