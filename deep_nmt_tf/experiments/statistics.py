"""How sure a suite's differences are: ``results.json``'s ``systems`` (each system's scores over
its seeds) and ``comparisons`` (paired bootstrap tests against the reference systems), rebuilt
from what is on disk (the runs' entries in results.json and their ``<test>.hyp`` files, in the
run directories or, for a run taken from a results archive, in the archive, :mod:`.archive`) every
time the tool writes its report, so a re-scoring retrains nothing and ``--only`` keeps every
other system's figures.

A **system** is a run of the suite file with all its seeds: the entries ``NAME`` and
``NAME-seedN`` of results.json, by the seed each recorded (``training.seed``).  A seed trained
twice (``NAME`` and ``NAME-seedN`` with the same seed: the same initialisation and data order,
so not a second sample) counts once, as the run named ``NAME``; the other is listed under
``left_out``.  ``systems[NAME]`` = ``{"seeds", "runs", "tests": {test: {metric: {"n", "mean",
"std", "ci95"}}}}`` for ``bleu``, ``bleu_lc`` and ``chrf`` (:func:`seed_statistics`: the 95%
Student-t interval of the mean; ``None`` with one seed).

A **comparison** is one system against one reference system (the suite's ``compare_to``) on one
test set for one metric (lowercased and cased BLEU), **seed by seed**: system seed *s* against
reference seed *s* (the seeds both have; with none in common, the seeds in ascending order are
paired by rank), each pair a paired bootstrap on the same test sentences
(:func:`~deep_nmt_tf.decoding.significance.paired_bootstrap`: sacreBLEU's, 1,000 resamples,
95% intervals).  Pairing per seed, rather than testing one seed or a concatenation of the
seeds' outputs, keeps the two sources of doubt apart: each test covers the choice of test
sentences for one pair of trained models, and the spread of the pairs covers training; a
concatenation would resample copies of one source sentence as independent sentences (too
narrow an interval) and still say nothing about another training run.  A comparison records
each pair (scores, delta, the bootstrap interval of the delta, p-value), the mean delta, its
t-interval over the pairs (two pairs or more), and the verdict of
:func:`~deep_nmt_tf.decoding.significance.call_effect` (an effect only when at least two seed
pairs are each significant in the direction of the means).  A pair's result is reused while
its inputs (both translation files, the references, the metric, the number of resamples and
``SACREBLEU_SEED``) hash the same (``inputs_sha256``).

A suite with ``tokenized_bleu_lc`` also scores ``bleu_tok_lc`` (BLEU on lowercased,
Moses-tokenised text, :func:`~deep_nmt_tf.decoding.scoring.moses_lowercased_bleu`): the tool
adds it to each run's entry when the run is scored (:func:`tokenized_bleu_lc`), and the report
fills it in for entries that lack it (runs scored or archived before) from their translations
(:func:`add_tokenized_bleu`); it joins the seed statistics, not the paired tests.

``dev_test`` (:func:`dev_test_agreement`) asks how far the dev score, by which each run's
length penalty is chosen and by which a user would pick among runs, predicts the test score,
over every run of the report (each seed a point): per test set, the correlations and the
least-squares line of test BLEU (lowercased) on dev BLEU, and what picking the run with the
best dev score would have given on the test set against the best test score ("regret"); both
over all runs and over the runs within :data:`NEAR_BEST_DEV` dev BLEU of the best (those a
choice is really between: a run that failed to train is an easy call and would inflate the
correlation).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from deep_nmt_tf.decoding.significance import call_effect, paired_bootstrap, seed_statistics
from deep_nmt_tf.experiments.suite import REPORT_KEYS, RESERVED_KEYS, Suite

__all__ = ["SEED_METRICS", "SCORE_KEYS", "COMPARED_METRICS", "N_SAMPLES", "system_statistics",
           "compare_systems", "require_tokenizer", "tokenized_bleu_lc", "add_tokenized_bleu",
           "update_report", "dev_test_agreement", "NEAR_BEST_DEV"]

#: The scores summarised over seeds (``bleu_tok_lc`` where every seed of a system has it), and
#: the BLEU variants tested (name -> lowercased).
SEED_METRICS = ("bleu_lc", "bleu", "chrf", "bleu_tok_lc")
#: A test set's scores in a run's entry of results.json (``bleu_tok_lc`` optional).
SCORE_KEYS = SEED_METRICS
COMPARED_METRICS = {"bleu_lc": True, "bleu": False}
#: Bootstrap resamples per test (sacreBLEU's default).
N_SAMPLES = 1000
#: dev_test's "near_best": the runs whose dev score is within this many points of the best.
NEAR_BEST_DEV = 5.0
#: The test score dev_test predicts (each run's dev score is its ``decoding.dev_bleu``).
AGREEMENT_METRIC = "bleu_lc"


def _runs(results: Mapping[str, Dict]) -> Dict[str, Dict]:
    return {name: entry for name, entry in results.items() if name not in REPORT_KEYS}


def _test_names(entry: Dict) -> List[str]:
    return [k for k in entry if k not in RESERVED_KEYS]


def system_statistics(suite: Suite, results: Mapping[str, Dict],
                      tests: Sequence[str] = ()) -> Dict[str, Dict]:
    """``systems`` of results.json (module docstring), in the suite's order of runs; ``tests``
    orders the test sets (others follow by name)."""
    names = [r.name for r in suite.runs]
    runs = _runs(results)
    members: Dict[str, Dict[int, str]] = {}
    left_out: Dict[str, List[str]] = {}
    # The plain name first: of two runs of one seed, the one named NAME stands.
    for run in sorted(runs, key=lambda n: (n not in names, n)):
        match = re.fullmatch(r"(.+)-seed(\d+)", run)
        system = run if run in names else match.group(1) if match else None
        if system not in names:
            continue  # a run no longer in the suite file
        seed = int(runs[run].get("training", {}).get("seed", match.group(2) if match else 0))
        if seed in members.setdefault(system, {}):
            left_out.setdefault(system, []).append(run)
        else:
            members[system][seed] = run
    out = {}
    for system in (n for n in names if n in members):
        seeds = sorted(members[system])
        entries = [runs[members[system][s]] for s in seeds]
        found = {t for e in entries for t in _test_names(e)}
        ordered = [t for t in tests if t in found] + sorted(found - set(tests))
        out[system] = {"seeds": seeds, "runs": [members[system][s] for s in seeds], "tests": {
            test: {m: seed_statistics([e[test][m] for e in entries if test in e])
                   for m in SEED_METRICS
                   if all(m in e[test] for e in entries if test in e)} for test in ordered}}
        if system in left_out:
            out[system]["left_out"] = sorted(left_out[system])
    return out


def _seed_pairs(seeds: Sequence[int], reference_seeds: Sequence[int]) -> List[Tuple[int, int]]:
    common = sorted(set(seeds) & set(reference_seeds))
    if common:
        return [(s, s) for s in common]
    return list(zip(sorted(seeds), sorted(reference_seeds)))


def _read(path: str, cache: Dict[str, Tuple[str, List[str]]]) -> Tuple[str, List[str]]:
    """(sha256, lines) of a text file, read once (the lines as the scoring reads them)."""
    from deep_nmt_tf.experiments.state import read_lines

    if path not in cache:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        cache[path] = (digest.hexdigest(), read_lines(path))
    return cache[path]


def compare_systems(suite: Suite, systems: Mapping[str, Dict], references: Mapping[str, str],
                    output_dir: str, previous: Sequence[Dict] = (), log: Callable = print,
                    n_samples: int = N_SAMPLES,
                    hyp_dirs: Optional[Mapping[str, str]] = None) -> List[Dict]:
    """``comparisons`` of results.json (module docstring).

    Args:
      suite: its ``compare_to`` names the reference systems.
      systems: from :func:`system_statistics`.
      references: test set -> reference file.
      output_dir: holds ``runs/<run>/<test>.hyp``.
      previous: the comparisons written before (pairs with the same inputs are reused).
      log: says which comparisons cannot be made (a missing file, another sentence count).
      hyp_dirs: run -> another directory of its ``<test>.hyp`` files, read when
        ``output_dir/runs/<run>/`` has none (a run taken from a results archive).
    """
    reused = {p["inputs_sha256"]: p for c in previous for p in c.get("pairs", ())
              if "inputs_sha256" in p}
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    files: Dict[str, Tuple[str, List[str]]] = {}

    def hypotheses(run: str, test: str) -> Optional[Tuple[str, List[str]]]:
        path = os.path.join(output_dir, "runs", run, f"{test}.hyp")
        if not os.path.isfile(path) and run in (hyp_dirs or {}):
            path = os.path.join(hyp_dirs[run], f"{test}.hyp")
        return _read(path, files) if os.path.isfile(path) else None

    planned: List[Dict] = []
    todo: Dict[Tuple[str, str, str], List[Tuple[Dict, List[str]]]] = {}
    for reference in (n for n in suite.compare_to if n in systems):
        ref_system = systems[reference]
        for name, system in systems.items():
            if name == reference:
                continue
            for test in (t for t in system["tests"] if t in ref_system["tests"]):
                if test not in references or not os.path.isfile(references[test]):
                    log(f"{name} against {reference} on {test}: no reference file "
                        f"({references.get(test, 'not known')}): not compared")
                    continue
                ref_sha, ref_lines = _read(references[test], files)
                for metric in COMPARED_METRICS:
                    comparison = {"system": name, "reference": reference, "test": test,
                                  "metric": metric, "n_samples": n_samples, "pairs": []}
                    for s, r in _seed_pairs(system["seeds"], ref_system["seeds"]):
                        run = system["runs"][system["seeds"].index(s)]
                        ref_run = ref_system["runs"][ref_system["seeds"].index(r)]
                        hyps, base = hypotheses(run, test), hypotheses(ref_run, test)
                        if hyps is None or base is None or not (
                                len(hyps[1]) == len(base[1]) == len(ref_lines) > 0):
                            log(f"{run} against {ref_run} on {test}: translations missing or "
                                f"of another length than {references[test]}: not compared")
                            continue
                        key = hashlib.sha256("\n".join(
                            [hyps[0], base[0], ref_sha, metric, str(n_samples), seed]).encode()
                        ).hexdigest()
                        pair = {"system_run": run, "system_seed": s, "reference_run": ref_run,
                                "reference_seed": r, "inputs_sha256": key}
                        if key in reused:
                            pair = dict(reused[key], **pair)
                        else:
                            todo.setdefault((ref_run, test, metric), []).append(
                                (pair, hyps[1]))
                        comparison["pairs"].append(pair)
                    if comparison["pairs"]:
                        planned.append(comparison)
    for (ref_run, test, metric), pairs in todo.items():  # one test per reference run
        out = paired_bootstrap(_read(references[test], files)[1],
                               hypotheses(ref_run, test)[1],
                               {f"system{i}": hyps for i, (_, hyps) in enumerate(pairs)},
                               lowercase=COMPARED_METRICS[metric], n_samples=n_samples)
        for i, (pair, _) in enumerate(pairs):
            got = out[f"system{i}"]
            pair.update(system_bleu=got["bleu"], reference_bleu=out["baseline"]["bleu"],
                        delta=got["delta"], delta_ci95=got["delta_ci95"],
                        system_ci95=got["ci95"], p_value=got["p_value"])
    for comparison in planned:
        pairs = comparison["pairs"]
        deltas = seed_statistics([p["delta"] for p in pairs])
        comparison.update(delta=deltas["mean"], delta_seed_ci95=deltas["ci95"],
                          effect=call_effect([p["system_bleu"] for p in pairs],
                                             [p["reference_bleu"] for p in pairs],
                                             [p["p_value"] for p in pairs]))
    return planned


def _agreement(points: Sequence[Tuple[str, float, float]]) -> Optional[Dict]:
    """score_agreement of (run, dev, test) points, with the dev-chosen and the best test run;
    ``None`` under three points."""
    from deep_nmt_tf.decoding.significance import score_agreement

    if len(points) < 3:
        return None
    out = score_agreement([p[1] for p in points], [p[2] for p in points])
    # Ties go to the first run by name, so the pick does not depend on dictionary order.
    chosen = max(sorted(points), key=lambda p: p[1])
    best = max(sorted(points), key=lambda p: p[2])
    out.update(runs=[p[0] for p in points],
               dev_choice={"run": chosen[0], "dev": chosen[1], "test": chosen[2]},
               test_best={"run": best[0], "dev": best[1], "test": best[2]},
               regret=best[2] - chosen[2])
    return out


def dev_test_agreement(results: Mapping[str, Dict], tests: Sequence[str] = (),
                       near_best: float = NEAR_BEST_DEV) -> Dict[str, Dict]:
    """``dev_test`` of results.json (module docstring): test set -> ``{"metric", "dev_metric",
    "near_best_dev", "all", "near_best"}``, the last two from :func:`_agreement` (``None``
    under three runs).  A run counts where its entry has a dev score (``decoding.dev_bleu``)
    and the test set's ``bleu_lc``; ``tests`` orders the test sets (others follow by name)."""
    runs = _runs(results)
    found = sorted({t for e in runs.values() for t in _test_names(e)})
    out: Dict[str, Dict] = {}
    for test in [t for t in tests if t in found] + [t for t in found if t not in tests]:
        counted = {name: e for name, e in runs.items()
                   if e.get("decoding", {}).get("dev_bleu") is not None
                   and AGREEMENT_METRIC in e.get(test, {})}
        if not counted:
            continue
        points = sorted((name, float(e["decoding"]["dev_bleu"]), float(e[test][AGREEMENT_METRIC]))
                        for name, e in counted.items())
        metrics = {e["decoding"].get("dev_metric", "bleu") for e in counted.values()}
        top = max(p[1] for p in points)
        out[test] = {"metric": AGREEMENT_METRIC, "dev_metric": ", ".join(sorted(metrics)),
                     "near_best_dev": near_best, "all": _agreement(points),
                     "near_best": _agreement([p for p in points if p[1] >= top - near_best])}
    return out


def require_tokenizer(suite: Suite) -> None:
    """Raises ConfigError (naming the suite file and key) when the suite asks for
    ``bleu_tok_lc`` and ``sacremoses`` is not installed: before any run trains."""
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.decoding.scoring import MosesMissing, moses_lowercased_bleu

    if suite.tokenized_bleu_lc:
        try:
            moses_lowercased_bleu(["a"], ["a"], suite.target_suffix)
        except MosesMissing as e:
            raise ConfigError(f"{suite.path}: tokenized_bleu_lc: {e}") from e


def tokenized_bleu_lc(hyp_path: str, reference_path: str, language: str) -> Dict[str, object]:
    """``bleu_tok_lc`` and its signature of a translation file against its reference file
    (:func:`~deep_nmt_tf.decoding.scoring.moses_lowercased_bleu`)."""
    from deep_nmt_tf.decoding.scoring import moses_lowercased_bleu
    from deep_nmt_tf.experiments.state import read_lines

    return moses_lowercased_bleu(read_lines(hyp_path), read_lines(reference_path), language)


def add_tokenized_bleu(suite: Suite, results: Dict[str, Dict], references: Mapping[str, str],
                       output_dir: str, hyp_dirs: Optional[Mapping[str, str]] = None,
                       log: Callable = print) -> None:
    """Fills ``bleu_tok_lc`` into the test scores of the runs' entries that lack it, from
    ``output_dir/runs/<run>/<test>.hyp`` or the run's ``hyp_dirs`` directory (an archived run);
    nothing without the suite's ``tokenized_bleu_lc``.  A run whose translations or reference
    are missing, or of another length, keeps its entry without it (logged)."""
    if not suite.tokenized_bleu_lc:
        return
    for run, entry in _runs(results).items():
        for test in _test_names(entry):
            if "bleu_tok_lc" in entry[test] or test not in references:
                continue
            hyp = os.path.join(output_dir, "runs", run, f"{test}.hyp")
            if not os.path.isfile(hyp) and run in (hyp_dirs or {}):
                hyp = os.path.join(hyp_dirs[run], f"{test}.hyp")
            try:
                scores = tokenized_bleu_lc(hyp, references[test], suite.target_suffix)
            except (OSError, ValueError) as e:
                log(f"{run}: {test}: no tokenised lowercased BLEU ({e})")
                continue
            entry[test]["bleu_tok_lc"] = scores["bleu_tok_lc"]


def _recorded_references(results: Mapping[str, Dict], output_dir: str) -> Dict[str, str]:
    """test -> the reference file the runs' experiment.json recorded (the tests of earlier
    invocations, e.g. an ``--extra_test`` not given this time)."""
    from deep_nmt_tf.experiments.state import RunState

    out: Dict[str, str] = {}
    for run in _runs(results):
        run_dir = os.path.join(output_dir, "runs", run)
        if RunState.exists(run_dir):
            for test, scores in RunState.of(run_dir).data.get("tests", {}).items():
                if scores.get("reference"):
                    out.setdefault(test, scores["reference"])
    return out


def update_report(suite: Suite, results: Dict[str, Dict], references: Mapping[str, str],
                  output_dir: str, log: Callable = print) -> None:
    """Sets ``results["systems"]``, ``results["comparisons"]`` and ``results["dev_test"]`` from
    the runs' entries and translations (``references``: this invocation's test sets; those of
    earlier ones come from the runs' records)."""
    from deep_nmt_tf.experiments.archive import archived_dirs

    refs = dict(_recorded_references(results, output_dir), **references)
    archived = archived_dirs(results)
    add_tokenized_bleu(suite, results, refs, output_dir, archived, log)
    systems = system_statistics(suite, results, list(references))
    results["comparisons"] = compare_systems(suite, systems, refs, output_dir,
                                             results.get("comparisons", ()), log,
                                             hyp_dirs=archived)
    results["systems"] = systems
    results["dev_test"] = dev_test_agreement(results, list(references))
