"""Label-smoothed cross-entropy (``keras.ops``, every backend): sums for the custom loop, and
the Keras loss of ``compile``/``fit``.

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

          = (1 - eps) * nll + eps * (logsumexp(z) - mean_v(z))          (nll = -log p(gold))

The last form is what is computed (float32): no one-hot and no ``[B, T, V]`` log-softmax are
materialised, and ``nll`` comes from ``keras.ops.sparse_categorical_crossentropy`` (on
TensorFlow the fused ``SparseSoftmaxCrossEntropyWithLogits``, whose gradient is a dense
``softmax - onehot``).  Picking ``z_gold`` with ``take_along_axis`` instead costs TensorFlow a
scatter of the gradient into a zero ``[B * T, V]`` tensor (``UnsortedSegmentSum``): about half
of the Multi30k model's training step on a CPU (BENCHMARKS.md).  (T2T and Fairseq give the gold
``1 - eps`` and spread ``eps`` over the other
``V - 1`` entries; the two differ by ``eps / V`` on the gold, immaterial for ``V`` in the
thousands.)  Padding positions (``labels == pad_id``) contribute nothing.  The loss is not shifted
by the entropy of ``q``, so its minimum is above zero when ``eps > 0``; the unsmoothed negative
log-likelihood is returned too (for perplexity).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
from keras import ops

from deep_nmt_tf.constants import PAD_ID

__all__ = ["LossSums", "cross_entropy_sums", "loss_denominator", "LabelSmoothedCrossEntropy"]

NORMALIZATIONS = ("token", "sentence")


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (float32 scalars).

    Attributes:
      loss: sum of label-smoothed per-token losses (the numerator that is differentiated).
      nll: sum of per-token negative log-likelihoods (no smoothing), for reporting.
      num_tokens: number of target tokens (non-padding positions).
      num_sentences: number of sentences with at least one target token.
    """

    loss: Any
    nll: Any
    num_tokens: Any
    num_sentences: Any


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def _token_losses(logits, labels, label_smoothing: float, pad_id: int):
    """``(per_token, nll, mask)``, each ``[B, T]`` float32 (module docstring)."""
    logits = ops.cast(logits, "float32")
    if not hasattr(logits, "ndim"):  # A float32 tf.Variable passes the cast unchanged.
        logits = ops.copy(logits)
    labels = ops.cast(labels, "int32")
    if len(logits.shape) != 3 or len(labels.shape) != 2:
        raise ValueError(f"logits must be [batch, time, vocab] and labels [batch, time], got "
                         f"shapes {tuple(logits.shape)} and {tuple(labels.shape)}")
    mask = ops.cast(ops.not_equal(labels, pad_id), "float32")
    nll = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    if label_smoothing > 0.0:
        spread = ops.logsumexp(logits, axis=-1) - ops.mean(logits, axis=-1)
        per_token = (1.0 - label_smoothing) * nll + label_smoothing * spread
    else:
        per_token = nll
    return per_token, nll, mask


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
    _check_smoothing(label_smoothing)
    per_token, nll, mask = _token_losses(logits, labels, label_smoothing, pad_id)
    tokens_per_sentence = ops.sum(mask, axis=1)
    return LossSums(
        loss=ops.sum(per_token * mask),
        nll=ops.sum(nll * mask),
        num_tokens=ops.sum(tokens_per_sentence),
        num_sentences=ops.sum(ops.cast(tokens_per_sentence > 0, "float32")),
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


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """The custom loop's loss as a Keras loss, for ``model.compile(loss=...)``.

    ``y_true``: ``target_output_ids`` ``[B, T]`` (``PAD_ID`` = padding); ``y_pred``: logits
    ``[B, T, V]``.  The value is the summed label-smoothed token loss of the batch divided by
    its number of target tokens (``normalization="token"``) or of sentences with a target
    (``"sentence"``), exactly :func:`cross_entropy_sums` divided by :func:`loss_denominator`:
    ``call`` returns each sentence's share ``[B]`` and the reduction is ``"sum"``.  Under
    ``keras.distribution.DataParallel`` (JAX) the batch is the global one, so the denominator
    is the global count, as in the custom loop.

    Args:
      label_smoothing: ``eps`` (``training.label_smoothing``).
      normalization: ``"token"`` or ``"sentence"`` (``training.loss_normalization``).
      pad_id: the padding id.
    """

    def __init__(self, label_smoothing: float = 0.1, normalization: str = "token",
                 pad_id: int = PAD_ID, name: str = "label_smoothed_cross_entropy", **kwargs):
        kwargs.pop("reduction", None)
        kwargs.pop("dtype", None)
        super().__init__(name=name, reduction="sum", dtype="float32", **kwargs)
        _check_smoothing(label_smoothing)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"loss normalization must be 'token' or 'sentence', got "
                             f"{normalization!r}")
        self.label_smoothing = float(label_smoothing)
        self.normalization = normalization
        self.pad_id = int(pad_id)

    def call(self, y_true, y_pred):
        per_token, _, mask = _token_losses(y_pred, y_true, self.label_smoothing, self.pad_id)
        tokens_per_sentence = ops.sum(mask, axis=1)
        if self.normalization == "token":
            denominator = ops.sum(tokens_per_sentence)
        else:
            denominator = ops.sum(ops.cast(tokens_per_sentence > 0, "float32"))
        return ops.sum(per_token * mask, axis=1) / ops.maximum(denominator, 1.0)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing,
                "normalization": self.normalization, "pad_id": self.pad_id}
