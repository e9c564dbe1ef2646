"""Length-bucketed token batching without TensorFlow: :class:`TokenBatches`, a
``keras.utils.PyDataset`` over a token-id file (:class:`~deep_nmt_tf.data.token_ids.TokenIds`)
for ``model.fit`` on any Keras backend.

The batches are the ``tf.data`` pipeline's (:func:`deep_nmt_tf.data.pipeline.
make_train_dataset`): pairs with an empty side, a source longer than
``data.max_source_length`` or a target longer than ``data.max_target_length`` (counting
``</s>``/``<s>``) are dropped; each pair goes to the first bucket whose upper bound ``u``
(:func:`bucket_upper_bounds`, geometric from 8 to the longest length allowed) holds ``L =
max(S, T)``; a bucket emits a batch when it holds ``max(1, batch_tokens // (2 u))`` pairs
(:func:`bucket_batch_sizes`), so ``B * (S_padded + T_padded) <= batch_tokens``.  The pairs are
read in a new random order on each pass over the corpus (seeded by ``training.seed`` and the
pass), pairs left in a bucket at the end of a pass stay there for the next one (the pipeline's
``repeat`` before ``bucket_by_sequence_length``), and the stream of batches never ends.

Several corpora (``data.train``; a ``train.npz`` that lists them, written by
``deep-nmt-preprocess``): each corpus is read in its own random order (a new one on each of
its passes), and every pair is drawn from corpus ``i`` with probability ``weight_i /
sum(weights)``, as ``tf.data``'s ``sample_from_datasets`` does in the pipeline; the weights are
the config's (``data.train``, matched by name), else the file's.

Shapes.  With ``static_shapes`` (the default on JAX and PyTorch, and with
``training.jit_compile``) every batch of a bucket has the same shape ``[B_u, u]``: rows padded
to ``u`` as ``pad_to_bucket_boundary`` does, so a compiled step is traced once per bucket.
Otherwise rows are padded to the longest pair of the batch.  ``shape_classes=K``
(``training.shape_classes``) groups the buckets into at most ``K`` classes of neighbouring
buckets (:func:`bucket_shapes`): a batch of any bucket of a class is padded to the class's
longest bound and, with rows that hold no token, to its largest batch size, so a compiled
step is traced ``K`` times (each trace of a deep model's step costs seconds on a CPU and more
on a GPU) at the price of computing on the padding.

``len()`` and ``fit`` epochs.  The dataset has ``num_batches`` batches per epoch; each epoch
continues the stream where the last one stopped (``on_epoch_end``), and ``start`` skips the
first batches (a resumed run: the micro-batches consumed before the checkpoint).  Keras'
``fit(..., shuffle=...)`` shuffles the batches of an epoch among themselves; pass
``shuffle=False`` for the stream's own order.

Example::

    from deep_nmt_tf.data.batching import TokenBatches
    from deep_nmt_tf.data.token_ids import TokenIds

    train = TokenBatches.from_config(config, TokenIds.load("runs/x/data/train.npz"),
                                     num_batches=500)
    model.fit(train, epochs=4, shuffle=False)          # 2,000 updates
"""

from __future__ import annotations

import itertools
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import keras
import numpy as np
from absl import logging

from deep_nmt_tf import compat
from deep_nmt_tf.config import corpus_name
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.data.token_ids import TokenIds

__all__ = ["bucket_upper_bounds", "bucket_batch_sizes", "bucket_shapes", "TokenBatches",
           "EvalBatches"]

_MIN_BUCKET_LENGTH = 8
_KEEP_BEHIND = 256  # Batches of the plan kept behind the newest one requested.
_DRAWS = 4096  # Corpus choices drawn at a time (several corpora).


def bucket_upper_bounds(max_length: int, num_buckets: int) -> List[int]:
    """Upper length bounds of the training buckets: geometric from 8 up to ``max_length``.

    Args:
      max_length: longest ``max(S, T)`` an example can have.
      num_buckets: number of buckets wanted (fewer when ``max_length`` is small).

    Returns:
      Strictly increasing bounds; the last one is ``max_length``.
    """
    low = min(_MIN_BUCKET_LENGTH, max_length)
    if num_buckets <= 1:
        return [max_length]
    ratio = max_length / low
    bounds = {round(low * ratio ** (i / (num_buckets - 1))) for i in range(num_buckets)}
    return sorted(b for b in bounds if b < max_length) + [max_length]


def bucket_batch_sizes(upper_bounds: List[int], batch_tokens: int,
                       batch_size_multiple: int = 1) -> List[int]:
    """Examples per batch for each bucket: ``max(1, batch_tokens // (2 * bound))``.

    Args:
      upper_bounds: from :func:`bucket_upper_bounds`.
      batch_tokens: source + target tokens per batch, padding included.
      batch_size_multiple: round down to a multiple of this (at least one multiple), e.g. the
        number of replicas when a global batch is split across them.
    """
    sizes = []
    for bound in upper_bounds:
        size = max(1, batch_tokens // (2 * bound))
        sizes.append(max(batch_size_multiple, size // batch_size_multiple * batch_size_multiple))
    return sizes


def bucket_shapes(upper_bounds: Sequence[int], batch_sizes: Sequence[int], classes: int
                  ) -> List[Tuple[int, int]]:
    """The padded shape ``(rows, width)`` of each bucket's batches when the buckets are grouped
    into at most ``classes`` classes of neighbouring buckets (``classes`` < 1 or at least the
    number of buckets: each bucket its own shape ``(batch size, bound)``).

    The groups hold as equal numbers of buckets as they can (the longer ones first get one
    more); a group's shape is its largest batch size (its shortest bucket's) by its longest
    bound.
    """
    n = len(upper_bounds)
    if classes < 1 or classes >= n:
        return [(int(b), int(u)) for b, u in zip(batch_sizes, upper_bounds)]
    sizes = [n // classes + (1 if i >= classes - n % classes else 0) for i in range(classes)]
    shapes: List[Tuple[int, int]] = []
    start = 0
    for size in sizes:
        group = range(start, start + size)
        shape = (max(int(batch_sizes[i]) for i in group), int(upper_bounds[group[-1]]))
        shapes += [shape] * size
        start += size
    return shapes


def _default_static_shapes(jit_compile: bool = False) -> bool:
    return bool(jit_compile) or keras.backend.backend() != "tensorflow"


class _VariableShapes(keras.utils.PyDataset):
    """A ``PyDataset`` whose batches change shape: ``fit`` on TensorFlow gets a ``tf.data``
    signature with unknown dimensions (:func:`deep_nmt_tf.compat.allow_variable_batch_shapes`)
    instead of the shapes of the first two batches."""

    variable_batch_shapes = True

    def __init__(self, autotune: bool = False, **kwargs):
        super().__init__(**kwargs)
        #: tf.data's autotuning model for the adapter's pipeline on TensorFlow
        #: (``data.autotune``; off by default, as the package's pipelines).
        self.tf_data_autotune = bool(autotune)
        if keras.backend.backend() == "tensorflow":
            compat.allow_variable_batch_shapes()


class _Examples:
    """The pairs of a token-id file in the batch format (``</s>``, ``<s>`` added)."""

    def __init__(self, data: TokenIds, max_source_length: Optional[int],
                 max_target_length: Optional[int], truncate: bool):
        self.data = data
        src_len = data.source_lengths + 1
        tgt_len = data.target_lengths + 1
        self.truncate = truncate
        if truncate:  # Evaluation: keep every pair, cut over-long sides (EOS kept).
            if max_source_length:
                src_len = np.minimum(src_len, max_source_length)
            if max_target_length:
                tgt_len = np.minimum(tgt_len, max_target_length)
            self.keep = np.ones(len(data), bool)
        else:  # Training: drop empty and over-long pairs.
            self.keep = (data.source_lengths > 0) & (data.target_lengths > 0)
            if max_source_length:
                self.keep &= src_len <= max_source_length
            if max_target_length:
                self.keep &= tgt_len <= max_target_length
        self.source_length, self.target_length = src_len, tgt_len

    def fill(self, indices: np.ndarray, rows: int, source_width: int, target_width: int
             ) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        """``({"source_ids", "target_input_ids"}, target_output_ids)`` int32, ``rows`` rows
        (the ones beyond ``len(indices)`` all padding)."""
        src = np.full([rows, source_width], PAD_ID, np.int32)
        tin = np.full([rows, target_width], PAD_ID, np.int32)
        tout = np.full([rows, target_width], PAD_ID, np.int32)
        for row, i in enumerate(indices):
            s = self.data.source(i)[:self.source_length[i] - 1]
            t = self.data.target(i)[:self.target_length[i] - 1]
            src[row, :len(s)], src[row, len(s)] = s, EOS_ID
            tin[row, 0], tin[row, 1:len(t) + 1] = BOS_ID, t
            tout[row, :len(t)], tout[row, len(t)] = t, EOS_ID
        return {"source_ids": src, "target_input_ids": tin}, tout

    def tokens(self, indices: np.ndarray) -> int:
        """Source and target tokens (``</s>`` included, padding not) of these pairs."""
        return int(self.source_length[indices].sum() + self.target_length[indices].sum())


def _passes(indices: np.ndarray, seed: int, corpus: int) -> Iterator[int]:
    """One corpus' pairs, endlessly, in a new random order on each pass."""
    for epoch in itertools.count():
        yield from np.random.default_rng([seed, epoch, corpus + 1]).permutation(indices).tolist()


class TokenBatches(_VariableShapes):
    """Endless, shuffled, length-bucketed token batches for ``fit`` (module docstring).

    Args:
      data: the training pairs (:class:`~deep_nmt_tf.data.token_ids.TokenIds`).
      batch_tokens: source + target tokens per batch, padding included
        (``training.batch_tokens``).
      max_source_length, max_target_length: longest pairs kept (``data.max_*_length``).
      num_buckets: ``data.num_buckets``.
      seed: ``training.seed``.
      num_batches: batches per ``fit`` epoch.
      start: batches of the stream to skip (a resumed run).
      static_shapes: pad rows to the bucket bound (default: on JAX and PyTorch).
      shape_classes: with ``static_shapes``, at most this many batch shapes (module
        docstring; 0: one per bucket).
      batch_size_multiple: every batch size a multiple of this (the number of devices under
        ``keras.distribution.DataParallel``).
      weights: the sampling weight of each corpus the file lists (default: the file's).
      autotune: tf.data's autotuning model for ``fit`` on TensorFlow (``data.autotune``;
        ``from_config`` takes the config's).
      **kwargs: ``keras.utils.PyDataset`` arguments (``workers``, ``use_multiprocessing``,
        ``max_queue_size``).

    Attributes:
      corpora: ``(name, weight, pairs, dropped)`` of each corpus (one, ``train``, for a file
        that lists none).

    Raises:
      ValueError: no pair (of a corpus) is short enough (the message gives the limits).
    """

    def __init__(self, data: TokenIds, batch_tokens: int, max_source_length: int,
                 max_target_length: int, num_buckets: int, seed: int, num_batches: int,
                 start: int = 0, static_shapes: Optional[bool] = None,
                 batch_size_multiple: int = 1, weights: Optional[Sequence[float]] = None,
                 shape_classes: int = 0, **kwargs):
        super().__init__(**kwargs)
        if num_batches < 1:
            raise ValueError(f"num_batches must be >= 1, got {num_batches}")
        self.examples = _Examples(data, max_source_length, max_target_length, truncate=False)
        self.indices = np.flatnonzero(self.examples.keep)
        listed = data.info.get("corpora") or [{"name": "train", "weight": 1.0,
                                               "pairs": len(data)}]
        weights = list(weights) if weights is not None else [c["weight"] for c in listed]
        if len(weights) != len(listed):
            raise ValueError(f"{len(weights)} weights for the {len(listed)} corpora of the file")
        ends = np.cumsum([c["pairs"] for c in listed])
        self.corpus_indices = np.split(self.indices, np.searchsorted(self.indices, ends[:-1]))
        self.corpora = [(c["name"], float(w), int(c["pairs"]), int(c["pairs"]) - len(kept))
                        for c, w, kept in zip(listed, weights, self.corpus_indices)]
        for (name, _, pairs, _), kept in zip(self.corpora, self.corpus_indices):
            where = f"of corpus {name!r} " if len(listed) > 1 else ""
            if not len(kept):
                raise ValueError(f"no training pair {where}has at most {max_source_length} "
                                 f"source and {max_target_length} target tokens (</s>, <s> "
                                 f"included) and a non-empty side ({pairs} pairs)")
        if len(listed) > 1:
            for name, weight, pairs, dropped in self.corpora:
                logging.info("corpus %s: %d pairs, %d dropped (an empty side, or over the "
                             "length limits), weight %g", name, pairs, dropped, weight)
        self.num_dropped = len(data) - len(self.indices)
        self.bounds = bucket_upper_bounds(max(max_source_length, max_target_length),
                                          num_buckets)
        self.batch_sizes = bucket_batch_sizes(self.bounds, batch_tokens, batch_size_multiple)
        lengths = np.maximum(self.examples.source_length, self.examples.target_length)
        self.bucket = np.searchsorted(self.bounds, lengths)  # First bound >= L.
        self.seed = int(seed)
        self.static_shapes = (_default_static_shapes() if static_shapes is None
                              else bool(static_shapes))
        # (The largest batch size of a group is a multiple of batch_size_multiple as they all are.)
        self.shapes = bucket_shapes(self.bounds, self.batch_sizes, shape_classes)
        self._num_batches = int(num_batches)
        self._offset = int(start)
        self._plan: Dict[int, Tuple[int, np.ndarray]] = {}
        self._next = 0
        self._stream = self._batches()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config, data: TokenIds, num_batches: int, start: int = 0,
                    batch_size_multiple: int = 1, static_shapes: Optional[bool] = None,
                    **kwargs) -> "TokenBatches":
        """The batches a config's training data and ``training`` section ask for (``data.
        max_*_length``, ``data.num_buckets``, ``training.batch_tokens``, ``training.seed``;
        ``training.jit_compile`` selects static shapes on TensorFlow; ``data.autotune``)."""
        d, t = config.data, config.training
        if static_shapes is None:
            static_shapes = _default_static_shapes(t.jit_compile)
        listed = [c["name"] for c in data.info.get("corpora") or ()]
        configured = {corpus_name(c): c.weight for c in d.train}
        weights = None
        if listed and set(configured) == set(listed):  # The config's (maybe changed) weights.
            weights = [configured[name] for name in listed]
        return cls(data, t.batch_tokens, d.max_source_length, d.max_target_length,
                   d.num_buckets, t.seed, num_batches, start=start, static_shapes=static_shapes,
                   batch_size_multiple=batch_size_multiple, weights=weights,
                   shape_classes=t.shape_classes, **{"autotune": d.autotune, **kwargs})

    def _order(self) -> Iterator[int]:
        """The pairs in the order they enter the buckets (module docstring)."""
        seed = self.seed & 0xFFFFFFFF
        if len(self.corpora) == 1:
            for epoch in range(1 << 62):
                yield from np.random.default_rng([seed, epoch]).permutation(
                    self.indices).tolist()
        orders = [_passes(indices, seed, c) for c, indices in enumerate(self.corpus_indices)]
        weights = np.asarray([w for _, w, _, _ in self.corpora], np.float64)
        draws = np.random.default_rng([seed, 1 << 40])
        while True:
            for c in draws.choice(len(orders), size=_DRAWS, p=weights / weights.sum()).tolist():
                yield next(orders[c])

    def _batches(self) -> Iterator[Tuple[int, np.ndarray]]:
        pending: List[List[int]] = [[] for _ in self.bounds]
        for i in self._order():
            bucket = int(self.bucket[i])
            pending[bucket].append(i)
            if len(pending[bucket]) == self.batch_sizes[bucket]:
                yield bucket, np.asarray(pending[bucket], np.int64)
                pending[bucket] = []

    def plan(self, index: int) -> Tuple[int, np.ndarray]:
        """``(bucket, pair indices)`` of batch ``index`` of the stream (0 = the first)."""
        with self._lock:
            if index < self._next - _KEEP_BEHIND and index not in self._plan:
                raise IndexError(f"batch {index} of the stream is no longer kept")
            while self._next <= index:
                self._plan[self._next] = next(self._stream)
                self._plan.pop(self._next - _KEEP_BEHIND, None)
                self._next += 1
            return self._plan[index]

    def __len__(self) -> int:
        return self._num_batches

    def __getitem__(self, index: int):
        if not 0 <= index < self._num_batches:
            raise IndexError(f"batch {index} of an epoch of {self._num_batches}")
        bucket, indices = self.plan(self._offset + index)
        if self.static_shapes:
            rows, width = self.shapes[bucket]
            return self.examples.fill(indices, rows, width, width)
        return self.examples.fill(indices, len(indices),
                                  int(self.examples.source_length[indices].max()),
                                  int(self.examples.target_length[indices].max()))

    def tokens(self, index: int) -> int:
        """Source and target tokens (no padding) of batch ``index`` of the current epoch."""
        return self.examples.tokens(self.plan(self._offset + index)[1])

    @property
    def position(self) -> int:
        """Batches of the stream before this epoch's first one."""
        return self._offset

    def on_epoch_end(self):
        self._offset += self._num_batches


class EvalBatches(_VariableShapes):
    """One pass over a token-id file in file order, for ``evaluate`` / ``validation_data``.

    Every pair is kept (over-long sides truncated, ``</s>`` kept), ``batch_size`` pairs per
    batch.  With ``static_shapes`` the widths are rounded up to a multiple of ``pad_to`` and
    the last batch is filled with padding rows (which hold no token, so the loss ignores
    them), keeping the number of shapes small under a compiled step.

    Args:
      data: the pairs.
      batch_size: pairs per batch (``decoding.batch_size``).
      max_source_length, max_target_length: truncation lengths (``data.max_*_length``).
      max_pairs: the first so many pairs (0: all; ``data.max_dev_sentences``).
      static_shapes: default on JAX and PyTorch.
      pad_to: width multiple under ``static_shapes``.
      autotune: as :class:`TokenBatches`'.
    """

    def __init__(self, data: TokenIds, batch_size: int, max_source_length: int,
                 max_target_length: int, max_pairs: int = 0,
                 static_shapes: Optional[bool] = None, pad_to: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.examples = _Examples(data, max_source_length, max_target_length, truncate=True)
        count = min(len(data), max_pairs) if max_pairs else len(data)
        self.batch_size = int(batch_size)
        self.starts = list(range(0, count, self.batch_size))
        self.count = count
        self.static_shapes = (_default_static_shapes() if static_shapes is None
                              else bool(static_shapes))
        self.pad_to = max(1, int(pad_to))

    @classmethod
    def from_config(cls, config, data: TokenIds, **kwargs) -> "EvalBatches":
        """Batches of ``decoding.batch_size`` pairs, at most ``data.max_dev_sentences``
        (``data.autotune`` as the training batches')."""
        d = config.data
        return cls(data, config.decoding.batch_size, d.max_source_length, d.max_target_length,
                   max_pairs=d.max_dev_sentences, **{"autotune": d.autotune, **kwargs})

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int):
        start = self.starts[index]
        indices = np.arange(start, min(start + self.batch_size, self.count))
        src = int(self.examples.source_length[indices].max())
        tgt = int(self.examples.target_length[indices].max())
        rows = len(indices)
        if self.static_shapes:
            m = self.pad_to
            src, tgt, rows = -(-src // m) * m, -(-tgt // m) * m, self.batch_size
        return self.examples.fill(indices, rows, src, tgt)
