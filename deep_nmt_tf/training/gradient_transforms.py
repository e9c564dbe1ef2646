"""The gradient-transform interface and global-norm clipping.

A gradient transform runs in replica context on the reduced, normalised gradients of one
update (see :mod:`deep_nmt_tf.training.optimizers`): ``transform(grads, variables, stats) ->
grads``.  This module owns the base class :class:`GradientTransform` and the plain transform
:class:`ClipByGlobalNorm`; RNMT+'s adaptive clipping
(:mod:`deep_nmt_tf.training.adaptive_clipping`) derives from the base class, and
:func:`deep_nmt_tf.training.optimizers.build_gradient_transforms` builds the list a config asks
for.  Kept apart from both so that neither imports the other's module for the base class.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import tensorflow as tf

__all__ = ["GradientTransform", "ClipByGlobalNorm", "TRANSFORM_ITEM_PREFIX", "new_transform_items"]

#: A training checkpoint names transform ``i``'s item ``name`` ``transform_<i>_<name>``.
TRANSFORM_ITEM_PREFIX = "transform_"


def new_transform_items(items: Dict[str, object], saved_names) -> List[str]:
    """The transform items of ``items`` (a checkpoint's objects by name) that a checkpoint
    with the root objects ``saved_names`` has no state for: transforms turned on since it was
    written, restored without it (they keep their state) while every other object must match."""
    return [name for name in items
            if name.startswith(TRANSFORM_ITEM_PREFIX) and name not in saved_names]


class GradientTransform:
    """Base class of the transforms applied to reduced, normalised gradients (replica context).

    Subclasses implement ``__call__(grads, variables, stats) -> grads``.  ``stats`` is a dict of
    scalar tensors, identical on every replica; a transform may add entries (they are logged
    as TensorBoard scalars ``train/<key>``) or set ``stats["skip_update"]``.  A transform with
    state keeps it in ``tf.Variable``s created in ``build(variables)`` (called once inside the
    strategy scope) and lists them in ``checkpoint_items()`` so that they are checkpointed.
    """

    def build(self, variables: Sequence) -> None:
        del variables

    def checkpoint_items(self) -> Dict[str, tf.Module]:
        return {}

    def __call__(self, grads: List, variables: Sequence, stats: Dict[str, tf.Tensor]) -> List:
        raise NotImplementedError


class ClipByGlobalNorm(GradientTransform):
    """Rescales the gradients so that their global norm is at most ``clip_norm``.

    Uses ``stats["grad_norm"]`` when present (the norm the trainer computed), and records
    ``stats["grad_clipped"]`` (1.0 when the gradients were scaled down).
    """

    def __init__(self, clip_norm: float):
        if clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.clip_norm = float(clip_norm)

    def __call__(self, grads, variables, stats):
        norm = stats.get("grad_norm")
        if norm is None:
            norm = tf.linalg.global_norm(grads)
        clipped, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
        stats["grad_clipped"] = tf.cast(norm > self.clip_norm, tf.float32)
        return clipped
