r"""Tokenises a run's parallel corpus into token-id files for ``compile``/``fit`` (thin wrapper
around :func:`deep_nmt_tf.data.preprocess.preprocess_run`)::

    deep-nmt-preprocess --config=configs/demo.yaml --model_dir=runs/demo_fit \
        [--override=data.vocab_size=4000 ...] [--splits=train,dev,test]

Prepares ``--model_dir`` as ``deep-nmt-train`` does (corpus checks, the synthetic corpus,
the vocabulary: ``data.vocab`` or one learned into ``MODEL_DIR/vocab.txt``, ``config.yaml``,
``run.json``) and writes each split as ``MODEL_DIR/data/<split>.npz``: the WordPiece ids of
every line pair (numpy; ``deep_nmt_tf.data.token_ids``).  ``deep-nmt-fit`` then trains from them
on any Keras backend without TensorFlow (copy the run directory to the training machine).
Running it again on an existing run directory rewrites the token files (a changed model config
or vocabulary is refused, as by ``deep-nmt-train``).

A run directory that another process is writing (a training) is refused, naming it
(:mod:`deep_nmt_tf.run_lock`).

Exit status: 0 on success, 2 for an invalid config or data (the message names the file, line
and key), or a run directory in use.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "config", None, "YAML config file."),
    (flags.DEFINE_string, "model_dir", None,
     "Run directory: config.yaml, vocabulary, data/<split>.npz."),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. data.vocab_size=4000 (repeatable)."),
    (flags.DEFINE_list, "splits", ["train", "dev", "test"],
     "Splits to tokenise (those the config has files for)."),
])


def _fail(message: str) -> None:
    print(f"preprocess: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.config or not FLAGS.model_dir:
        raise app.UsageError("--config=FILE and --model_dir=DIR are required")
    from deep_nmt_tf.config import ConfigError, require_training_data
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.run_dir import RunDir

    unknown = sorted(set(FLAGS.splits) - {"train", "dev", "test"})
    if unknown:
        _fail(f"--splits: unknown split(s) {', '.join(unknown)} (train, dev, test)")
    try:
        config = cli.load_config_file(FLAGS.config, FLAGS.override)
        require_training_data(config)
        RunDir(FLAGS.model_dir).check_config(config)
    except ConfigError as e:
        _fail(str(e))

    from deep_nmt_tf import run_lock
    from deep_nmt_tf.data.preprocess import preprocess_run

    try:  # One writer per run directory: not while a training uses it.
        with run_lock.hold(FLAGS.model_dir, "deep-nmt-preprocess"):
            _, written = preprocess_run(config, FLAGS.model_dir, FLAGS.splits)
    except (ConfigError, DataError, run_lock.RunLockError) as e:
        _fail(str(e))
    for split, path in written.items():
        print(f"{split}\t{path}")


def run() -> None:
    """Console-script entry point (``deep-nmt-preprocess``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
