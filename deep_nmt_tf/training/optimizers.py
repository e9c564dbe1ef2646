"""The custom loop's Adam, L2 weight decay and gradient transforms.

The optimizer is built by the task's one builder, :func:`deep_nmt_tf.task.build_optimizer`,
with :class:`ReducedGradientsAdam` as its class; which variables are decayed is the task's rule
(:func:`deep_nmt_tf.task.decayed_variable_mask`), shared with ``compile``/``fit``.

Gradients reach the optimizer already summed across replicas and normalised by the trainer
(:mod:`deep_nmt_tf.training.trainer`), because clipping and the diagnostics need the global
gradient.  Keras 3's TensorFlow optimizer would sum them across replicas once more inside
``apply`` (a private hook, wrapped by :func:`deep_nmt_tf.compat.skip_gradient_all_reduce`); the
optimizer built here skips that second reduction (:class:`ReducedGradientsAdam`). 
``tests/test_training_distributed.py`` checks that
one global batch gives the same update under the default strategy and ``MirroredStrategy``.

Weight decay (``training.weight_decay``, ``wd``) is classic L2 regularisation, as in Lingvo's
RNMT+ recipe: ``wd * sum ||w||^2 / 2`` is added to the (normalised) loss, i.e. ``wd * w`` is added
to the gradient before clipping and before Adam's moment estimates (this is *not* AdamW's
decoupled decay).  It applies to the variables of the task's mask: kernels and embedding
matrices.

Gradient transforms run in replica context on the reduced, normalised gradients, in order;
each is a callable ``transform(grads, variables, stats) -> grads`` that may read and add scalar
entries of ``stats`` (``stats["grad_norm"]`` is the global norm before any transform).  Setting
``stats["skip_update"]`` (a boolean scalar, identical on every replica) discards the update; the
trainer counts skipped updates.  The transforms' base class and global-norm clipping live in
:mod:`deep_nmt_tf.training.gradient_transforms` (re-exported here); adaptive clipping (RNMT+,
:mod:`deep_nmt_tf.training.adaptive_clipping`) plugs in here.
"""

from __future__ import annotations

from typing import List, Sequence

import keras
import tensorflow as tf

from deep_nmt_tf import compat
from deep_nmt_tf.training.adaptive_clipping import AdaptiveClippingTransform
from deep_nmt_tf.training.gradient_transforms import ClipByGlobalNorm, GradientTransform

__all__ = [
    "ReducedGradientsAdam",
    "add_l2_gradients",
    "l2_penalty",
    "GradientTransform",
    "ClipByGlobalNorm",
    "build_gradient_transforms",
]


@compat.skip_gradient_all_reduce
class ReducedGradientsAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` that takes gradients already summed across replicas.

    Under a ``tf.distribute`` strategy, Keras 3 all-reduces (sums) the gradients passed to
    ``apply`` in replica context.  The trainer reduces them itself (to clip and log the global
    norm), so this optimizer leaves them as they are (see
    :func:`deep_nmt_tf.compat.skip_gradient_all_reduce`).  Outside a strategy it is plain Adam.
    The task's builder makes it (:func:`deep_nmt_tf.task.build_optimizer` with
    ``optimizer_class=ReducedGradientsAdam``), after
    :func:`~deep_nmt_tf.compat.check_optimizer_all_reduce_hook`.
    """


def add_l2_gradients(grads: Sequence, variables: Sequence, weight_decay: float,
                     mask: Sequence[bool]) -> List:
    """``g + weight_decay * w`` for the masked variables: the gradient of ``wd * ||w||^2 / 2``."""
    if weight_decay == 0.0:
        return list(grads)
    out = []
    for g, v, decayed in zip(grads, variables, mask):
        if decayed and g is not None:
            g = g + tf.cast(weight_decay, g.dtype) * tf.cast(tf.convert_to_tensor(v), g.dtype)
        out.append(g)
    return out


def l2_penalty(variables: Sequence, weight_decay: float, mask: Sequence[bool]):
    """``weight_decay * sum ||w||^2 / 2`` over the masked variables (float32 scalar)."""
    terms = [tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(v), tf.float32)))
             for v, decayed in zip(variables, mask) if decayed]
    if not terms or weight_decay == 0.0:
        return tf.constant(0.0)
    return 0.5 * weight_decay * tf.add_n(terms)


# --------------------------------------------------------------------------------------------
# Gradient transforms
# --------------------------------------------------------------------------------------------


def build_gradient_transforms(config) -> List[GradientTransform]:
    """The transforms the config asks for, in order.

    1. ``training.adaptive_clipping.enabled``: RNMT+ adaptive clipping (skips outlier steps;
       :mod:`deep_nmt_tf.training.adaptive_clipping`), first so that it sees the raw norm;
    2. ``training.clip_norm`` > 0: global-norm clipping.
    """
    t = config.training
    transforms: List[GradientTransform] = []
    adaptive = getattr(t, "adaptive_clipping", None)
    if adaptive is not None and adaptive.enabled:
        transforms.append(AdaptiveClippingTransform(
            decay=adaptive.decay, num_stddevs=adaptive.num_stddevs,
            warmup_steps=None if adaptive.warmup_steps < 0 else adaptive.warmup_steps,
            norm_floor=adaptive.norm_floor, min_stddev=adaptive.min_stddev))
    if t.clip_norm > 0:
        transforms.append(ClipByGlobalNorm(t.clip_norm))
    return transforms
