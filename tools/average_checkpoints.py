r"""Averages the model weights of the last N checkpoints into a new model directory.

    deep-nmt-average-checkpoints --model_dir=runs/demo --last=5 --output=runs/demo_avg5

Wang et al. (2019) average the last 5 checkpoints.  Only the model's variables are averaged
(floating-point ones; integer state such as dropout seeds is taken from the newest checkpoint);
optimizer slots and training counters are not written.  The output directory is a model
directory that ``deep-nmt-translate``, ``deep-nmt-evaluate`` and ``deep-nmt-export`` accept: it
gets ``config.yaml``, a copy of the vocabulary and one checkpoint ``ckpt-<step>`` (the newest
averaged step) in the trainer's checkpoint layout.

An ``--output`` that holds a run (a training run, an average of another run's checkpoints) is
refused unless ``--overwrite`` is given (an earlier average of ``--model_dir`` is replaced);
checkpoints of another model are refused, naming the first variable that differs.
"""

from __future__ import annotations

from typing import Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "model_dir", None, "Model directory with the checkpoints."),
    (flags.DEFINE_integer, "last", 5, "Average this many newest checkpoints."),
    (flags.DEFINE_list, "checkpoints", [], "Explicit checkpoint prefixes (instead of "
                                           "--last)."),
    (flags.DEFINE_string, "output", None, "Output model directory."),
    (flags.DEFINE_bool, "overwrite", False, "Replace the run in --output if it holds one (its "
                                            "config, vocabulary and checkpoints)."),
])


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dir or not FLAGS.output:
        raise app.UsageError("--model_dir and --output are required")
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.config import ConfigError

    try:
        path = CheckpointStore(FLAGS.model_dir).average(
            FLAGS.output, last=FLAGS.last, checkpoints=FLAGS.checkpoints or None,
            overwrite=FLAGS.overwrite)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"average_checkpoints: error: {e}") from None
    print(path)


def run() -> None:
    """Console-script entry point (``deep-nmt-average-checkpoints``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
