r"""Learns a shared vocabulary: a WordPiece vocabulary or a SentencePiece model (thin wrapper
around deep_nmt_tf.data.tokenizers.learn_tokenizer).

From a config (every training corpus of ``data``; a synthetic corpus is written to
``MODEL_DIR/data``; the tokenizer of ``data.tokenizer``; output ``data.vocab`` or
``MODEL_DIR/vocab.txt`` / ``MODEL_DIR/sentencepiece.model``)::

    deep-nmt-build-vocab --config=configs/demo.yaml --model_dir=runs/demo \
        [--override=data.vocab_size=4000] [--override=data.tokenizer.type=sentencepiece]

From explicit files::

    deep-nmt-build-vocab --input=train.src,train.tgt --output=vocab.txt --vocab_size=8000 \
        [--min_count=10] [--lowercase] [--learner=tensorflow_text]
    deep-nmt-build-vocab --input=train.src,train.tgt --output=sp.model --vocab_size=8000 \
        --tokenizer=sentencepiece [--model_type=bpe]

The vocabulary file is (re)written, except the vocabulary of a run that exists (a
``--model_dir`` holding a run, or an ``--output`` in a directory holding one): its checkpoints
were trained with it, and a new vocabulary would silently turn their translations into garbage.
``--overwrite`` allows it.  The reserved tokens <pad>, <s>, </s>, [UNK] take ids 0-3.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from absl import app, flags, logging

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

# The tools share absl's global FLAGS when imported into one process (tests); --input and
# --output are therefore plain strings, like in tools/translate.py, and the mode is chosen by
# which flags are present on the command line, not by their defaults.
define_flags([
    (flags.DEFINE_string, "config", None, "YAML config file (config mode)."),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. data.vocab_size=4000 (repeatable)."),
    (flags.DEFINE_string, "model_dir", None,
     "Run directory: synthetic corpus and default vocabulary location (config mode)."),
    (flags.DEFINE_string, "input", None, "Comma-separated text files (explicit mode)."),
    (flags.DEFINE_string, "output", None, "Vocabulary file to write (explicit mode)."),
    (flags.DEFINE_integer, "vocab_size", 8000, "Target vocabulary size (explicit mode)."),
    (flags.DEFINE_bool, "lowercase", False, "Lower-case text first (explicit mode)."),
    (flags.DEFINE_integer, "min_count", 10, "WordPiece: least count of a piece the learner "
     "keeps (explicit mode; data.vocab_min_count in config mode).", 1),
    (flags.DEFINE_enum, "tokenizer", "wordpiece", ["wordpiece", "sentencepiece"],
     "What to learn (explicit mode; data.tokenizer.type in config mode)."),
    (flags.DEFINE_enum, "learner", "sentencepiece", ["sentencepiece", "tensorflow_text"],
     "WordPiece learner (explicit mode; data.tokenizer.wordpiece.learner in config mode)."),
    (flags.DEFINE_enum, "model_type", "unigram", ["unigram", "bpe"],
     "SentencePiece model type (explicit mode; data.tokenizer.sentencepiece.model_type)."),
    (flags.DEFINE_bool, "overwrite", False, "Rewrite the vocabulary of an existing run."),
])


def _refuse_run_vocab(output: str, run_dirs, overwrite: bool) -> None:
    """Refuses to rewrite an existing ``output`` that belongs to a run (one of ``run_dirs``)."""
    from deep_nmt_tf.run_dir import RunDir

    if overwrite or not os.path.exists(output):
        return
    for run_dir in run_dirs:
        if run_dir is not None:
            RunDir(run_dir).refuse_overwrite(f"a new vocabulary ({output})", "--overwrite")


def _from_config(config_path: str, overrides: Sequence[str], model_dir: str,
                 overwrite: bool = False) -> None:
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.data import synthetic, text_io
    from deep_nmt_tf.data.preparation import training_files
    from deep_nmt_tf.data.tokenizers import learn_tokenizer
    from deep_nmt_tf.run_dir import RunDir

    config = load_config(config_path, overrides)
    data = config.data
    run_dir = RunDir(model_dir) if model_dir else None
    if data.vocab or run_dir is not None:  # Refused before any file is written.
        output = data.vocab or run_dir.default_tokenizer_path(config)
        _refuse_run_vocab(output, [model_dir, os.path.dirname(output) or "."], overwrite)
    if data.corpus == "synthetic":
        if run_dir is None:
            raise app.UsageError("--model_dir is required when data.corpus is 'synthetic'")
        paths = synthetic.write_corpus(
            run_dir.data_dir, data.synthetic_train_size,
            data.synthetic_dev_size, data.synthetic_test_size, data.synthetic_seed)
        data = dataclasses.replace(data, **paths)
    if not data.vocab and run_dir is None:
        raise app.UsageError("data.vocab is empty: give --model_dir (writes MODEL_DIR/vocab.txt "
                             "or MODEL_DIR/sentencepiece.model) or set data.vocab")
    output = data.vocab or run_dir.default_tokenizer_path(config)
    for corpus in data.training_corpora():
        stats = text_io.check_parallel(corpus.source, corpus.target)
        logging.info("%s", text_io.describe_stats(stats, "train"))
    learn_tokenizer(data, training_files(data), output)


def _from_files(inputs: Sequence[str], output: str, vocab_size: int,
                lowercase: bool, overwrite: bool = False, min_count: int = 10,
                tokenizer: str = "wordpiece", learner: str = "sentencepiece",
                model_type: str = "unigram") -> None:
    from deep_nmt_tf.config import config_from_dict
    from deep_nmt_tf.data.tokenizers import learn_tokenizer

    _refuse_run_vocab(output, [os.path.dirname(output) or "."], overwrite)
    options = {"learner": learner} if tokenizer == "wordpiece" else {"model_type": model_type}
    data = config_from_dict({"data": {
        "vocab_size": vocab_size, "lowercase": lowercase, "vocab_min_count": min_count,
        "vocab_sample_size": 0, "tokenizer": {"type": tokenizer, tokenizer: options}}}).data
    learn_tokenizer(data, list(inputs), output)


def main(argv: Sequence[str]) -> None:
    """Entry point after absl parsed the flags.

    Args:
      argv: leftover positional arguments (none are accepted).
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    explicit = FLAGS["input"].present or FLAGS["output"].present
    if FLAGS.config and explicit:
        raise app.UsageError("give either --config (config mode) or --input/--output, not both")
    if not FLAGS.config and not (FLAGS["input"].present and FLAGS["output"].present):
        raise app.UsageError("give --config=FILE [--model_dir=DIR], or --input=FILES "
                             "--output=FILE [--vocab_size=N] [--lowercase]")
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.run_dir import RunDirError

    try:
        if FLAGS.config:
            _from_config(FLAGS.config, FLAGS.override, FLAGS.model_dir, FLAGS.overwrite)
        else:
            inputs = [path for path in FLAGS.input.split(",") if path]
            _from_files(inputs, FLAGS.output, FLAGS.vocab_size, FLAGS.lowercase,
                        FLAGS.overwrite, FLAGS.min_count, FLAGS.tokenizer, FLAGS.learner,
                        FLAGS.model_type)
    except (ConfigError, DataError, RunDirError) as e:  # User errors: message, no traceback.
        raise SystemExit(f"build_vocab: error: {e}") from None


def run() -> None:
    """Console-script entry point (``deep-nmt-build-vocab``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
