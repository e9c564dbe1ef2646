r"""Trains a run directory's model with Keras ``compile``/``fit`` on the current backend
(thin wrapper around :func:`deep_nmt_tf.fit.run.train`)::

    deep-nmt-preprocess --config=configs/demo.yaml --model_dir=runs/demo_fit   # TensorFlow
    KERAS_BACKEND=jax deep-nmt-fit --model_dir=runs/demo_fit \
        [--override=training.train_steps=3000 ...]

The run directory must hold the token-id files of ``deep-nmt-preprocess``
(``data/train.npz``; ``data/dev.npz`` for the dev loss); with ``--config`` this tool writes
them first (that step needs TensorFlow).  No TensorFlow is needed otherwise: on a machine with
only JAX (e.g. a GPU machine), ``KERAS_BACKEND=jax``; several devices train data-parallel
(``keras.distribution.DataParallel``).  Checkpoints are ``MODEL_DIR/ckpt-N.weights.h5``,
which ``deep-nmt-translate``, ``deep-nmt-evaluate`` and ``deep-nmt-export`` read on
TensorFlow; running the command again resumes from the newest.  The config keys are the custom
loop's; the ones fit cannot honour (adaptive clipping, the grad-norm ratio, warm start,
freezing) are refused naming the key (``deep_nmt_tf.fit.compiling``).

The model's parameters and training memory are estimated before it is built and a config that
cannot fit in the memory available is refused (:mod:`deep_nmt_tf.sizing`; ``--nomemory_check``
skips it).  Another process writing ``--model_dir`` (a training of either route, a preprocessing) is
refused, naming it (:mod:`deep_nmt_tf.run_lock`).

Exit status: 0 on success, 2 for an invalid config or data, a config too large for the memory,
a run directory in use, checkpoints none of which can be read (a damaged newer one is skipped
with a WARNING and kept, renamed ``*.unreadable``), or a full disk (the partial file removed;
the message names the free space and the last intact checkpoint, which a rerun resumes from);
1 when training met non-finite weights or ``training.max_consecutive_skipped`` updates' worth
of skipped non-finite micro-batches in a row (nothing is saved after it, and the message names
the last good checkpoint); 143 (SIGTERM) or 130 (Ctrl-C) after
saving a checkpoint at the update reached, with the command that resumes.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "model_dir", None,
     "Run directory prepared by deep-nmt-preprocess (config.yaml, data/train.npz)."),
    (flags.DEFINE_string, "config", None,
     "YAML config file: preprocess the run directory first (needs TensorFlow)."),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. training.train_steps=100 (repeatable)."),
    cli.MEMORY_CHECK_FLAG,
])


def _fail(message: str) -> None:
    print(f"fit: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir=DIR is required")
    from deep_nmt_tf import run_lock

    try:  # One writer per run directory.
        lock = run_lock.acquire(FLAGS.model_dir, "deep-nmt-fit")
    except run_lock.RunLockError as e:
        _fail(str(e))
    with lock:
        _fit()


def _fit() -> None:
    """Preprocesses (with ``--config``) and trains ``--model_dir`` (whose lock the caller
    holds)."""
    from deep_nmt_tf import sizing
    from deep_nmt_tf.checkpoints import KERAS_WEIGHTS, CheckpointError, CheckpointStore
    from deep_nmt_tf.config import ConfigError, require_training_data
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.fit.callbacks import FitDiverged
    from deep_nmt_tf.health import TrainingInterrupted

    try:
        config = None
        if FLAGS.config:
            from deep_nmt_tf.fit.compiling import check_fit_config

            config = cli.load_config_file(FLAGS.config, FLAGS.override)
            require_training_data(config)
            check_fit_config(config)
        if FLAGS.memory_check:  # Before any work: a config that cannot fit is refused.
            from deep_nmt_tf.run_dir import RunDir

            sized = config or RunDir(FLAGS.model_dir).load_config(FLAGS.override)
            sizing.check_fits(sizing.estimate(sized, FLAGS.model_dir))
        # A full disk (a checkpoint, run.json, the token ids ...): DiskFullError.
        with CheckpointStore(FLAGS.model_dir).writing(kind=KERAS_WEIGHTS):
            if config is not None:
                from deep_nmt_tf.data.preprocess import preprocess_run

                preprocess_run(config, FLAGS.model_dir)
            from deep_nmt_tf.fit.run import train

            results = train(FLAGS.model_dir, FLAGS.override)
    except (ConfigError, DataError, FileNotFoundError, CheckpointError, sizing.SizeError) as e:
        _fail(str(e))
    except FitDiverged as e:
        print(f"fit: error: {e}", file=sys.stderr)
        sys.exit(1)
    except TrainingInterrupted as e:  # SIGTERM / Ctrl-C: a checkpoint was saved
        cli.exit_interrupted("fit", e)
    if results:
        print("Done: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(results.items())))


def run() -> None:
    """Console-script entry point (``deep-nmt-fit``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
