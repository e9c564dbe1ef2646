"""Tokenise a run's corpus into token-id files (``deep-nmt-preprocess``; TensorFlow).

:func:`preprocess_run` prepares a run directory as the custom loop does (corpus checks, the
synthetic corpus, the vocabulary, ``config.yaml`` and ``run.json``: :func:`deep_nmt_tf.data.
pipeline.prepare_data` and :meth:`deep_nmt_tf.run_dir.RunDir.save_config`) and writes every
configured split as ``MODEL_DIR/data/<split>.npz`` (:class:`~deep_nmt_tf.data.token_ids.
TokenIds`), tokenised with the run's tokenizer (:func:`deep_nmt_tf.data.tokenizers.
build_tokenizer`: WordPiece or SentencePiece); several training corpora (``data.train``) go
into one ``train.npz`` that lists them with their weights (:func:`tokenize_corpora`).  The run
directory can then be copied to a machine without TensorFlow and trained there with
``compile``/``fit`` (:mod:`deep_nmt_tf.fit`, ``deep-nmt-fit``).
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Sequence, Tuple, Union

import tensorflow as tf
from absl import logging

from deep_nmt_tf.config import Config
from deep_nmt_tf.data.pipeline import prepare_data
from deep_nmt_tf.data.text_io import read_lines
from deep_nmt_tf.data.token_ids import TokenIds
from deep_nmt_tf.data.tokenizers import build_tokenizer
from deep_nmt_tf.run_dir import RunDir, file_sha256

__all__ = ["SPLITS", "tokenize_lines", "tokenize_files", "tokenize_corpora", "preprocess_run"]

SPLITS = ("train", "dev", "test")
_CHUNK = 2048  # Lines per tokenizer call.
_TOKENIZE_FNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tokenize_lines(tokenizer, lines: Sequence[str]) -> List[List[int]]:
    """The tokenizer's ids of each line (no ``</s>``), 2,048 lines per call of one traced
    function per tokenizer (any tokenizer of :mod:`deep_nmt_tf.data.tokenizers`)."""
    fn = _TOKENIZE_FNS.get(tokenizer)
    if fn is None:
        fn = tf.function(tokenizer.tokenize, input_signature=[tf.TensorSpec([None], tf.string)],
                         autograph=False)
        _TOKENIZE_FNS[tokenizer] = fn
    out: List[List[int]] = []
    for i in range(0, len(lines), _CHUNK):
        ragged = fn(tf.constant(list(lines[i:i + _CHUNK]), tf.string))
        out.extend(row.tolist() for row in ragged.numpy())
    return out


def _tokenized_pair(tokenizer, source_path: str, target_path: str
                    ) -> Tuple[List[List[int]], List[List[int]]]:
    from deep_nmt_tf.data.text_io import DataError

    source, target = list(read_lines(source_path)), list(read_lines(target_path))
    if len(source) != len(target):
        raise DataError(f"{source_path} has {len(source)} lines, {target_path} "
                        f"{len(target)}: the files of a split must be aligned")
    return tokenize_lines(tokenizer, source), tokenize_lines(tokenizer, target)


def tokenize_files(tokenizer, source_path: str, target_path: str,
                   vocab_sha256: str = "", **info) -> TokenIds:
    """Both files of a split, line by line (every line kept: row ``i`` is line ``i + 1``).

    Raises:
      DataError: a file is missing or has invalid UTF-8 (naming file and line), or the two
        files differ in length.
    """
    source, target = _tokenized_pair(tokenizer, source_path, target_path)
    return TokenIds.from_rows(source, target, tokenizer.vocab_size, vocab_sha256,
                              source=source_path, target=target_path, **info)


def tokenize_corpora(tokenizer, corpora, vocab_sha256: str = "", **info) -> TokenIds:
    """Several training corpora (``data.train``) in one token-id file: their rows one after
    the other, and ``info["corpora"]`` listing each one's ``name``, ``weight``, ``source``,
    ``target`` and ``pairs`` (what :class:`~deep_nmt_tf.data.batching.TokenBatches` samples
    with the weights).

    Raises:
      DataError: as :func:`tokenize_files`.
    """
    from deep_nmt_tf.config import corpus_name

    source: List[List[int]] = []
    target: List[List[int]] = []
    listed = []
    for c in corpora:
        src, tgt = _tokenized_pair(tokenizer, c.source, c.target)
        source += src
        target += tgt
        listed.append({"name": corpus_name(c), "weight": c.weight, "source": c.source,
                       "target": c.target, "pairs": len(src)})
    return TokenIds.from_rows(source, target, tokenizer.vocab_size, vocab_sha256,
                              corpora=listed, **info)


def preprocess_run(config: Config, run_dir: Union[str, RunDir],
                   splits: Sequence[str] = SPLITS) -> Tuple[Config, Dict[str, str]]:
    """Prepares ``run_dir`` for ``config`` and writes its token-id files (module docstring).

    Args:
      config: the validated config (its ``model`` must match the run directory's, if any).
      run_dir: the run directory.
      splits: the splits to write (those without files in the config are skipped).

    Returns:
      ``(resolved config, {split: path of its .npz})``.

    Raises:
      ConfigError: the run directory holds another model or vocabulary.
      DataError: misaligned or unreadable files, no usable training pairs, a missing vocabulary.
    """
    run_dir = RunDir(run_dir)
    run_dir.check_config(config)
    config = prepare_data(config, run_dir)
    run_dir.save_config(config)
    tokenizer = build_tokenizer(config)
    sha = file_sha256(config.data.vocab)
    info = dict(lowercase=config.data.lowercase, tokenizer_type=tokenizer.kind)
    written = {}
    for split in splits:
        if split == "train" and config.data.train:
            ids = tokenize_corpora(tokenizer, config.data.train, sha, split=split, **info)
        else:
            source, target = (getattr(config.data, f"{split}_source"),
                              getattr(config.data, f"{split}_target"))
            if not source or not target:
                continue
            ids = tokenize_files(tokenizer, source, target, sha, split=split, **info)
        written[split] = ids.save(run_dir.token_file(split))
        logging.info("%s: %d pairs, %d source and %d target tokens -> %s", split, len(ids),
                     len(ids.source_tokens), len(ids.target_tokens), written[split])
    return config, written
