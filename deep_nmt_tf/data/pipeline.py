"""tf.data input pipelines and corpus/vocabulary preparation.

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
    tokenizer = Tokenizer.from_config(config)
    train = make_train_dataset(config, tokenizer)  # endless, shuffled, token-batched
    # or, one pipeline per worker/replica:
    train = strategy.distribute_datasets_from_function(train_dataset_fn(config, tokenizer))
    dev = make_dev_dataset(config, tokenizer)      # finite, in file order
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Union

import tensorflow as tf
from absl import logging

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.data import synthetic
from deep_nmt_tf.data.batching import bucket_batch_sizes, bucket_upper_bounds
from deep_nmt_tf.data.text_io import DataError, check_parallel, describe_stats
from deep_nmt_tf.data.vocab import WHITESPACE_CHAR, Tokenizer, build_vocab, vocab_size
from deep_nmt_tf.run_dir import VOCAB_FILENAME, RunDir, file_sha256

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


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # Reproducible order even with parallel map calls.
    return options


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def make_train_dataset(config, tokenizer: Tokenizer,
                       input_context: Optional[tf.distribute.InputContext] = None,
                       batch_size_multiple: int = 1) -> tf.data.Dataset:
    """Endless, shuffled, token-batched training batches (module docstring).

    Empty pairs are dropped; pairs longer than ``data.max_source_length`` /
    ``data.max_target_length`` (counting EOS/BOS) are dropped.  The order is deterministic
    given ``training.seed``.

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
    ds = _line_pairs(data.train_source, data.train_target)
    if input_context is not None:
        batch_tokens = max(1, batch_tokens // input_context.num_replicas_in_sync)
        if input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

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

    ds = ds.filter(_not_blank)
    ds = ds.shuffle(data.shuffle_buffer, seed=training.seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    ds = ds.batch(_TOKENIZE_BATCH).map(encode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.unbatch().map(dense).filter(short_enough)
    bounds = bucket_upper_bounds(max(data.max_source_length, data.max_target_length),
                                 data.num_buckets)
    sizes = bucket_batch_sizes(bounds, batch_tokens, batch_size_multiple)
    ds = ds.bucket_by_sequence_length(
        element_length_func=bucket_length,
        bucket_boundaries=[b + 1 for b in bounds],
        bucket_batch_sizes=sizes + [batch_size_multiple],  # Last bucket: never used.
        pad_to_bucket_boundary=training.jit_compile or training.static_shapes)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


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
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


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


# ---------------------------------------------------------------------------------------------
# Preparation
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LengthStats:
    """What the training pipeline keeps of a corpus (:func:`length_stats`).

    Attributes:
      pairs: line pairs in the files.
      empty: pairs with an empty (or whitespace-only) side, dropped.
      too_long_source, too_long_target: non-empty pairs over ``data.max_source_length`` /
        ``data.max_target_length`` tokens (EOS/BOS included), dropped (a pair over both counts
        in both).
      too_long: non-empty pairs over either limit.
    """
    pairs: int
    empty: int
    too_long_source: int
    too_long_target: int
    too_long: int

    @property
    def kept(self) -> int:
        """Pairs the training pipeline uses."""
        return self.pairs - self.empty - self.too_long

    def describe(self, data) -> str:
        """One line for the log, naming the limits."""
        return (f"train: {self.pairs} pairs; {self.empty} empty and {self.too_long} over the "
                f"length limits ({self.too_long_source} over data.max_source_length="
                f"{data.max_source_length}, {self.too_long_target} over "
                f"data.max_target_length={data.max_target_length} tokens) dropped; "
                f"{self.kept} kept")


def length_stats(config, tokenizer: Tokenizer) -> LengthStats:
    """Counts the training pairs :func:`make_train_dataset` drops (empty, over the length
    limits), tokenizing the corpus once with the same functions (parallel ``tf.data``)."""
    data = config.data

    @_graph_only
    def count(source, target):
        blank = tf.strings.regex_full_match(source, _BLANK_LINE) | \
            tf.strings.regex_full_match(target, _BLANK_LINE)
        encoded = _encode(tokenizer, source, target)
        over_source = encoded["source_ids"].row_lengths() > data.max_source_length
        over_target = encoded["target_input_ids"].row_lengths() > data.max_target_length
        kept = ~blank
        return tf.stack([tf.size(source, out_type=tf.int64)] + [
            tf.reduce_sum(tf.cast(mask, tf.int64)) for mask in (
                blank, kept & over_source, kept & over_target,
                kept & (over_source | over_target))])

    ds = _line_pairs(data.train_source, data.train_target).batch(_TOKENIZE_BATCH * 4)
    ds = ds.map(count, num_parallel_calls=tf.data.AUTOTUNE)
    totals = ds.reduce(tf.zeros([5], tf.int64), lambda total, c: total + c).numpy()
    return LengthStats(*(int(v) for v in totals))


def _file_key(path: str) -> Dict[str, Any]:
    info = os.stat(path)
    return {"path": os.path.abspath(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def check_lengths(config, run_dir: RunDir) -> LengthStats:
    """:func:`length_stats` of a prepared config (cached in ``MODEL_DIR/data_stats.json`` for
    the same files, vocabulary and limits), logged; an error when no pair is kept.

    Raises:
      DataError: every pair is empty or over the limits (the pipeline would wait forever for
        a batch); the message names the limits and the counts.
    """
    data = config.data
    key = {"source": _file_key(data.train_source), "target": _file_key(data.train_target),
           "vocab_sha256": file_sha256(data.vocab), "lowercase": data.lowercase,
           "max_source_length": data.max_source_length,
           "max_target_length": data.max_target_length}
    cached = run_dir.cached_data_stats(key)
    if cached is not None:
        stats = LengthStats(**cached)
    else:
        stats = length_stats(config, Tokenizer.from_config(config))
        run_dir.save_data_stats(key, dataclasses.asdict(stats))
    if stats.kept == 0:
        raise DataError(
            f"no usable training pairs in {data.train_source} / {data.train_target}: "
            f"{stats.describe(data)[len('train: '):]}. Raise data.max_source_length / "
            "data.max_target_length (tokens, EOS/BOS included) or check the files")
    if stats.too_long:
        logging.warning("%s", stats.describe(data))
    else:
        logging.info("%s", stats.describe(data))
    return stats



def _check_corpora(data) -> None:
    """check_parallel on every configured split; logs the counts of dropped empty pairs."""
    for split in ("train", "dev", "test"):
        source, target = getattr(data, f"{split}_source"), getattr(data, f"{split}_target")
        if not source and not target:
            continue
        if not source or not target:
            missing = f"data.{split}_source" if not source else f"data.{split}_target"
            raise DataError(f"{missing}: required together with data.{split}_"
                            f"{'target' if not source else 'source'}")
        stats = check_parallel(source, target)
        if stats.num_empty_pairs:
            logging.warning("%s", describe_stats(stats, split))
        else:
            logging.info("%s", describe_stats(stats, split))
        if split == "train" and stats.num_pairs == 0:
            raise DataError(f"no usable training pairs in {source} / {target} "
                            f"({stats.num_lines} lines, all empty on one side)")


def _resolve_vocab(data, run_dir: RunDir) -> str:
    path = data.vocab or run_dir.default_vocab_path
    if os.path.exists(path):
        logging.info("Using vocabulary %s", path)
        return path
    if data.vocab:
        raise DataError(f"data.vocab: {path}: vocabulary file not found (leave data.vocab empty "
                        f"to learn one into MODEL_DIR/{VOCAB_FILENAME})")
    build_vocab([data.train_source, data.train_target], path, data.vocab_size, data.lowercase,
                max_sentences=data.vocab_sample_size, min_count=data.vocab_min_count)
    return path


def prepare_data(config, run_dir: Union[str, RunDir]):
    """Makes a config's data usable; call before building models or pipelines.

    1. ``data.corpus == 'synthetic'``: writes the synthetic corpus to ``MODEL_DIR/data/``
       (idempotent) and points the six data paths at it.
    2. Checks every configured train/dev/test pair of files with
       :func:`~deep_nmt_tf.data.text_io.check_parallel` (alignment, UTF-8) and logs the number
       of empty pairs the training pipeline will drop.
    3. Vocabulary: ``data.vocab`` if set (it must exist), else ``MODEL_DIR/vocab.txt``, learned
       from the training source and target if missing.
    4. Sets ``model.vocab_size`` from the vocabulary when it is 0.
    5. Counts the training pairs the pipeline drops (empty, over ``data.max_source_length`` /
       ``data.max_target_length``) and logs them (:func:`check_lengths`).

    Args:
      config: a :class:`deep_nmt_tf.config.Config`.
      run_dir: the run directory (a path or :class:`~deep_nmt_tf.run_dir.RunDir`).

    Returns:
      A new config (``dataclasses.replace``) with the data paths, ``data.vocab`` and
      ``model.vocab_size`` filled in.

    Raises:
      DataError: misaligned files, invalid UTF-8, no usable training pairs (all empty, or all
        over the length limits: the message names the limits and counts), a missing
        ``data.vocab`` file, or ``model.vocab_size`` smaller than the vocabulary.
    """
    run_dir = RunDir(run_dir)
    data = config.data
    if data.corpus == "synthetic":
        paths = synthetic.write_corpus(
            run_dir.data_dir, data.synthetic_train_size,
            data.synthetic_dev_size, data.synthetic_test_size, data.synthetic_seed)
        logging.info("Synthetic corpus in %s", os.path.dirname(paths["train_source"]))
        data = dataclasses.replace(data, **paths)
    _check_corpora(data)
    data = dataclasses.replace(data, vocab=_resolve_vocab(data, run_dir))
    size = vocab_size(data.vocab)
    model = config.model
    if model.vocab_size == 0:
        model = dataclasses.replace(model, vocab_size=size)
    elif model.vocab_size < size:
        raise DataError(f"model.vocab_size: {model.vocab_size} is smaller than the vocabulary "
                        f"{data.vocab} ({size} tokens); set it to 0 to use the file's size")
    config = dataclasses.replace(config, data=data, model=model)
    check_lengths(config, run_dir)
    return config
