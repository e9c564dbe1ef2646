"""Validation helpers: corpus BLEU, token-id clean-up and TensorBoard scalars.

Dev BLEU decodes with :mod:`deep_nmt_tf.decoding` (:mod:`deep_nmt_tf.training.evaluation`).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

import numpy as np
import tensorflow as tf

from deep_nmt_tf.constants import EOS_ID, PAD_ID

__all__ = ["strip_ids", "corpus_bleu", "write_scalars"]


def strip_ids(ids: Sequence[int]) -> List[int]:
    """Token ids up to (excluding) the first ``EOS``, without padding."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(int(i))
    return out


def corpus_bleu(hypotheses: Iterable[str], references: Iterable[str],
                lowercase: bool = False) -> float:
    """sacreBLEU corpus BLEU (default 13a tokenisation) of detokenised text, one reference;
    case-insensitive with ``lowercase`` (for a model trained on lowercased text, which cannot
    produce case)."""
    import sacrebleu

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score)


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
