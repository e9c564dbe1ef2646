"""Validation helpers: token-id clean-up and TensorBoard scalars.

Dev BLEU decodes with :mod:`deep_nmt_tf.decoding` and is scored by
:func:`deep_nmt_tf.decoding.scoring.corpus_bleu` (:mod:`deep_nmt_tf.training.evaluation`).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from deep_nmt_tf.constants import EOS_ID, PAD_ID

__all__ = ["strip_ids", "write_scalars"]


def strip_ids(ids: Sequence[int]) -> List[int]:
    """Token ids up to (excluding) the first ``EOS``, without padding."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(int(i))
    return out


def _scalar_metadata():
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = "scalars"  # TensorBoard's scalar plugin, format version 0.
    return meta


def write_scalars(writer, step: int, values: Dict[str, float]) -> None:
    """Writes TensorBoard scalars with ``writer`` at ``step`` and flushes.

    Uses ``tf.summary.write`` with the scalar plugin's metadata, which is what
    ``tf.summary.scalar`` writes, without needing the ``tensorboard`` package installed.
    """
    meta = _scalar_metadata()
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.write(name, tf.constant(float(value), tf.float32), metadata=meta)
    writer.flush()
