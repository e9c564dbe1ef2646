"""Mixed precision for training: the dtype policy and float16's dynamic loss scaling.

``training.precision`` names the Keras dtype policy the model is built with
(:func:`deep_nmt_tf.models.build_model`'s ``dtype``):

- ``float32``: everything in float32;
- ``mixed_bfloat16``: float32 variables (and checkpoints), bfloat16 activations and matmuls;
  the layers keep softmax, LayerNorm statistics, the LSTM cell state, the mixing-weight logits
  (DLCL, transparent attention) and the logits handed to the loss in float32.  No loss
  scaling: bfloat16 has float32's exponent range;
- ``mixed_float16``: the same with float16 activations, plus dynamic loss scaling
  (:class:`LossScaling`).

Loss scaling uses Keras's ``keras.optimizers.LossScaleOptimizer`` around the trainer's Adam:
its ``scale_loss``, its ``dynamic_scale`` and ``step_counter`` variables (checkpointed as
``loss_scale`` and ``loss_scale_steps``) and its rule (halve the scale on an overflow, double
it after ``dynamic_growth_steps`` finite steps).  Its ``apply`` is not used: the trainer
unscales the gradients itself before the cross-replica normalisation, clipping and the
skip decision (a clipping threshold or adaptive clipping statistics must see true gradient
norms), and applies the inner Adam through
:func:`~deep_nmt_tf.training.adaptive_clipping.apply_gradients_if`.  A step whose gradient is
not finite is skipped (weights and Adam untouched), counted in ``skipped_updates`` and in
``overflow_updates``, and halves the scale.
"""

from __future__ import annotations

from typing import Dict

import keras
import tensorflow as tf

__all__ = ["PRECISIONS", "LossScaling", "uses_loss_scaling"]

#: ``training.precision`` values (Keras dtype policy names).
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def uses_loss_scaling(precision: str) -> bool:
    """Whether a precision needs loss scaling (float16's narrow exponent range)."""
    return precision == "mixed_float16"


class LossScaling:
    """Dynamic loss scaling with Keras's ``LossScaleOptimizer`` in a custom loop.

    Create and :meth:`build` it inside the strategy scope; in the replica function multiply
    the loss by :meth:`scale` before differentiating, divide the reduced gradients by
    :meth:`current_scale`; after ``strategy.run`` (cross-replica context) call
    :meth:`update` with the step's overflow flag.

    Args:
      optimizer: the (unbuilt) optimizer that applies the updates.
      initial_scale: the first loss scale (Keras's default 2^15).
      growth_steps: finite steps before the scale doubles (Keras's default 2000).
    """

    def __init__(self, optimizer, initial_scale: float = 2.0 ** 15, growth_steps: int = 2000):
        self.optimizer = keras.optimizers.LossScaleOptimizer(
            optimizer, initial_scale=initial_scale, dynamic_growth_steps=growth_steps)
        self.overflow_updates = None

    def build(self, variables) -> None:
        """Creates the scale, the growth counter and the inner optimizer's slots."""
        self.optimizer.build(list(variables))
        self.overflow_updates = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="overflow_updates",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def scale(self, loss):
        """``loss * scale`` (the loss to differentiate)."""
        return self.optimizer.scale_loss(loss)

    def current_scale(self):
        """The loss scale (float32 scalar): divide the gradients by it."""
        return tf.cast(tf.convert_to_tensor(self.optimizer.dynamic_scale), tf.float32)

    def update(self, overflow) -> None:
        """Cross-replica context: halve the scale after an overflow, else count the step and
        double the scale every ``dynamic_growth_steps`` finite steps."""
        overflow = tf.convert_to_tensor(overflow, tf.bool)
        lso = self.optimizer
        scale = tf.convert_to_tensor(lso.dynamic_scale)
        counter = tf.where(overflow, tf.zeros_like(lso.step_counter), lso.step_counter + 1)
        grow = tf.greater_equal(counter, lso.dynamic_growth_steps)
        lso.dynamic_scale.assign(tf.where(overflow, scale * 0.5,
                                          tf.where(grow, scale * 2.0, scale)))
        lso.step_counter.assign(tf.where(grow, tf.zeros_like(counter), counter))
        self.overflow_updates.assign_add(tf.cast(overflow, tf.int64))

    def checkpoint_items(self) -> Dict[str, object]:
        lso = self.optimizer
        return {"loss_scale": lso.dynamic_scale, "loss_scale_steps": lso.step_counter,
                "overflow_updates": self.overflow_updates}
