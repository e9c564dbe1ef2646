"""Corpus and tokenizer preparation before training: :func:`prepare_data` and the counts of the
training pairs the pipeline drops (:func:`check_lengths`).

Start-up cost is bounded by the corpus' size only through plain reading, never through a
tokenisation of the whole corpus: the pairs over the length limits are counted on an evenly
spread sample of at most ``data.length_stats_sample_size`` pairs of each corpus (the counts of a
larger corpus are estimates, marked so), and every count is cached in
``MODEL_DIR/data_stats.json`` for the same files (path, size, modification time), tokenizer
file and limits, so that a resumed run reads none of the corpora before its first update.
(:mod:`deep_nmt_tf.data.pipeline` re-exports these names.)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import tensorflow as tf
from absl import logging

from deep_nmt_tf.config import corpus_name
from deep_nmt_tf.data import synthetic
from deep_nmt_tf.data.text_io import (DataError, check_parallel, describe_stats,
                                      read_line_numbers, sampled_line_numbers)
from deep_nmt_tf.data.tokenizers import build_tokenizer, learn_tokenizer
from deep_nmt_tf.data.vocab import WHITESPACE_CHAR
from deep_nmt_tf.run_dir import RunDir, file_sha256

__all__ = ["LengthStats", "length_stats", "check_lengths", "training_files", "prepare_data"]

_BLANK_LINE = WHITESPACE_CHAR + "*"  # As text_io.is_blank (Python's str.isspace) defines it.
_COUNT_BATCH = 1024  # Line pairs per tokenizer call when counting.


@dataclasses.dataclass(frozen=True)
class LengthStats:
    """What the training pipeline keeps of one corpus (:func:`length_stats`).

    Attributes:
      pairs: line pairs in the files.
      empty: pairs with an empty (or whitespace-only) side, dropped.
      too_long_source, too_long_target: non-empty pairs over ``data.max_source_length`` /
        ``data.max_target_length`` tokens (EOS/BOS included), dropped (a pair over both counts
        in both).
      too_long: non-empty pairs over either limit.
      sampled: 0 when the counts are exact; else the number of pairs they were estimated from
        (``data.length_stats_sample_size``: the ``too_long*`` counts are scaled to the corpus).
      name: the corpus (``train`` for ``data.train_source`` / ``train_target``).
    """
    pairs: int
    empty: int
    too_long_source: int
    too_long_target: int
    too_long: int
    sampled: int = 0
    name: str = "train"

    @property
    def kept(self) -> int:
        """Pairs the training pipeline uses."""
        return self.pairs - self.empty - self.too_long

    def describe(self, data) -> str:
        """One line for the log, naming the limits."""
        estimate = (f" (over the limits: estimated from {self.sampled} pairs spread over the "
                    "corpus, data.length_stats_sample_size)" if self.sampled else "")
        return (f"{self.name}: {self.pairs} pairs; {self.empty} empty and {self.too_long} over "
                f"the length limits ({self.too_long_source} over data.max_source_length="
                f"{data.max_source_length}, {self.too_long_target} over "
                f"data.max_target_length={data.max_target_length} tokens) dropped; "
                f"{self.kept} kept{estimate}")


def _sum(stats: Sequence[LengthStats]) -> LengthStats:
    fields = ("pairs", "empty", "too_long_source", "too_long_target", "too_long")
    return LengthStats(*(sum(getattr(s, f) for s in stats) for f in fields),
                       sampled=sum(s.sampled for s in stats), name="train")


def _graph_only(fn):
    return tf.autograph.experimental.do_not_convert(fn)


def length_stats(config, tokenizer, corpus=None, pairs: Optional[int] = None,
                 empty: Optional[int] = None) -> LengthStats:
    """Counts the pairs of one training corpus that the pipeline drops (empty, over the length
    limits), tokenizing them with the pipeline's tokenizer (parallel ``tf.data``).

    Args:
      config: a prepared config.
      tokenizer: the run's tokenizer.
      corpus: a :class:`~deep_nmt_tf.config.CorpusConfig` (default: the config's only one).
      pairs, empty: the corpus' line pairs and empty pairs, if known (:func:`check_parallel`):
        with more than ``data.length_stats_sample_size`` pairs only an evenly spread sample of
        that many is read (:func:`~deep_nmt_tf.data.text_io.read_line_numbers`) and tokenized,
        and the counts over the limits are scaled to the corpus.

    Returns:
      The corpus' :class:`LengthStats`.
    """
    data = config.data
    corpus = corpus or data.training_corpora()[0]
    size = data.length_stats_sample_size
    sample = bool(pairs and size and pairs > size)

    @_graph_only
    def count(source, target):
        blank = tf.strings.regex_full_match(source, _BLANK_LINE) | \
            tf.strings.regex_full_match(target, _BLANK_LINE)
        over_source = tokenizer.tokenize(source).row_lengths() + 1 > data.max_source_length
        over_target = tokenizer.tokenize(target).row_lengths() + 1 > data.max_target_length
        kept = ~blank
        return tf.stack([tf.size(source, out_type=tf.int64)] + [
            tf.reduce_sum(tf.cast(mask, tf.int64)) for mask in (
                blank, kept & over_source, kept & over_target,
                kept & (over_source | over_target))])

    if sample:
        numbers = sampled_line_numbers(pairs, size)
        ds = tf.data.Dataset.from_tensor_slices((read_line_numbers(corpus.source, numbers),
                                                 read_line_numbers(corpus.target, numbers)))
    else:
        ds = tf.data.Dataset.zip((tf.data.TextLineDataset(corpus.source),
                                  tf.data.TextLineDataset(corpus.target)))
    ds = ds.batch(_COUNT_BATCH).map(count, num_parallel_calls=tf.data.AUTOTUNE)
    totals = [int(v) for v in ds.reduce(tf.zeros([5], tf.int64), lambda t, c: t + c).numpy()]
    name = corpus_name(corpus) if data.train else "train"
    if not sample:
        return LengthStats(*totals, name=name)
    counted, blank = totals[0], totals[1]
    scale = (pairs - empty) / max(counted - blank, 1)
    return LengthStats(pairs, empty, *(round(v * scale) for v in totals[2:]), sampled=counted,
                       name=name)


def _file_key(path: str) -> Dict[str, Any]:
    info = os.stat(path)
    return {"path": os.path.abspath(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def _stats_key(data) -> Dict[str, Any]:
    return {"corpora": [{"source": _file_key(c.source), "target": _file_key(c.target)}
                        for c in data.training_corpora()],
            "tokenizer": data.tokenizer.type, "vocab_sha256": file_sha256(data.vocab),
            "lowercase": data.lowercase, "max_source_length": data.max_source_length,
            "max_target_length": data.max_target_length,
            "sample_size": data.length_stats_sample_size}


def _cached(data, run_dir: RunDir) -> Optional[List[LengthStats]]:
    if not data.vocab or not os.path.exists(data.vocab):
        return None
    cached = _cached_stats(run_dir, _stats_key(data))
    if not cached or "corpora" not in cached:
        return None
    return [LengthStats(**c) for c in cached["corpora"]]


def _log_stats(data, stats: Sequence[LengthStats]) -> None:
    for s in stats if len(stats) > 1 else ():
        weight = [c.weight for c in data.training_corpora()]
        share = weight[stats.index(s)] / sum(weight)
        logging.info("%s (weight %g: %.1f%% of the training pairs)", s.describe(data),
                     weight[stats.index(s)], 100 * share)
    total = _sum(stats) if len(stats) > 1 else stats[0]
    log = logging.warning if total.too_long else logging.info
    log("%s%s", total.describe(data), f" in {len(stats)} corpora" if len(stats) > 1 else "")


def check_lengths(config, run_dir: Union[str, RunDir],
                  parallel: Optional[Sequence] = None) -> List[LengthStats]:
    """:func:`length_stats` of every training corpus of a prepared config, cached in
    ``MODEL_DIR/data_stats.json`` (module docstring) and logged (per corpus and in total);
    an error when a corpus keeps no pair.

    Args:
      config: a prepared config.
      run_dir: the run directory.
      parallel: the corpora's :class:`~deep_nmt_tf.data.text_io.ParallelStats`, if known
        (otherwise read from the cache, or counted).

    Returns:
      One :class:`LengthStats` per corpus, in ``data.training_corpora()`` order.

    Raises:
      DataError: a corpus has no pair that is non-empty and within the limits (the pipeline
        would wait forever for a batch); the message names the corpus, the limits and the
        counts.
    """
    run_dir = RunDir(run_dir)
    data = config.data
    stats = _cached(data, run_dir)
    if stats is None:
        corpora = data.training_corpora()
        parallel = parallel or [check_parallel(c.source, c.target) for c in corpora]
        tokenizer = build_tokenizer(config)
        stats = [length_stats(config, tokenizer, c, p.num_lines, p.num_empty_pairs)
                 for c, p in zip(corpora, parallel)]
        _save_stats(run_dir, _stats_key(data), {
            "corpora": [dataclasses.asdict(s) for s in stats],
            "total": dataclasses.asdict(_sum(stats))})
    for corpus, s in zip(data.training_corpora(), stats):
        if s.kept <= 0:
            raise DataError(
                f"no usable training pairs in {corpus.source} / {corpus.target}: "
                f"{s.describe(data)[len(s.name) + 2:]}. Raise data.max_source_length / "
                "data.max_target_length (tokens, EOS/BOS included) or check the files")
    _log_stats(data, stats)
    return stats


def training_files(data) -> List[str]:
    """Every training corpus' source and target file (what a shared vocabulary is learned
    from), in ``data.training_corpora()`` order."""
    return [path for c in data.training_corpora() for path in (c.source, c.target)]


def _check_corpora(data, check_train: bool) -> List:
    """check_parallel on every configured split (training corpora only if ``check_train``);
    logs the counts of dropped empty pairs; returns the training corpora's stats."""
    splits = [("dev", data.dev_source, data.dev_target),
              ("test", data.test_source, data.test_target)]
    if check_train:
        splits = [(corpus_name(c) if data.train else "train", c.source, c.target)
                  for c in data.training_corpora()] + splits
    train = []
    for split, source, target in splits:
        if not source and not target:
            continue
        if not source or not target:
            missing = f"data.{split}_source" if not source else f"data.{split}_target"
            raise DataError(f"{missing}: required together with data.{split}_"
                            f"{'target' if not source else 'source'}")
        stats = check_parallel(source, target)
        log = logging.warning if stats.num_empty_pairs else logging.info
        log("%s", describe_stats(stats, split))
        if split not in ("dev", "test"):
            train.append(stats)
            if stats.num_pairs == 0:
                raise DataError(f"no usable training pairs in {source} / {target} "
                                f"({stats.num_lines} lines, all empty on one side)")
    return train


def _resolve_vocab(config, run_dir: RunDir) -> str:
    data = config.data
    path = data.vocab or run_dir.default_tokenizer_path(config)
    if os.path.exists(path):
        logging.info("Using the %s file %s", data.tokenizer.type, path)
        return path
    if data.vocab:
        raise DataError(f"data.vocab: {path}: vocabulary file not found (leave data.vocab empty "
                        f"to learn one into MODEL_DIR/{os.path.basename(path)})")
    learn_tokenizer(data, training_files(data), path)
    return path


def prepare_data(config, run_dir: Union[str, RunDir]):
    """Makes a config's data usable; call before building models or pipelines.

    1. ``data.corpus == 'synthetic'``: writes the synthetic corpus to ``MODEL_DIR/data/``
       (idempotent) and points the six data paths at it.
    2. Checks every configured train/dev/test pair of files with
       :func:`~deep_nmt_tf.data.text_io.check_parallel` (alignment, UTF-8) and logs the number
       of empty pairs the training pipeline will drop (the training corpora's counts come from
       ``data_stats.json`` when it holds them for the same files and tokenizer).
    3. Tokenizer file (``data.tokenizer``): ``data.vocab`` if set (it must exist), else
       ``MODEL_DIR/vocab.txt`` (WordPiece) or ``MODEL_DIR/sentencepiece.model``, learned from
       every training corpus if missing.
    4. Sets ``model.vocab_size`` from the tokenizer when it is 0.
    5. Counts the training pairs the pipeline drops (empty, over ``data.max_source_length`` /
       ``data.max_target_length``), per corpus, and logs them (:func:`check_lengths`).

    Args:
      config: a :class:`deep_nmt_tf.config.Config`.
      run_dir: the run directory (a path or :class:`~deep_nmt_tf.run_dir.RunDir`).

    Returns:
      A new config (``dataclasses.replace``) with the data paths, ``data.vocab`` and
      ``model.vocab_size`` filled in.

    Raises:
      DataError: misaligned files, invalid UTF-8, no usable training pairs in a corpus (all
        empty, or all over the length limits: the message names the limits and counts), a
        missing ``data.vocab`` file, or ``model.vocab_size`` smaller than the vocabulary.
    """
    run_dir = RunDir(run_dir)
    data = config.data
    if data.corpus == "synthetic":
        paths = synthetic.write_corpus(
            run_dir.data_dir, data.synthetic_train_size,
            data.synthetic_dev_size, data.synthetic_test_size, data.synthetic_seed)
        logging.info("Synthetic corpus in %s", os.path.dirname(paths["train_source"]))
        data = dataclasses.replace(data, **paths)
    known = dataclasses.replace(data, vocab=data.vocab or run_dir.default_tokenizer_path(config))
    cached = _cached(known, run_dir)
    parallel = _check_corpora(data, check_train=cached is None)
    config = dataclasses.replace(config, data=data)
    data = dataclasses.replace(data, vocab=_resolve_vocab(config, run_dir))
    config = dataclasses.replace(config, data=data)
    size = build_tokenizer(config).vocab_size
    model = config.model
    if model.vocab_size == 0:
        model = dataclasses.replace(model, vocab_size=size)
    elif model.vocab_size < size:
        raise DataError(f"model.vocab_size: {model.vocab_size} is smaller than the vocabulary "
                        f"{data.vocab} ({size} tokens); set it to 0 to use the file's size")
    config = dataclasses.replace(config, data=data, model=model)
    check_lengths(config, run_dir, parallel or None)
    return config


def _cached_stats(run_dir, key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The statistics :func:`_save_stats` saved in ``data_stats.json`` under the same ``key``,
    or None."""
    try:
        with open(run_dir.data_stats_path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return saved.get("stats") if saved.get("key") == key else None


def _save_stats(run_dir, key: Dict[str, Any], stats: Dict[str, Any]) -> None:
    """Writes ``data_stats.json`` (atomically; every worker may call it)."""
    os.makedirs(run_dir.path, exist_ok=True)
    tmp = f"{run_dir.data_stats_path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"key": key, "stats": stats}, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, run_dir.data_stats_path)
