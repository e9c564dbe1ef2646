"""Validation helpers: greedy decoding over the decoder-state interface, and corpus BLEU.

:func:`greedy_decode` is the small search the trainer uses for dev BLEU; beam search lives in
``deep_nmt_tf.decoding``.  It talks to the model only through ``encode`` /
``init_decoder_state`` / ``decode_step`` (``docs/DESIGN.md``); a model without ``decode_step``
is decoded by re-running the teacher-forced ``model(...)`` on the growing prefix each step
(slower, same result for a causal decoder).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

import numpy as np
import tensorflow as tf

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID

__all__ = ["greedy_decode", "max_decoding_length", "strip_ids", "corpus_bleu", "write_scalars"]


def max_decoding_length(source_ids, a: float, b: int):
    """``a * S + b`` (int32 scalar), ``S`` = the longest source (non-padding tokens) of a batch."""
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.float32), axis=1)
    return tf.cast(a * tf.reduce_max(lengths), tf.int32) + b


def greedy_decode(model, source_ids, max_length):
    """Greedy (arg-max) decoding, graph-friendly (use it inside a ``tf.function``).

    Args:
      model: a model with the ``docs/DESIGN.md`` interface.
      source_ids: ``[B, S]`` int32, padded with ``PAD_ID``.
      max_length: int or int32 scalar tensor: the most tokens generated (``EOS`` included).

    Returns:
      ``[B, L]`` int32 (``L <= max_length``): the generated tokens, ``EOS`` included when it was
      produced, ``PAD_ID`` after it.  Decoding stops early once every sentence has ended.
    """
    source_ids = tf.cast(tf.convert_to_tensor(source_ids), tf.int32)
    max_length = tf.cast(tf.convert_to_tensor(max_length), tf.int32)
    batch = tf.shape(source_ids)[0]
    bos = tf.fill([batch], tf.constant(BOS_ID, tf.int32))
    finished = tf.zeros([batch], tf.bool)
    outputs = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None])

    if hasattr(model, "decode_step"):
        encoded = model.encode(source_ids, training=False)
        state = model.init_decoder_state(encoded, max_length)

        def next_logits(step, tokens, state):
            return model.decode_step(tokens, step, state)
    else:
        # Re-computation fallback: the state is the [B, max_length] target-input buffer.
        state = tf.tensor_scatter_nd_update(
            tf.zeros([batch, max_length], tf.int32),
            tf.stack([tf.range(batch), tf.zeros([batch], tf.int32)], axis=1), bos)

        def next_logits(step, tokens, buffer):
            # tokens (the input at position `step`) is already in the buffer.
            logits = model({"source_ids": source_ids, "target_input_ids": buffer},
                           training=False)[:, step]
            return logits, buffer

    def cond(step, tokens, finished, outputs, state):
        return tf.logical_and(step < max_length, tf.logical_not(tf.reduce_all(finished)))

    def body(step, tokens, finished, outputs, state):
        logits, state = next_logits(step, tokens, state)
        ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        ids = tf.where(finished, tf.constant(PAD_ID, tf.int32), ids)
        outputs = outputs.write(step, ids)
        finished = tf.logical_or(finished, tf.equal(ids, EOS_ID))
        if not hasattr(model, "decode_step"):
            # Write the new token as the input of the next position (if there is one).
            pos = tf.minimum(step + 1, max_length - 1)
            update = tf.where(step + 1 < max_length, ids, state[:, pos])
            state = tf.tensor_scatter_nd_update(
                state, tf.stack([tf.range(batch), tf.fill([batch], pos)], axis=1), update)
        return step + 1, ids, finished, outputs, state

    _, _, _, outputs, _ = tf.while_loop(
        cond, body, (tf.constant(0, tf.int32), bos, finished, outputs, state),
        maximum_iterations=max_length)
    ids = tf.transpose(outputs.stack())  # [B, L]
    return tf.reshape(ids, [batch, -1])


def strip_ids(ids: Sequence[int]) -> List[int]:
    """Token ids up to (excluding) the first ``EOS``, without padding."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(int(i))
    return out


def corpus_bleu(hypotheses: Iterable[str], references: Iterable[str]) -> float:
    """sacreBLEU corpus BLEU (default 13a tokenisation) of detokenised text, one reference."""
    import sacrebleu

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


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
