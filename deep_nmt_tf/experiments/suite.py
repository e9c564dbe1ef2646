"""An experiment suite's file and its plan: the suite schema (:class:`Suite`, :class:`SuiteRun`,
read and checked by :func:`load_suite`: errors name the file, line and key) and the runs it
plans (:func:`planned_runs`: one per run and seed).

A suite file (``configs/multi30k/suite.yaml``) names the corpus layout and the runs::

    name: multi30k
    source_suffix: en            # DATA_DIR/train.en, valid.en, test2016.en ...
    target_suffix: de
    train: train
    dev: valid
    tests: [test2016]
    seeds: [1]
    average_last: 10             # the last 10 checkpoints are averaged
    length_penalties: [0.6, 1.0, 1.4]   # tried on the dev set; the best decodes the tests
    length_penalty_extension: 10        # best at an end: up to 10 more values beyond it
    compare_to: [baseline, deep_pre]    # paired bootstrap of every system against these
    tokenized_bleu_lc: true      # also bleu_tok_lc, the official tokenised text's scoring
    grad_norm_ratio_runs: [deep_post, deep_post_transparent]
    probe_runs: [baseline, lexical_shortcuts]
    runs:
      - name: baseline
        config: baseline.yaml    # relative to the suite file
      - name: deep_post
        config: deep_post.yaml
        seeds: [1, 2]            # two runs: deep_post-seed1, deep_post-seed2
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Sequence, Tuple

from deep_nmt_tf.config import ConfigError, field
from deep_nmt_tf.config.loading import Locator, load_section

__all__ = ["SuiteRun", "Suite", "load_suite", "find_suite", "PlannedRun", "planned_runs",
           "RESERVED_KEYS", "REPORT_KEYS", "DEFAULT_COMPARE_TO"]

#: Keys of a run's entry in results.json that are not test sets (``archive``: only in the
#: entry of a run taken from a results archive, :mod:`.archive`).
RESERVED_KEYS = ("training", "decoding", "archive")

#: results.json's top-level keys beside the runs' entries (no run may be named so): the seed
#: statistics of each system, its paired comparisons and how far dev predicts test across the
#: runs (:mod:`.statistics`).
REPORT_KEYS = ("systems", "comparisons", "dev_test")

#: The reference systems of the papers' suites: the shallow baseline and the deep pre-norm
#: encoder (those of them a suite has).
DEFAULT_COMPARE_TO = ("baseline", "deep_pre")


@dataclasses.dataclass
class SuiteRun:
    """One run of a suite (several with several seeds)."""
    name: str = field("", "Run name (a directory name: letters, digits, '_', '-', '.').")
    config: str = field("", "Its config file, relative to the suite file.")
    seeds: Tuple[int, ...] = field((), "Seeds (default: the suite's); several seeds give "
                                   "runs NAME-seedN.")
    average_last: int = field(-1, "Average the last N checkpoints (-1: the suite's; 1: only "
                              "the last).", min=-1)
    overrides: Tuple[str, ...] = field((), "Config overrides KEY=VALUE of this run.")


@dataclasses.dataclass
class Suite:
    """A suite file (module docstring)."""
    name: str = field("", "Suite name.")
    description: str = field("", "What the suite compares.")
    source_suffix: str = field("en", "Source files: DATA_DIR/<split>.<source_suffix>.")
    target_suffix: str = field("de", "Target files: DATA_DIR/<split>.<target_suffix>.")
    train: str = field("train", "Training split.")
    dev: str = field("valid", "Dev split (validation, length-penalty choice).")
    tests: Tuple[str, ...] = field(("test2016",), "Test splits scored for every run.")
    seeds: Tuple[int, ...] = field((1,), "Default seeds of the runs.")
    average_last: int = field(10, "Default number of last checkpoints averaged.", min=1)
    beam_size: int = field(5, "Beam size of the test translations.", min=1)
    length_penalties: Tuple[float, ...] = field((0.6,), "Length penalties tried on the dev "
                                                "set; the best (dev BLEU, lowercased for a "
                                                "data.lowercase model) decodes the tests.")
    length_penalty_extension: int = field(
        10, "When the best length penalty is at an end of the grid, up to this many more values "
        "are tried beyond it (step: the grid's spacing at that end; never below 0) while dev "
        "BLEU improves; 0: the grid only.", min=0)
    compare_to: Tuple[str, ...] = field(
        DEFAULT_COMPARE_TO, "Reference systems (suite runs): every other system is compared "
        "with each by the paired bootstrap on the test sets, seed by seed. A name without a "
        "run is an error; left out, the default keeps those of its names the suite has.")
    tokenized_bleu_lc: bool = field(
        False, "Also score bleu_tok_lc: BLEU on lowercased text Moses-tokenised in the target "
        "language (target_suffix) with aggressive hyphen splitting, as papers score the "
        "official tokenised Multi30k (deep_nmt_tf.decoding.scoring.moses_lowercased_bleu; "
        "needs sacremoses). Reported beside the other scores and over seeds, not tested.")
    grad_norm_ratio_runs: Tuple[str, ...] = field((), "Runs whose r_t curves share a figure.")
    probe_runs: Tuple[str, ...] = field((), "Runs of the embedding-to-layer similarity figure "
                                        "(Emelin et al. Fig. 6-7).")
    runs: Tuple[SuiteRun, ...] = field((), "The runs.")

    # Where it was read from (not a key).
    path: str = dataclasses.field(default="", compare=False, metadata={"internal": True})


def load_suite(path: str) -> Suite:
    """Reads and checks a suite file (errors name file, line and key)."""
    locator = Locator()
    suite = load_section(Suite, path, locator)
    suite.path = path
    names = [r.name for r in suite.runs]
    for i, run in enumerate(suite.runs):
        if not run.name or not all(c.isalnum() or c in "_-." for c in run.name):
            raise ConfigError(f"{path}: runs[{i}].name: {run.name!r} is not a usable name")
        if not run.config:
            raise ConfigError(f"{path}: runs[{i}].config: required")
        if names.count(run.name) > 1:
            raise ConfigError(f"{path}: runs[{i}].name: {run.name!r} is used twice")
        if run.name in REPORT_KEYS:
            raise ConfigError(f"{path}: runs[{i}].name: {run.name!r} is a key of results.json "
                              f"beside the runs ({', '.join(REPORT_KEYS)}); rename the run")
    if locator.level("compare_to") < 0:  # not in the file: the default, where it applies
        suite.compare_to = tuple(n for n in DEFAULT_COMPARE_TO if n in names)
    for key in ("grad_norm_ratio_runs", "probe_runs", "compare_to"):
        unknown = [n for n in getattr(suite, key) if n not in names]
        if unknown:
            raise ConfigError(f"{locator.where(key, path)}: {key}: no run named "
                              f"{unknown[0]!r}")
    return suite


def find_suite(name_or_path: str) -> str:
    """A suite file: the path itself, or ``configs/<name>/suite.yaml`` of the working
    directory or of the source checkout this package runs from."""
    if os.path.isfile(name_or_path):
        return name_or_path
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.path.join(root, "configs", name_or_path, "suite.yaml")
                  for root in (os.getcwd(), here)]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"--suite={name_or_path}: no such file, and none of "
                            f"{', '.join(candidates)} exists")


@dataclasses.dataclass
class PlannedRun:
    """A run to do: its name, config file, seed, overrides and checkpoint average."""
    name: str
    base: str
    config: str
    seed: int
    overrides: Tuple[str, ...]
    average_last: int


def planned_runs(suite: Suite, only: Sequence[str] = (),
                 seeds: Sequence[int] = ()) -> List[PlannedRun]:
    """The suite's runs (``seeds`` instead of the suite's).  ``only`` keeps those named: a
    suite run's name (every seed of it) or a planned run's name (``deep_post-seed1``: that
    seed alone).

    A run keeps its plain name for its own seed when the suite file gives it one seed; every
    other seed is ``NAME-seedN``, so ``--seeds=2`` adds ``baseline-seed2`` beside an existing
    ``baseline`` (seed 1) instead of asking for its directory, and ``--seeds=1,2`` reuses
    ``baseline`` for seed 1.  A run the file gives several seeds is ``NAME-seedN`` for each.
    """
    out = []
    for run in suite.runs:
        own = list(run.seeds or suite.seeds)
        for seed in list(seeds or own):
            plain = len(own) == 1 and seed == own[0]
            name = run.name if plain else f"{run.name}-seed{seed}"
            out.append(PlannedRun(name, run.name,
                                  os.path.join(os.path.dirname(suite.path), run.config), seed,
                                  tuple(run.overrides),
                                  run.average_last if run.average_last > 0 else
                                  suite.average_last))
    known = {r.name for r in suite.runs} | {p.name for p in out}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"--only: no run named {unknown[0]!r} in {suite.path} (runs: "
                         f"{', '.join(p.name for p in out)})")
    if only:
        out = [p for p in out if p.name in only or p.base in only]
    return out
