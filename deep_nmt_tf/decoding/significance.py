"""How sure a BLEU difference is: statistics over seeds and sacreBLEU's paired bootstrap test.

Two kinds of uncertainty, reported side by side because neither covers the other:

- **between training runs** (:func:`seed_statistics`): mean, sample standard deviation and the
  95% Student-t interval of the mean over the seeds of one system;
- **between test sets** (:func:`paired_bootstrap`): sacreBLEU's paired bootstrap resampling
  (Koehn 2004; ``sacrebleu.significance.PairedTest`` with ``test_type="bs"``, 1,000 resamples by
  default, resampling seed 12345 unless ``SACREBLEU_SEED`` says otherwise) of one system
  against a baseline on the same test sentences: each system's BLEU, its bootstrap mean with
  the 95% interval, the p-value of the difference, and the 95% percentile interval of the
  difference itself over the same resamples (sacreBLEU reports the system's interval only).

:func:`call_effect` applies the rule ``docs/RESULTS.md`` uses: a difference is called an effect
only when the seeds and the test agree (every seed pair significant in the same direction and
the seed means ordered the same way).

:func:`score_agreement` says how well one score predicts another across runs (the dev score a
run is chosen by against its test score): Pearson's and Spearman's correlations, the
least-squares line and the spread of the runs about it.

No TensorFlow is imported here.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Mapping, Sequence

__all__ = ["seed_statistics", "paired_bootstrap", "call_effect", "score_agreement", "T_975"]

#: Two-sided 95% quantiles of Student's t distribution by degrees of freedom (1-30).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _t975(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else 1.960


def seed_statistics(values: Sequence[float]) -> Dict[str, object]:
    """Mean, sample standard deviation (``ddof=1``) and the 95% t-interval of the mean.

    Returns ``{"n", "mean", "std", "ci95"}`` (``ci95`` a ``[low, high]`` list; with one value
    the standard deviation is 0 and the interval ``None``: one seed says nothing about seeds).

    >>> s = seed_statistics([39.6, 39.2, 39.4])
    >>> round(s["mean"], 2), round(s["std"], 2), [round(v, 2) for v in s["ci95"]]
    (39.4, 0.2, [38.9, 39.9])
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "std": 0.0, "ci95": None}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def paired_bootstrap(references: Sequence[str], baseline: Sequence[str],
                     systems: Mapping[str, Sequence[str]], lowercase: bool = True,
                     n_samples: int = 1000) -> Dict[str, Dict[str, float]]:
    """sacreBLEU's paired bootstrap test of each system against ``baseline``.

    Args:
      references: one reference per test sentence.
      baseline: the baseline's detokenised translations (same order).
      systems: name -> translations of the systems to compare with it.
      lowercase: score lowercased BLEU (the Multi30k figure); cased otherwise.
      n_samples: bootstrap resamples (1,000: the usual choice, and sacreBLEU's default).

    Returns:
      name -> ``{"bleu", "mean", "ci95": [low, high], "p_value", "delta", "delta_ci95"}``: the
      system's BLEU, its bootstrap mean and 95% interval (sacreBLEU's: the mean plus or minus
      half the 2.5-97.5 percentile range), the p-value of its difference from the baseline,
      ``delta`` = its BLEU minus the baseline's, and ``delta_ci95`` the 2.5 and 97.5
      percentiles of that difference over the same resamples (:func:`_resample_weights`).
      The baseline itself is under ``"baseline"`` (no p-value, no ``delta_ci95``).

    Raises:
      ValueError: a system with another number of sentences than the references.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    references = list(references)
    named = [("baseline", list(baseline))] + [(name, list(h)) for name, h in systems.items()]
    for name, hyps in named:
        if len(hyps) != len(references):
            raise ValueError(f"{name}: {len(hyps)} translations for {len(references)} "
                             "references")
    if "baseline" in systems:
        raise ValueError("'baseline' is the name of the reference system; rename that system")
    test = PairedTest(named, {"BLEU": BLEU(lowercase=lowercase)}, [references],
                      test_type="bs", n_samples=int(n_samples))
    _, scores = test()
    base_score = float(scores["BLEU"][0].score)
    metric = BLEU(lowercase=lowercase)  # its own: PairedTest's keeps state between calls
    weights = _resample_weights(len(references), int(n_samples))
    resampled_base = _resampled_bleu(metric, named[0][1], references, weights)
    out: Dict[str, Dict[str, float]] = {}
    for (name, hyps), result in zip(named, scores["BLEU"]):
        entry = {"bleu": float(result.score), "delta": float(result.score) - base_score}
        if out:  # a system, not the baseline (the first)
            diffs = sorted(_resampled_bleu(metric, hyps, references, weights) - resampled_base)
            low = len(diffs) // 40  # sacreBLEU's 2.5th percentile index (estimate_ci)
            entry["delta_ci95"] = [float(diffs[low]), float(diffs[len(diffs) - low - 1])]
        if result.mean is not None:
            entry.update(mean=float(result.mean), ci95=[float(result.mean - result.ci),
                                                        float(result.mean + result.ci)])
        if result.p_value is not None:
            entry["p_value"] = float(result.p_value)
        out[name] = entry
    return out


def _resample_weights(n: int, n_samples: int):
    """How often each of ``n`` sentences is drawn in each resample (``[n_samples, n]``): the
    draws of sacreBLEU's paired bootstrap (``numpy.random.default_rng`` seeded with
    ``SACREBLEU_SEED``, 12345 unless set; unseeded for ``none`` or 0, as sacreBLEU), so the
    interval of the difference comes from the resamples its p-value counts."""
    import numpy as np

    seed = os.environ.get("SACREBLEU_SEED", "12345")
    seed = None if seed.lower() == "none" or int(seed) == 0 else int(seed)
    draws = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    return np.stack([np.bincount(row, minlength=n) for row in draws])


def _resampled_bleu(metric, hypotheses: Sequence[str], references: Sequence[str], weights):
    """Corpus BLEU of each resample (``weights`` from :func:`_resample_weights`), from each
    sentence's n-gram statistics (sacreBLEU's public ``corpus_score`` of one sentence and
    ``BLEU.compute_bleu``: the sums are the corpus statistics, so a resample's score is
    sacreBLEU's score of that resampled corpus)."""
    import numpy as np

    rows: List[List[float]] = []
    for hypothesis, reference in zip(hypotheses, references):
        s = metric.corpus_score([hypothesis], [[reference]])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    sums = weights @ np.asarray(rows, dtype=np.float64)
    order = metric.max_ngram_order
    return np.array([metric.compute_bleu(
        correct=row[2:2 + order], total=row[2 + order:], sys_len=int(row[0]),
        ref_len=int(row[1]), smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value, effective_order=metric.effective_order,
        max_ngram_order=order).score for row in sums])


def call_effect(system_scores: Sequence[float], baseline_scores: Sequence[float],
                p_values: Sequence[float], alpha: float = 0.05) -> str:
    """The verdict on one comparison from its seeds and its paired tests.

    Args:
      system_scores, baseline_scores: test BLEU of each seed of the two systems.
      p_values: the paired bootstrap p-values of the seed pairs (system seed i against
        baseline seed i).
      alpha: significance level.

    Returns:
      ``"better"`` / ``"worse"``: every seed pair is significant at ``alpha`` with the same
      sign as the difference of the seed means, and there are at least two seeds on each
      side; otherwise ``"no effect established"``.

    >>> call_effect([40.1, 40.3], [39.5, 39.6], [0.01, 0.02])
    'better'
    >>> call_effect([40.1, 39.4], [39.5, 39.6], [0.01, 0.3])
    'no effect established'
    """
    if min(len(system_scores), len(baseline_scores)) < 2 or not p_values:
        return "no effect established"
    diff = (sum(system_scores) / len(system_scores)) - (
        sum(baseline_scores) / len(baseline_scores))
    pairs = list(zip(system_scores, baseline_scores))
    same_sign = all((s - b) * diff > 0 for s, b in pairs)
    if diff and same_sign and all(p < alpha for p in p_values):
        return "better" if diff > 0 else "worse"
    return "no effect established"


def _ranks(values: Sequence[float]) -> List[float]:
    """1-based ranks, ties sharing the mean of their ranks (as Spearman's rho asks)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def score_agreement(x: Sequence[float], y: Sequence[float]) -> Dict[str, object]:
    """How well ``x`` (e.g. each run's dev BLEU) predicts ``y`` (its test BLEU) across runs.

    Returns ``{"n", "pearson", "spearman", "slope", "intercept", "residual_std"}``: the two
    correlations, the least-squares line ``y = slope * x + intercept`` and the sample standard
    deviation of the residuals about it (``n - 2`` degrees of freedom: how far a run's ``y``
    typically lies from what its ``x`` predicts).  A correlation or the line is ``None`` where
    it is undefined (a constant ``x`` or ``y``; the residual spread needs three runs).

    >>> a = score_agreement([1.0, 2.0, 3.0, 4.0], [2.0, 4.1, 5.9, 8.0])
    >>> round(a["pearson"], 4), a["spearman"], round(a["slope"], 2), round(a["intercept"], 2)
    (0.9995, 1.0, 1.98, 0.05)
    """
    x, y = [float(v) for v in x], [float(v) for v in y]
    if len(x) != len(y):
        raise ValueError(f"{len(x)} x values against {len(y)} y values")
    if len(x) < 2:
        raise ValueError(f"score_agreement needs two points or more, got {len(x)}")
    n = len(x)
    out: Dict[str, object] = {"n": n, "pearson": _pearson(x, y),
                              "spearman": _pearson(_ranks(x), _ranks(y)),
                              "slope": None, "intercept": None, "residual_std": None}
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx > 0:
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
        intercept = my - slope * mx
        out.update(slope=slope, intercept=intercept)
        if n > 2:
            out["residual_std"] = math.sqrt(
                sum((b - (slope * a + intercept)) ** 2 for a, b in zip(x, y)) / (n - 2))
    return out
