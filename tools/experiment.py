r"""Runs an experiment suite: trains each run, averages its last checkpoints, decodes the test
sets with beam search and scores them, then draws the papers' figures.

    deep-nmt-experiment --suite=multi30k --data_dir=../shared/data/multi30k \
        --output_dir=experiments/multi30k [--only=baseline,deep_post] [--seeds=1,2] \
        [--max_steps=300] [--max_train_minutes=60] \
        [--extra_test=flickr2017=test2017.en:test2017.de] \
        [--override=training.batch_tokens=4096]

``--suite`` is a suite file or the name of ``configs/<name>/suite.yaml``; ``--data_dir`` holds
its splits (``train``, ``valid``, ``test2016`` with ``.en``/``.de`` suffixes for Multi30k).
A killed suite continues where it stopped when run again (finished stages are skipped); one run
alone is ``--only=NAME``.  Writes ``OUTPUT_DIR/results.json``, ``results.md``, ``figures/`` and
``runs/<run>/`` (see :mod:`deep_nmt_tf.experiments`).

The length penalty is chosen on dev from the suite's ``length_penalties``; a best value at an
end of the grid extends it that way (by its spacing, never below 0) while dev BLEU improves, up
to the suite's ``length_penalty_extension`` values; results.json's ``decoding`` records every
value tried (``length_penalty_grid``) and ``extended``.

A suite with ``tokenized_bleu_lc: true`` (Multi30k's) also scores ``bleu_tok_lc``, BLEU on
lowercased Moses-tokenised text as papers score the official tokenised Multi30k (needs
``sacremoses``: ``pip install 'deep_nmt_tf[scoring]'``; its absence stops the tool before any
run); runs scored before get it from their translations.

Besides each run's scores, the report gives each system (a run of the suite file with all its
seeds) its mean, standard deviation and 95% t-interval over the seeds (results.json
``systems``), and tests it against the suite's ``compare_to`` systems (default ``baseline``
and ``deep_pre``, those present) by sacreBLEU's paired bootstrap (1,000 resamples, 95%
intervals) on the same test sentences, seed s against seed s, with the verdict of
:func:`~deep_nmt_tf.decoding.significance.call_effect` (``comparisons``; results.md shows both
tables).  It also says how far the dev score predicted the test score across the runs
(``dev_test``: Pearson and Spearman correlations, the least-squares line, the residual spread,
and what picking the run with the best dev score gave on test, over all runs and over those
within 5 dev BLEU of the best).  All are rebuilt from every run on disk whenever the tool runs
(``--only`` keeps the other systems; nothing is retrained or decoded again; a pair already
tested is reused).

``--max_train_minutes=M`` gives each run a training-time budget: its training stops (with a
checkpoint) once the run's clock, summed over resumes, reaches M minutes, and the run is
averaged, decoded and scored at the update it reached (``results.json`` records
``training.budget``).  The schedules do not depend on the planned length, so the recipe is the
same up to that update; what fits in M minutes depends on the machine.  Run again with a larger
budget, or without one, the run trains on from there.

Training on a GPU machine with only JAX (no TensorFlow), scoring here::

    deep-nmt-experiment --suite=multi30k ... --only=deep_post_deepnorm --stop_after=preprocess
    # copy OUTPUT_DIR/runs/<run>/ there, then, there:
    KERAS_BACKEND=jax deep-nmt-experiment --suite=multi30k ... --route=fit --stop_after=average
    # copy runs/<run>/ back without its ckpt-*.weights.h5, then, here, the same command as above
    # without --stop_after: the run is decoded and scored, neither retrained nor re-averaged.

``--archive_dir=DIR`` keeps a results archive (:mod:`deep_nmt_tf.experiments.archive`): each
scored run's results.json entry, translations, config and training curves, about 100 kB a
run, in a directory that outlives the machine (this repository keeps its suites' archives in
``docs/results/<suite>/``).  Every scored run of OUTPUT_DIR is archived (when its record
changed); the archived runs OUTPUT_DIR lacks join results.json, the seed statistics and the
paired tests; a run found in the archive is not trained again (delete ``DIR/<run>`` to train
it again; a changed recipe is refused).

``--continue_from=RUN`` starts each new run directory from a copy of RUN's of the same seed
(in OUTPUT_DIR) and trains on from its last checkpoint: for a run that is RUN trained longer,
the same model and recipe but a larger ``training.train_steps`` (the schedules do not depend on
the train length)::

    deep-nmt-experiment --suite=multi30k ... --only=deep_pre_12k --seeds=3 --continue_from=deep_pre

Its checkpoints, config, vocabulary and curves are copied, not its average, translations or
scores; RUN's own seeds train as usual (``--only=deep_pre,deep_pre_12k`` trains deep_pre, then
continues it); the training record (time, CPU time) starts from RUN's and names it
(``training.continued_from`` in results.json); another model or recipe, a source with as many
updates as the run trains, or a run directory that trained on its own is refused
(:mod:`deep_nmt_tf.experiments.recipe`).

``--route=fit`` trains with Keras ``fit`` (the grad-norm ratio is off: no r_t curve for such a
run); ``experiment.json`` records the route, the backend and the accelerator.

Exit status: 0 on success; 1 when a run's training stopped on an error it names (non-finite
updates, a lost worker) and for a flag error that absl reports with its usage message (an
unknown or missing flag); 2 for a bad suite file, config, data, ``--seeds``, ``--max_steps``,
``--max_train_minutes`` or ``--extra_test``, or a run directory that another process is writing
(named, no traceback); 128 + the signal's number
(143 for SIGTERM, 130 for Ctrl-C) after an interruption: during training a checkpoint is
saved, between stages (averaging, decoding) the interrupted stage reruns as a whole.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "suite", None, "Suite file, or NAME for configs/NAME/suite.yaml."),
    (flags.DEFINE_string, "data_dir", None, "Directory of the suite's corpus files."),
    (flags.DEFINE_string, "output_dir", None, "Where runs, results and figures go."),
    (flags.DEFINE_list, "only", [], "Only these runs: a run of the suite file (all its seeds) "
                                    "or one seed of it by name, e.g. deep_post-seed1."),
    (flags.DEFINE_list, "seeds", [], "Seeds instead of the suite's (integers); a run keeps "
                                     "its plain name for the one seed the suite file gives "
                                     "it, every other seed is NAME-seedN."),
    (flags.DEFINE_integer, "max_steps", None, "Cap every run's training.train_steps."),
    (flags.DEFINE_float, "max_train_minutes", None,
     "Stop each run's training when its clock (summed over resumes) reaches this many "
     "minutes, and score it at the update reached; run again with more (or none) to train "
     "on."),
    (flags.DEFINE_multi_string, "extra_test", [], "NAME=SOURCE:REFERENCE, another test set "
                                                  "to score (repeatable)."),
    (flags.DEFINE_multi_string, "override", [], "Config override KEY=VALUE for every run "
                                                "(repeatable)."),
    (flags.DEFINE_enum, "route", "custom", ["custom", "fit"],
     "How runs train: the custom loop (TensorFlow), or Keras fit on the current backend "
     "(KERAS_BACKEND=jax on a machine with only JAX and a GPU)."),
    (flags.DEFINE_string, "archive_dir", None,
     "A results archive (e.g. docs/results/multi30k): every scored run's entry, "
     "translations, config and curves are kept there, the archived runs join the report "
     "and are not trained again."),
    (flags.DEFINE_enum, "stop_after", None, ["preprocess", "train", "average"],
     "Stop each run after this stage (e.g. preprocess here, train and average with "
     "--route=fit on a GPU machine, then run again here to decode and score)."),
    (flags.DEFINE_string, "continue_from", None,
     "A run of the suite (e.g. deep_pre): each new run directory starts from a copy of that "
     "run's directory of the same seed and trains on from its last checkpoint (same model "
     "and recipe, a longer train length)."),
])


def _fail(message: str) -> None:
    print(f"experiment: error: {message}", file=sys.stderr)
    sys.exit(2)


def _extra_tests(values):
    tests = []
    for value in values:
        name, _, paths = value.partition("=")
        source, _, reference = paths.partition(":")
        if not (name and source and reference):
            _fail(f"--extra_test={value!r}: expected NAME=SOURCE:REFERENCE")
        tests.append((name, source, reference))
    return tests


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not (FLAGS.suite and FLAGS.data_dir and FLAGS.output_dir):
        raise app.UsageError("--suite, --data_dir and --output_dir are required")
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        _fail(f"--seeds={','.join(FLAGS.seeds)}: integers expected")
    if FLAGS.max_steps is not None and FLAGS.max_steps < 1:
        _fail("--max_steps must be >= 1")
    if FLAGS.max_train_minutes is not None and not FLAGS.max_train_minutes > 0:
        _fail(f"--max_train_minutes={FLAGS.max_train_minutes:g}: must be > 0")
    extra = _extra_tests(FLAGS.extra_test)
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.experiments import find_suite, load_suite, run_suite
    from deep_nmt_tf.health import TrainingDiverged, TrainingInterrupted, WorkerLost
    from deep_nmt_tf.run_lock import RunLockError

    try:
        suite = load_suite(find_suite(FLAGS.suite))
        results = run_suite(suite, FLAGS.data_dir, FLAGS.output_dir, only=FLAGS.only,
                            seeds=seeds, max_steps=FLAGS.max_steps, extra_tests=extra,
                            overrides=FLAGS.override,
                            max_train_minutes=FLAGS.max_train_minutes, route=FLAGS.route,
                            stop_after=FLAGS.stop_after, archive_dir=FLAGS.archive_dir,
                            continue_from=FLAGS.continue_from)
    except (ConfigError, DataError, FileNotFoundError, ValueError, RunLockError) as e:
        _fail(str(e))
    except TrainingInterrupted as e:  # SIGTERM / Ctrl-C while a run trained: checkpoint saved
        cli.exit_interrupted("experiment", e)
    except (TrainingDiverged, WorkerLost) as e:  # (FitDiverged is a TrainingDiverged)
        print(f"experiment: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Between stages (averaging, decoding): each resumes as a whole.
        print("experiment: interrupted; run the same command again to continue (finished "
              f"stages are kept): {cli.resume_command()}", file=sys.stderr)
        sys.exit(130)
    from deep_nmt_tf.experiments.suite import REPORT_KEYS, RESERVED_KEYS

    for name, entry in results.items():
        if name in REPORT_KEYS:  # the systems' statistics and comparisons: results.md
            continue
        scores = ", ".join(f"{test} {s['bleu_lc']:.2f} lc / {s['bleu']:.2f} cased" + (
            f" / {s['bleu_tok_lc']:.2f} tokenised lc" if "bleu_tok_lc" in s else "")
            for test, s in entry.items() if test not in RESERVED_KEYS)
        print(f"{name}: {scores}")


def run() -> None:
    """Console-script entry point (``deep-nmt-experiment``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
