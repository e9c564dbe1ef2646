"""tf.data input pipelines (and, re-exported from :mod:`deep_nmt_tf.data.preparation`, corpus
and tokenizer preparation).

Batches are dicts of int32 tensors padded with ``PAD_ID`` (docs/DESIGN.md, "Batches"):

- ``source_ids`` ``[B, S]``: source pieces followed by ``EOS_ID``;
- ``target_input_ids`` ``[B, T]``: ``BOS_ID`` followed by the target pieces;
- ``target_output_ids`` ``[B, T]``: the target pieces followed by ``EOS_ID``.

Training batches are formed by *tokens*: examples are grouped into ``data.num_buckets`` length
buckets by ``L = max(S, T)`` (lengths include EOS/BOS); a bucket whose longest allowed ``L`` is
``u`` emits batches of ``max(1, batch_tokens // (2 u))`` examples, so every batch satisfies
``B * (S_padded + T_padded) <= batch_tokens`` unless a single example alone is longer.  With
``training.jit_compile`` or ``training.static_shapes`` batches are padded to their bucket's ``u``
(a small, fixed set of shapes, for XLA or a step traced per shape); otherwise to the longest
example in the batch.

Typical use::

    config = prepare_data(config, model_dir)       # corpus checks, synthetic data, vocabulary
    tokenizer = build_tokenizer(config)            # deep_nmt_tf.data.tokenizers
    train = make_train_dataset(config, tokenizer)  # endless, shuffled, token-batched
    # or, one pipeline per worker/replica:
    train = strategy.distribute_datasets_from_function(train_dataset_fn(config, tokenizer))
    dev = make_dev_dataset(config, tokenizer)      # finite, in file order
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import tensorflow as tf

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.data.batching import bucket_batch_sizes, bucket_upper_bounds
from deep_nmt_tf.data.options import pipeline_options
from deep_nmt_tf.data.preparation import (LengthStats, check_lengths, length_stats,
                                          prepare_data, training_files)
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.data.vocab import WHITESPACE_CHAR, Tokenizer

__all__ = [
    "LengthStats",
    "length_stats",
    "check_lengths",
    "bucket_upper_bounds",
    "bucket_batch_sizes",
    "make_train_dataset",
    "train_dataset_fn",
    "distribute_train_dataset",
    "make_eval_dataset",
    "make_dev_dataset",
    "prepare_data",
    "training_files",
]

# Empty or whitespace only, as text_io.is_blank (Python's str.isspace) defines it.
_BLANK_LINE = WHITESPACE_CHAR + "*"
_TOKENIZE_BATCH = 256  # Lines tokenised per op call in the training pipeline.


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def _line_pairs(source_path: str, target_path: str) -> tf.data.Dataset:
    return tf.data.Dataset.zip((tf.data.TextLineDataset(source_path),
                                tf.data.TextLineDataset(target_path)))


def _graph_only(fn):
    """Marks a tf.data function as plain TensorFlow ops (no AutoGraph conversion needed)."""
    return tf.autograph.experimental.do_not_convert(fn)


@_graph_only
def _not_blank(source, target):
    blank = tf.strings.regex_full_match(tf.stack([source, target]), _BLANK_LINE)
    return ~tf.reduce_any(blank)


def _encode(tokenizer: Tokenizer, source, target, max_source_length: Optional[int] = None,
            max_target_length: Optional[int] = None) -> Dict[str, tf.RaggedTensor]:
    """Batch of lines ``[B]`` -> dict of ragged ids with EOS/BOS, optionally truncated."""
    src = tokenizer.tokenize(source)
    tgt = tokenizer.tokenize(target)
    if max_source_length is not None:
        src = src[:, :max_source_length - 1]
    if max_target_length is not None:
        tgt = tgt[:, :max_target_length - 1]
    batch = tf.shape(source, out_type=tf.int64)[:1]
    eos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), EOS_ID))
    bos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), BOS_ID))
    return {
        "source_ids": tf.concat([src, eos], axis=1),
        "target_input_ids": tf.concat([bos, tgt], axis=1),
        "target_output_ids": tf.concat([tgt, eos], axis=1),
    }


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def make_train_dataset(config, tokenizer: Tokenizer,
                       input_context: Optional[tf.distribute.InputContext] = None,
                       batch_size_multiple: int = 1) -> tf.data.Dataset:
    """Endless, shuffled, token-batched training batches (module docstring).

    Empty pairs are dropped; pairs longer than ``data.max_source_length`` /
    ``data.max_target_length`` (counting EOS/BOS) are dropped.  With several corpora
    (``data.train``) each is read, shuffled (in a buffer of ``data.shuffle_buffer / n`` pairs),
    repeated and filtered on its own, and every pair is drawn from corpus ``i`` with
    probability ``weight_i / sum(weights)`` (``tf.data.Dataset.sample_from_datasets``).  The
    order is deterministic given ``training.seed``.

    Args:
      config: a :class:`deep_nmt_tf.config.Config` with the training paths set (see
        :func:`prepare_data`).
      tokenizer: the :class:`Tokenizer`.
      input_context: under ``strategy.distribute_datasets_from_function``: this pipeline
        reads every ``num_input_pipelines``-th line starting at ``input_pipeline_id`` and its
        batches hold ``batch_tokens // num_replicas_in_sync`` tokens (per-replica batches).
      batch_size_multiple: make every batch size a multiple of this (use the number of
        replicas when a global batch is split by ``experimental_distribute_dataset``).

    Returns:
      ``tf.data.Dataset`` of dicts ``source_ids`` ``[B, S]``, ``target_input_ids`` and
      ``target_output_ids`` ``[B, T]``, int32.
    """
    data, training = config.data, config.training
    batch_tokens = training.batch_tokens
    corpora = data.training_corpora()
    if not corpora:
        raise DataError("no training corpus: set data.train_source / data.train_target, or list "
                        "corpora under data.train")
    if input_context is not None:
        batch_tokens = max(1, batch_tokens // input_context.num_replicas_in_sync)

    @_graph_only
    def encode(source, target):
        return _encode(tokenizer, source, target)

    @_graph_only
    def dense(example):  # Unbatched rank-1 ragged values -> plain tensors.
        return {key: tf.identity(value) for key, value in example.items()}

    @_graph_only
    def short_enough(example):
        return ((tf.size(example["source_ids"]) <= data.max_source_length)
                & (tf.size(example["target_input_ids"]) <= data.max_target_length))

    @_graph_only
    def bucket_length(example):
        return tf.maximum(tf.size(example["source_ids"]), tf.size(example["target_input_ids"]))

    streams = []
    for i, corpus in enumerate(corpora):  # Each corpus: its usable pairs, shuffled, endless.
        ds = _line_pairs(corpus.source, corpus.target)
        if input_context is not None and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        ds = ds.filter(_not_blank)
        ds = ds.shuffle(max(1, data.shuffle_buffer // len(corpora)), seed=training.seed + i,
                        reshuffle_each_iteration=True)
        ds = ds.repeat()
        ds = ds.batch(_TOKENIZE_BATCH).map(encode, num_parallel_calls=tf.data.AUTOTUNE)
        streams.append(ds.unbatch().map(dense).filter(short_enough))
    ds = streams[0]
    if len(streams) > 1:  # Each pair from corpus i with probability weight_i / sum(weights).
        total = sum(c.weight for c in corpora)
        ds = tf.data.Dataset.sample_from_datasets(
            streams, weights=[c.weight / total for c in corpora], seed=training.seed)
    bounds = bucket_upper_bounds(max(data.max_source_length, data.max_target_length),
                                 data.num_buckets)
    sizes = bucket_batch_sizes(bounds, batch_tokens, batch_size_multiple)
    ds = ds.bucket_by_sequence_length(
        element_length_func=bucket_length,
        bucket_boundaries=[b + 1 for b in bounds],
        bucket_batch_sizes=sizes + [batch_size_multiple],  # Last bucket: never used.
        pad_to_bucket_boundary=training.jit_compile or training.static_shapes)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options(data))


def train_dataset_fn(config, tokenizer: Tokenizer
                     ) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """``dataset_fn`` for ``strategy.distribute_datasets_from_function``.

    Args:
      config: prepared config.
      tokenizer: the tokenizer.

    Returns:
      A function of a ``tf.distribute.InputContext`` giving per-replica batches.
    """

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_train_dataset(config, tokenizer, input_context)

    return dataset_fn


def distribute_train_dataset(strategy: tf.distribute.Strategy, config, tokenizer: Tokenizer,
                             per_replica_pipelines: bool = True):
    """Training batches distributed over ``strategy``'s replicas.

    Args:
      strategy: any ``tf.distribute.Strategy``.
      config: prepared config.
      tokenizer: the tokenizer.
      per_replica_pipelines: True: one sharded pipeline per input worker with per-replica
        batches (``distribute_datasets_from_function``); False: one global batch of
        ``batch_tokens`` split across replicas (``experimental_distribute_dataset``), with
        batch sizes rounded to a multiple of the replica count.

    Returns:
      A ``tf.distribute.DistributedDataset``.
    """
    if per_replica_pipelines:
        return strategy.distribute_datasets_from_function(train_dataset_fn(config, tokenizer))
    dataset = make_train_dataset(config, tokenizer,
                                 batch_size_multiple=strategy.num_replicas_in_sync)
    return strategy.experimental_distribute_dataset(dataset)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def make_eval_dataset(config, tokenizer: Tokenizer, source_path: str, target_path: str,
                      batch_size: int, max_sentences: int = 0, include_text: bool = False,
                      max_source_length: Optional[int] = None,
                      max_target_length: Optional[int] = None) -> tf.data.Dataset:
    """Finite batches in file order (no shuffling, no dropping).

    Every line pair is kept, empty ones included, so batch rows stay aligned with the files
    (e.g. with the references for BLEU).  Over-long sides are truncated, EOS kept.

    Args:
      config: config (for the default length limits).
      tokenizer: the tokenizer.
      source_path: source file.
      target_path: target file, aligned with the source.
      batch_size: sentences per batch (the last batch may be smaller).
      max_sentences: read only the first so many pairs (0 = all).
      include_text: also yield the raw lines as ``source_text`` / ``target_text`` (string
        ``[B]``).
      max_source_length: truncate ``source_ids`` to this length (default
        ``data.max_source_length``).
      max_target_length: truncate ``target_*_ids`` to this length (default
        ``data.max_target_length``).

    Returns:
      ``tf.data.Dataset`` of dicts as in :func:`make_train_dataset` (plus text if asked).
    """
    if batch_size < 1:
        raise ValueError(f"make_eval_dataset: batch_size must be >= 1, got {batch_size}")
    max_src = max_source_length or config.data.max_source_length
    max_tgt = max_target_length or config.data.max_target_length

    @_graph_only
    def encode(source, target):
        batch = {k: v.to_tensor(PAD_ID)
                 for k, v in _encode(tokenizer, source, target, max_src, max_tgt).items()}
        if include_text:
            batch.update(source_text=source, target_text=target)
        return batch

    ds = _line_pairs(source_path, target_path)
    if max_sentences > 0:
        ds = ds.take(max_sentences)
    ds = ds.batch(batch_size).map(encode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options(config.data))


def make_dev_dataset(config, tokenizer: Tokenizer, batch_size: Optional[int] = None,
                     include_text: bool = False) -> tf.data.Dataset:
    """:func:`make_eval_dataset` on ``data.dev_source``/``dev_target``, honouring
    ``data.max_dev_sentences``.

    Args:
      config: prepared config with dev paths.
      tokenizer: the tokenizer.
      batch_size: sentences per batch (default ``decoding.batch_size``).
      include_text: also yield the raw lines.

    Raises:
      DataError: no dev set is configured.
    """
    data = config.data
    if not data.dev_source or not data.dev_target:
        raise DataError("data.dev_source / data.dev_target: no dev set configured")
    return make_eval_dataset(config, tokenizer, data.dev_source, data.dev_target,
                             batch_size or config.decoding.batch_size,
                             max_sentences=data.max_dev_sentences, include_text=include_text)
