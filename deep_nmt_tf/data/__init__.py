"""Data: synthetic corpus, corpus checks, WordPiece vocabulary and tf.data pipelines.

Modules:
  synthetic: deterministic toy language pair (``generate_pairs``, ``write_corpus``).
  text_io: streaming checks of parallel text files (``check_parallel``, ``DataError``).
  vocab: WordPiece vocabulary learning/loading and the in-graph ``Tokenizer``
    (tensorflow-text).
  spm: SentencePiece models without TensorFlow (learning, the id map, Python encode/decode).
  tokenizers: the in-graph ``SentencePieceTokenizer`` and ``build_tokenizer`` (the tokenizer
    ``data.tokenizer`` names).
  preparation: ``prepare_data`` (corpus checks, tokenizer file, per-corpus length counts).
  pipeline: ``prepare_data``, ``make_train_dataset``, ``make_eval_dataset`` ...
  options: the pipelines' ``tf.data`` options and ``default_autotune`` (``data.autotune`` for
    a dataset built elsewhere).
  token_ids: token-id files (``TokenIds``, written by ``deep-nmt-preprocess``) and the
    pure-Python ``Detokenizer``.
  batching: ``TokenBatches`` / ``EvalBatches``, the pipeline's token batching as
    ``keras.utils.PyDataset`` s for ``fit`` on any backend.
  preprocess: ``preprocess_run`` (tokenise a run's corpus into token-id files).

``synthetic``, ``text_io``, ``spm``, ``token_ids`` and ``batching`` do not import TensorFlow;
the names from the other modules (and ``batching``, which imports Keras) are imported on first
use, so ``from deep_nmt_tf.data import DataError`` stays cheap.
"""

import importlib

from deep_nmt_tf.data.synthetic import copy_baseline_bleu, generate_pairs, write_corpus
from deep_nmt_tf.data.text_io import DataError, ParallelStats, check_parallel, count_lines

_LAZY = {
    "Tokenizer": "vocab",
    "SentencePieceTokenizer": "tokenizers",
    "build_tokenizer": "tokenizers",
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
    "default_autotune": "options",
    "TokenIds": "token_ids",
    "Detokenizer": "token_ids",
    "TokenBatches": "batching",
    "EvalBatches": "batching",
    "preprocess_run": "preprocess",
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
    "SentencePieceTokenizer",
    "build_tokenizer",
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
    "default_autotune",
    # Lazy (no TensorFlow):
    "TokenIds",
    "Detokenizer",
    "TokenBatches",
    "EvalBatches",
    # Lazy (TensorFlow):
    "preprocess_run",
]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
