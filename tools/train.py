r"""Trains a model (thin wrapper around :class:`deep_nmt_tf.training.Runner`, which builds the
:class:`~deep_nmt_tf.training.Trainer`)::

    deep-nmt-train --config=configs/demo.yaml --model_dir=runs/demo \
        [--override=training.train_steps=3000 ...] [--strategy=mirrored] \
        [--nocheckpoint_data_iterator]

Running the same command again continues from the newest checkpoint in ``--model_dir`` that
can be read (a killed run resumes exactly; damaged or missing newer checkpoints are skipped with
a WARNING and kept as ``*.unreadable``); raise ``training.train_steps`` to train further.  A
model config or vocabulary that differs from the run directory's is refused.  If the run
directory has checkpoint files but none can be read, training refuses to start unless
``--start_over`` is given.

SIGTERM (a scheduler's preemption) and Ctrl-C save a checkpoint at the current step and print
the command that resumes; a second signal stops at once.

Strategies: ``default`` (one device), ``mirrored`` (all local GPUs), ``multi_worker``
(``TF_CONFIG``; ``--worker_timeout``: seconds after which a silent worker counts as lost),
``tpu`` (``--tpu=NAME``).

Before anything is built, the parameters and the training memory are estimated from the config
(:mod:`deep_nmt_tf.sizing`) and a config that cannot fit in the memory available is refused,
naming both (``--nomemory_check`` skips it); ``--check`` prints the estimate and the config's
verdict and exits.  One training writes a run directory at a time: another process holding it
(:mod:`deep_nmt_tf.run_lock`) is named and refused; a lock left by a process that died is taken
over with a WARNING.

Exit status: 0 on success (``--check``: the config is valid and fits); 1 when training stopped
on an error it names (non-finite updates, a lost worker) and for a flag error that absl reports
with its usage message (an unknown or missing flag); 2 for an invalid config, ``--strategy``,
data or run directory (the message names the file, line and key; no traceback), a config too
large for the memory, a run directory in use, or a full disk (a checkpoint or another file
that cannot be written: its partial files are removed and the message names the free space and
the last intact checkpoint, which the same command resumes from once there is space); 128 + the
signal's number (143 for SIGTERM, 130 for Ctrl-C) after an interruption that saved a checkpoint.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import app, flags, logging

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

_STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")  # deep_nmt_tf.training.STRATEGIES

define_flags([
    (flags.DEFINE_string, "config", None, "YAML config file."),
    (flags.DEFINE_string, "model_dir", None,
     "Run directory: config.yaml, checkpoints, TensorBoard logs, vocabulary."),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. training.train_steps=100 (repeatable)."),
    (flags.DEFINE_string, "tpu", None, "TPU name or grpc:// address (--strategy=tpu)."),
    (flags.DEFINE_bool, "checkpoint_data_iterator", True,
     "Save the tf.data iterator (with its shuffle buffer) in every checkpoint, so that a "
     "resumed run need not re-read the consumed training batches (default strategy only; "
     "--nocheckpoint_data_iterator re-reads them instead)."),
    (flags.DEFINE_enum, "strategy", "default", _STRATEGIES, "tf.distribute strategy."),
    (flags.DEFINE_float, "worker_timeout", 0.0,
     "--strategy=multi_worker: seconds without a heartbeat after which a worker counts as lost "
     "and the others stop with an error (0: TensorFlow's default, 10 s).", 0.0),
    (flags.DEFINE_bool, "start_over", False,
     "Train from step 0 although --model_dir has checkpoint files, none of which can be read "
     "(they are kept, renamed *.unreadable). Refused when a checkpoint can be read."),
    (flags.DEFINE_bool, "check", False,
     "Check the config (and against --model_dir), print the estimated parameters and training "
     "memory and whether they fit in the memory available, and exit (0: fits, 2: refused)."),
    cli.MEMORY_CHECK_FLAG,
])


def _fail(message: str) -> None:
    print(f"train: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str]) -> None:
    """Entry point after absl parsed the flags.

    Args:
      argv: leftover positional arguments (none are accepted).
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.config or not FLAGS.model_dir:
        raise app.UsageError("--config=FILE and --model_dir=DIR are required")

    from deep_nmt_tf.config import ConfigError, require_training_data
    from deep_nmt_tf.run_dir import RunDir, RunDirError

    # Every config problem is reported here, before TensorFlow starts or any file is written
    # (a model that differs from the one the run directory was trained with included).
    try:
        config = cli.load_config_file(FLAGS.config, FLAGS.override)
        require_training_data(config)
        RunDir(FLAGS.model_dir).check_config(config)
    except (ConfigError, RunDirError) as e:
        _fail(str(e))
    _check_size(config)
    from deep_nmt_tf import run_lock

    try:  # One writer per run directory (on the chief under multi-worker).
        lock = run_lock.acquire(FLAGS.model_dir, "deep-nmt-train",
                                multi_worker=FLAGS.strategy == "multi_worker")
    except run_lock.RunLockError as e:
        _fail(str(e))
    with lock:
        _train(config)


def _check_size(config) -> None:
    """The estimate of ``deep_nmt_tf.sizing``: printed and the tool ends with ``--check``;
    a config that cannot fit is refused (unless ``--nomemory_check``)."""
    import os

    from deep_nmt_tf import sizing

    workers = (sizing.workers_of_tf_config(os.environ.get("TF_CONFIG"))
               if FLAGS.strategy == "multi_worker" else 1)
    result = sizing.estimate(config, FLAGS.model_dir, workers=workers)
    available, where = sizing.available_memory()
    if FLAGS.check:
        saved = os.path.exists(os.path.join(FLAGS.model_dir, "config.yaml"))
        print(f"config: {FLAGS.config}: valid" + (f"; matches {FLAGS.model_dir}" if saved else
                                                  f"; {FLAGS.model_dir} is a new run"))
        print(result.report())
        print("available memory: " + (f"{available / 2**30:.1f} GiB ({where})"
                                      if available is not None else where))
    if FLAGS.check or FLAGS.memory_check:
        try:
            sizing.check_fits(result, available, where)
        except sizing.SizeError as e:
            _fail(str(e))
    if FLAGS.check:
        print("verdict: fits" if result.parameters is not None and available is not None
              else "verdict: not refused (not estimated)")
        sys.exit(0)


def _train(config) -> None:
    """Trains ``config`` in ``--model_dir`` (whose lock the caller holds)."""
    from deep_nmt_tf.checkpoints import TF_CHECKPOINT, CheckpointError, CheckpointStore
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.training import (Runner, TrainingDiverged, TrainingInterrupted,
                                      WorkerLost, make_strategy)

    try:
        strategy = make_strategy(FLAGS.strategy, tpu=FLAGS.tpu,
                                 worker_timeout=FLAGS.worker_timeout)
    except ValueError as e:
        _fail(f"--strategy={FLAGS.strategy}: {e}")
    # Any write that finds the disk full (a checkpoint, run.json, the vocabulary ...) is a
    # DiskFullError: its partial files removed, the last intact checkpoint named.
    store = CheckpointStore(FLAGS.model_dir)
    try:
        with store.writing(kind=TF_CHECKPOINT):
            runner = Runner(config, FLAGS.model_dir, strategy=strategy,
                            checkpoint_iterator=FLAGS.checkpoint_data_iterator,
                            start_over=FLAGS.start_over)
    except (ConfigError, DataError, CheckpointError) as e:  # E.g. another model's model_dir.
        _fail(str(e))
    except KeyboardInterrupt:  # Before training: nothing new to save.
        print("train: interrupted before training started", file=sys.stderr)
        sys.exit(130)
    try:
        with store.writing(kind=TF_CHECKPOINT):
            results = runner.run()
    except TrainingInterrupted as e:
        cli.exit_interrupted("train", e, drop=("--start_over",))
    except (TrainingDiverged, WorkerLost) as e:
        print(f"train: error: {e}", file=sys.stderr)
        sys.exit(1)
    except CheckpointError as e:  # A full disk (DiskFullError).
        _fail(str(e))
    if results:
        logging.info("Done: %s", ", ".join(f"{k} {v:.4g}" for k, v in sorted(results.items())))


def run() -> None:
    """Console-script entry point (``deep-nmt-train``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
