"""Experiment suites (``deep-nmt-experiment``): a workflow over the library, not part of it.

Several runs on one corpus, each trained, checkpoint-averaged, decoded with beam search and
scored, with the papers' figures:

* :mod:`.suite`: the suite file's schema (:class:`Suite`, :class:`SuiteRun`,
  :func:`load_suite`, :func:`find_suite`) and its plan (:func:`planned_runs`);
* :mod:`.state`: a run's ``experiment.json`` (what is done; every stage resumable);
* :mod:`.stages`: the stages over the runner and the checkpoint store (:func:`run_one`,
  :func:`run_suite`); :mod:`.averaged`: a run's checkpoint average; :mod:`.recipe`: which
  run directory may hold which run (seed and recipe checks), and a run continued from a copy
  of a shorter one (``--continue_from``);
* :mod:`.statistics`: each system's scores over its seeds and its paired bootstrap
  comparisons with the reference systems (results.json's ``systems`` and ``comparisons``),
  and the suite's optional tokenised lowercased BLEU (``bleu_tok_lc``);
* :mod:`.report`: ``results.json``, ``results.md`` and ``figures/``;
* :mod:`.archive`: a results archive that keeps each scored run's entry, translations and
  curves beyond its machine (``--archive_dir``).

Nothing in the core package imports this one (a test checks); scores come from
:mod:`deep_nmt_tf.decoding.scoring`.
"""

from deep_nmt_tf.decoding.scoring import table_scores as score
from deep_nmt_tf.experiments.stages import RESERVED_KEYS, run_one, run_suite
from deep_nmt_tf.experiments.suite import (PlannedRun, Suite, SuiteRun, find_suite, load_suite,
                                           planned_runs)

__all__ = ["SuiteRun", "Suite", "load_suite", "find_suite", "PlannedRun", "planned_runs",
           "run_one", "run_suite", "score", "RESERVED_KEYS"]
