"""Data: synthetic corpus, corpus checks, WordPiece vocabulary and tf.data pipelines.

Modules:
  synthetic: deterministic toy language pair (``generate_pairs``, ``write_corpus``).
  text_io: streaming checks of parallel text files (``check_parallel``, ``DataError``).
  vocab: vocabulary learning/loading and the in-graph ``Tokenizer`` (tensorflow-text).
  pipeline: ``prepare_data``, ``make_train_dataset``, ``make_eval_dataset`` ...

``synthetic`` and ``text_io`` do not import TensorFlow; the names from ``vocab`` and
``pipeline`` are imported on first use, so ``from deep_nmt_tf.data import DataError`` stays
cheap.
"""

import importlib

from deep_nmt_tf.data.synthetic import copy_baseline_bleu, generate_pairs, write_corpus
from deep_nmt_tf.data.text_io import DataError, ParallelStats, check_parallel, count_lines

_LAZY = {
    "Tokenizer": "vocab",
    "build_vocab": "vocab",
    "learn_vocab": "vocab",
    "load_vocab": "vocab",
    "vocab_size": "vocab",
    "prepare_data": "pipeline",
    "make_train_dataset": "pipeline",
    "train_dataset_fn": "pipeline",
    "distribute_train_dataset": "pipeline",
    "make_eval_dataset": "pipeline",
    "make_dev_dataset": "pipeline",
}

__all__ = [
    "DataError",
    "ParallelStats",
    "check_parallel",
    "count_lines",
    "copy_baseline_bleu",
    "generate_pairs",
    "write_corpus",
    # Lazy (TensorFlow):
    "Tokenizer",
    "build_vocab",
    "learn_vocab",
    "load_vocab",
    "vocab_size",
    "prepare_data",
    "make_train_dataset",
    "train_dataset_fn",
    "distribute_train_dataset",
    "make_eval_dataset",
    "make_dev_dataset",
]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
