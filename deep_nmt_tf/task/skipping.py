"""An optimizer wrapper that skips non-finite updates, for ``compile``/``fit`` (every backend).

A Keras optimizer applies whatever gradients it is given, so under ``fit`` one batch with a
non-finite loss (an overflow, a bad batch, a spike) makes every weight NaN for good, where the
custom loop (:mod:`deep_nmt_tf.training.trainer`) skips such an update and goes on.
:class:`SkipNonFiniteUpdates` gives ``fit`` the custom loop's behaviour: a micro-batch whose
gradients are not all finite leaves the weights, Adam's moments, the gradient accumulators and
the update counter (``iterations``, hence the learning-rate schedule) as they were, and is
counted in two variables saved with the optimizer:

* ``skipped_batches``: micro-batches skipped since the run began;
* ``consecutive_skipped``: micro-batches skipped since the last applied one (the streak
  ``training.max_consecutive_skipped`` limits; :class:`deep_nmt_tf.fit.callbacks.
  RunDirCheckpoint` stops the run at it).

It is Keras' ``LossScaleOptimizer`` (whose finite-check and skip it reuses, on TensorFlow with
its ``tf.distribute`` merge call, on JAX stateless) with the loss scale optional:
``loss_scaling=True`` (``mixed_float16``) is Keras' dynamic loss scaling as it is; ``False``
keeps the scale at 1 and never changes it, so only the skipping remains.

The data position of a run is therefore ``inner._iterations + skipped_batches`` micro-batches
(:func:`batches_consumed`): ``fit``'s resume reads it from a checkpoint (the update counter
alone lags behind the data by the skipped batches).

Checkpoints written before the counters existed (a bare Adam, or a ``LossScaleOptimizer``
under ``mixed_float16``) load with the counters at 0 (:meth:`SkipNonFiniteUpdates.
load_own_variables`); any other number of saved variables is an error, where Keras only warns
and leaves the optimizer as built (a resumed run would start its schedule again).
"""

from __future__ import annotations

from typing import List

import keras
from absl import logging
from keras import ops

__all__ = ["SkipNonFiniteUpdates", "batches_consumed", "skip_counts", "updates_read"]


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class SkipNonFiniteUpdates(keras.optimizers.LossScaleOptimizer):
    """Skips (and counts) every micro-batch whose gradients are not all finite (module
    docstring).

    Args:
      inner_optimizer: the optimizer that applies the finite updates (Adam, with its clipping
        and gradient accumulation).
      loss_scaling: dynamic loss scaling as ``keras.optimizers.LossScaleOptimizer`` does it
        (``mixed_float16``); False: a fixed scale of 1.
      initial_scale: the first loss scale (default ``2**15`` with loss scaling, else 1).
      dynamic_growth_steps: finite updates between doublings of the scale (loss scaling only).
      name: the optimizer's name.

    Example:
      >>> optimizer = SkipNonFiniteUpdates(keras.optimizers.Adam(1e-3))
      >>> model.compile(optimizer=optimizer, loss=...)
    """

    def __init__(self, inner_optimizer, loss_scaling: bool = False, initial_scale=None,
                 dynamic_growth_steps: int = 2000, name=None, **kwargs):
        if initial_scale is None:
            initial_scale = 2.0 ** 15 if loss_scaling else 1.0
        super().__init__(inner_optimizer, initial_scale=initial_scale,
                         dynamic_growth_steps=dynamic_growth_steps, name=name, **kwargs)
        self.loss_scaling = bool(loss_scaling)

    def build(self, var_list):
        super().build(var_list)
        counter = dict(shape=(), dtype="int", initializer="zeros", aggregation="none")
        self.skipped_batches = self.add_variable(name="skipped_batches", **counter)
        self.consecutive_skipped = self.add_variable(name="consecutive_skipped", **counter)

    def _counters(self):
        return (self.skipped_batches, self.consecutive_skipped)

    def _index(self, variable) -> int:
        return next(i for i, v in enumerate(self.variables) if v is variable)

    # -- the loss scale, only when asked for ---------------------------------------------------

    def scale_loss(self, loss):
        return super().scale_loss(loss) if self.loss_scaling else loss

    # -- stateful (TensorFlow, and any backend's eager apply) -----------------------------------

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        if self.loss_scaling:
            super()._stateful_handle_finite_grads(grads, trainable_variables)
        else:
            self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)
        self.consecutive_skipped.assign(0)

    def _stateful_handle_non_finite_grads(self):
        if self.loss_scaling:
            super()._stateful_handle_non_finite_grads()
        self.skipped_batches.assign_add(1)
        self.consecutive_skipped.assign_add(1)

    # -- stateless (JAX's fit) ----------------------------------------------------------------

    def _stateless_handle_finite_grads(self, optimizer_variables, grads, trainable_variables):
        if self.loss_scaling:
            new_trainable, new_optimizer = super()._stateless_handle_finite_grads(
                optimizer_variables, grads, trainable_variables)
        else:
            own = len(self._variables)
            new_trainable, new_inner = self.inner_optimizer.stateless_apply(
                list(optimizer_variables[own:]), grads, trainable_variables)
            new_optimizer = list(optimizer_variables[:own]) + list(new_inner)
        new_optimizer = list(new_optimizer)
        i = self._index(self.consecutive_skipped)
        new_optimizer[i] = ops.zeros_like(optimizer_variables[i])
        return new_trainable, new_optimizer

    def _stateless_handle_non_finite_grads(self, optimizer_variables, trainable_variables):
        if self.loss_scaling:
            trainable_variables, new_optimizer = super()._stateless_handle_non_finite_grads(
                optimizer_variables, trainable_variables)
        else:
            new_optimizer = optimizer_variables
        new_optimizer = list(new_optimizer)
        for counter in self._counters():
            i = self._index(counter)
            new_optimizer[i] = ops.add(optimizer_variables[i], ops.ones_like(
                optimizer_variables[i]))
        return trainable_variables, new_optimizer

    # -- checkpoints --------------------------------------------------------------------------

    def load_own_variables(self, store):
        """Loads the saved state; a checkpoint from before the counters (a bare inner
        optimizer, or Keras' ``LossScaleOptimizer``) loads with them at 0.

        Raises:
          ValueError: the saved variables match none of these layouts (Keras would only warn
            and keep the optimizer as built).
        """
        saved = len(store.keys())
        if saved == len(self.variables):
            layout: List = list(self.variables)
        else:
            counters = self._counters()
            earlier = [v for v in self.variables if not any(v is c for c in counters)]
            layouts = {len(earlier): earlier,
                       len(self.inner_optimizer.variables): list(self.inner_optimizer.variables)}
            if saved not in layouts:
                raise ValueError(
                    f"the checkpoint's optimizer has {saved} variables; "
                    f"{type(self).__name__} has {len(self.variables)} ({len(earlier)} without "
                    f"its skip counters, {len(self.inner_optimizer.variables)} in the inner "
                    "optimizer): was it written with another optimizer configuration "
                    "(gradient accumulation, precision)?")
            layout = layouts[saved]
            logging.info("The checkpoint's optimizer predates the skip counters (%d variables): "
                         "loaded with them at 0", saved)
        for i, variable in enumerate(layout):
            variable.assign(store[str(i)])

    def get_config(self):
        return dict(super().get_config(), loss_scaling=self.loss_scaling)


def skip_counts(optimizer):
    """``(skipped_batches, consecutive_skipped)`` of a built :class:`SkipNonFiniteUpdates`, as
    ints; None for another optimizer (or one not built).  On JAX during ``fit`` reading them
    copies the training state back into the variables: read them at epoch ends, not per
    batch."""
    if not isinstance(optimizer, SkipNonFiniteUpdates) or not optimizer.built:
        return None
    return tuple(int(ops.convert_to_numpy(v)) for v in optimizer._counters())


def batches_consumed(optimizer) -> int:
    """Micro-batches a ``fit`` run has read: the inner optimizer's calls plus the skipped
    micro-batches (:class:`SkipNonFiniteUpdates`); for another optimizer, its update count
    times its accumulation steps."""
    if isinstance(optimizer, SkipNonFiniteUpdates):
        calls = int(ops.convert_to_numpy(optimizer.inner_optimizer._iterations))
        return calls + int(ops.convert_to_numpy(optimizer.skipped_batches))
    steps = getattr(optimizer, "gradient_accumulation_steps", None) or 1
    return int(ops.convert_to_numpy(optimizer.iterations)) * steps


def updates_read(optimizer) -> int:
    """The data position of a ``fit`` run in updates: :func:`batches_consumed` over the
    gradient accumulation steps (what ``fit``'s checkpoints are named by; ``iterations``, the
    updates applied, lags behind it by the skipped ones)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    steps = getattr(inner, "gradient_accumulation_steps", None) or 1
    return batches_consumed(optimizer) // steps
