"""Label-smoothed cross-entropy as separate sums, normalised once per update.

The loss of a batch is returned as a numerator (the sum of per-token losses) and the
denominators it may be divided by (target tokens, sentences).  The trainer adds numerators and
denominators over micro-batches (gradient accumulation) and replicas, and divides once, so that
``k`` micro-batches on ``n`` replicas give the same update as one batch holding all of them
(the OpenNMT-tf habit).

Label smoothing convention (Szegedy et al. 2016; also Keras' and PyTorch's ``label_smoothing``):
the target distribution is ``q = (1 - eps) * onehot(gold) + eps / V`` over all ``V`` vocabulary
entries, so::

    loss = -(1 - eps) * log p(gold) - (eps / V) * sum_v log p(v)
         = logsumexp(z) - (1 - eps) * z_gold - eps * mean_v(z)          (z: logits)

The second form is what is computed (float32): no one-hot and no ``[B, T, V]`` log-softmax are
materialised.  (T2T and Fairseq give the gold ``1 - eps`` and spread ``eps`` over the other
``V - 1`` entries; the two differ by ``eps / V`` on the gold, immaterial for ``V`` in the
thousands.)  Padding positions (``labels == pad_id``) contribute nothing.  The loss is not shifted
by the entropy of ``q``, so its minimum is above zero when ``eps > 0``; the unsmoothed negative
log-likelihood is returned too (for perplexity).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from deep_nmt_tf.constants import PAD_ID

__all__ = ["LossSums", "cross_entropy_sums", "loss_denominator"]


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (float32 scalars).

    Attributes:
      loss: sum of label-smoothed per-token losses (the numerator that is differentiated).
      nll: sum of per-token negative log-likelihoods (no smoothing), for reporting.
      num_tokens: number of target tokens (non-padding positions).
      num_sentences: number of sentences with at least one target token.
    """

    loss: tf.Tensor
    nll: tf.Tensor
    num_tokens: tf.Tensor
    num_sentences: tf.Tensor


def cross_entropy_sums(logits, labels, label_smoothing: float = 0.0,
                       pad_id: int = PAD_ID) -> LossSums:
    """Label-smoothed cross-entropy sums of a batch.

    Args:
      logits: ``[B, T, V]`` (any float dtype; computed in float32).
      labels: ``[B, T]`` int gold ids (``target_output_ids``); ``pad_id`` marks padding.
      label_smoothing: ``eps`` in ``[0, 1]`` (see the module docstring for the convention).
      pad_id: the padding id (0).

    Returns:
      :class:`LossSums`.

    Example:
      >>> sums = cross_entropy_sums(model(batch, training=True), batch["target_output_ids"], 0.1)
      >>> loss = sums.loss / sums.num_tokens
    """
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    tf.debugging.assert_rank(logits, 3, message="logits must be [batch, time, vocab]")
    tf.debugging.assert_rank(labels, 2, message="labels must be [batch, time]")
    mask = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    lse = tf.reduce_logsumexp(logits, axis=-1)
    gold = tf.gather(logits, labels, batch_dims=2)
    nll = lse - gold
    if label_smoothing > 0.0:
        mean_logit = tf.reduce_mean(logits, axis=-1)
        per_token = lse - (1.0 - label_smoothing) * gold - label_smoothing * mean_logit
    else:
        per_token = nll
    tokens_per_sentence = tf.reduce_sum(mask, axis=1)
    return LossSums(
        loss=tf.reduce_sum(per_token * mask),
        nll=tf.reduce_sum(nll * mask),
        num_tokens=tf.reduce_sum(tokens_per_sentence),
        num_sentences=tf.reduce_sum(tf.cast(tokens_per_sentence > 0, tf.float32)),
    )


def loss_denominator(sums: LossSums, normalization: str = "token"):
    """The denominator selected by ``training.loss_normalization``: tokens or sentences.

    Returns ``sums.num_tokens`` for ``"token"`` and ``sums.num_sentences`` for ``"sentence"``
    (the sentence-normalised loss is the sum of per-sentence summed token losses divided by the
    number of sentences).
    """
    if normalization == "token":
        return sums.num_tokens
    if normalization == "sentence":
        return sums.num_sentences
    raise ValueError(f"loss normalization must be 'token' or 'sentence', got {normalization!r}")
