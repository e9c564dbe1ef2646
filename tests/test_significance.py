"""Seed statistics and the paired bootstrap test (deep_nmt_tf.decoding.significance)."""

import math

import pytest

from deep_nmt_tf.decoding.significance import (call_effect, paired_bootstrap, score_agreement,
                                               seed_statistics)

REFS = [f"ein mann fährt fahrrad nummer {i} auf der strasse ." for i in range(60)]


def test_seed_statistics_mean_std_and_t_interval():
    s = seed_statistics([39.6, 39.2, 39.4])
    assert s["n"] == 3 and s["mean"] == pytest.approx(39.4)
    assert s["std"] == pytest.approx(0.2)
    half = 4.303 * 0.2 / math.sqrt(3)   # t(0.975, df=2)
    assert s["ci95"] == pytest.approx([39.4 - half, 39.4 + half])
    one = seed_statistics([40.09])
    assert one == {"n": 1, "mean": 40.09, "std": 0.0, "ci95": None}
    with pytest.raises(ValueError):
        seed_statistics([])


def test_paired_bootstrap_separates_a_better_system_from_a_copy():
    # The baseline drops the last word of two sentences in three; a system that is the
    # references is better; one that fixes a single sentence of the baseline is not
    # significantly different.
    base = [r if i % 3 == 0 else r.rsplit(" ", 2)[0] + " ." for i, r in enumerate(REFS)]
    near = base[:1] + [REFS[1]] + base[2:]
    out = paired_bootstrap(REFS, base, {"perfect": REFS, "near": near}, n_samples=200)
    assert out["perfect"]["bleu"] == pytest.approx(100.0)
    assert out["perfect"]["delta"] > 0 and out["perfect"]["p_value"] < 0.05
    assert 0 < out["near"]["delta"] < 1 and out["near"]["p_value"] > 0.05
    lo, hi = out["perfect"]["ci95"]
    assert lo <= out["perfect"]["mean"] <= hi
    assert "p_value" not in out["baseline"] and out["baseline"]["delta"] == 0.0


def test_paired_bootstrap_lowercase_and_length_checks():
    upper = [r.upper() for r in REFS]
    assert paired_bootstrap(REFS, upper, {}, lowercase=True)["baseline"]["bleu"] == \
        pytest.approx(100.0)
    assert paired_bootstrap(REFS, upper, {}, lowercase=False)["baseline"]["bleu"] < 10
    with pytest.raises(ValueError, match="2 translations for 60"):
        paired_bootstrap(REFS, REFS, {"short": REFS[:2]})
    with pytest.raises(ValueError, match="rename"):
        paired_bootstrap(REFS, REFS, {"baseline": REFS})


def test_call_effect_needs_seeds_and_tests_to_agree():
    assert call_effect([40.1, 40.3, 40.2], [39.5, 39.6, 39.4], [0.01, 0.02, 0.001]) == "better"
    assert call_effect([38.1, 38.3], [39.5, 39.6], [0.01, 0.02]) == "worse"
    # one seed: nothing is established, however small the p-value
    assert call_effect([41.0], [39.0], [0.001]) == "no effect established"
    # a seed pair in the other direction, or one test not significant
    assert call_effect([40.1, 39.0], [39.5, 39.6], [0.01, 0.01]) == "no effect established"
    assert call_effect([40.1, 40.3], [39.5, 39.6], [0.01, 0.2]) == "no effect established"


def test_the_interval_of_the_difference_comes_from_sacrebleus_resamples():
    """``delta_ci95`` is the 2.5-97.5 percentile range of (system - baseline) over the very
    resamples sacreBLEU's test draws: the system's resampled scores have sacreBLEU's mean."""
    from sacrebleu.metrics import BLEU

    from deep_nmt_tf.decoding.significance import _resample_weights, _resampled_bleu

    base = [r if i % 3 == 0 else r.rsplit(" ", 2)[0] + " ." for i, r in enumerate(REFS)]
    near = base[:1] + [REFS[1]] + base[2:]
    out = paired_bootstrap(REFS, base, {"perfect": REFS, "near": near}, n_samples=200)
    for name, hyps in (("perfect", REFS), ("near", near), ("baseline", base)):
        scores = _resampled_bleu(BLEU(lowercase=True), hyps, REFS, _resample_weights(60, 200))
        assert scores.mean() == pytest.approx(out[name]["mean"], abs=1e-4)
    lo, hi = out["perfect"]["delta_ci95"]
    assert 0 < lo <= out["perfect"]["delta"] <= hi
    lo, hi = out["near"]["delta_ci95"]  # one sentence fixed: the interval reaches 0
    assert lo <= 0 <= hi and lo <= out["near"]["delta"] <= hi
    assert "delta_ci95" not in out["baseline"]


def test_score_agreement_matches_numpys_correlation_and_least_squares_line():
    np = pytest.importorskip("numpy")
    dev = [39.2, 40.9, 41.3, 38.7, 40.1, 41.3, 39.9]
    test = [38.9, 40.0, 40.1, 38.5, 39.6, 39.4, 40.3]
    got = score_agreement(dev, test)
    slope, intercept = np.polyfit(dev, test, 1)
    residuals = np.array(test) - (slope * np.array(dev) + intercept)
    assert got["n"] == 7
    assert got["pearson"] == pytest.approx(np.corrcoef(dev, test)[0, 1])
    assert got["slope"] == pytest.approx(slope) and got["intercept"] == pytest.approx(intercept)
    assert got["residual_std"] == pytest.approx(math.sqrt((residuals ** 2).sum() / 5))
    # Spearman = Pearson of the ranks, the tied dev scores (41.3 twice) sharing rank 6.5.
    dev_ranks = [2, 5, 6.5, 1, 4, 6.5, 3]
    test_ranks = [2, 5, 6, 1, 4, 3, 7]
    assert got["spearman"] == pytest.approx(np.corrcoef(dev_ranks, test_ranks)[0, 1])


def test_score_agreement_undefined_cases():
    flat = score_agreement([40.0, 40.0, 40.0], [39.0, 40.0, 41.0])  # dev says nothing
    assert flat["pearson"] is None and flat["spearman"] is None and flat["slope"] is None
    two = score_agreement([39.0, 41.0], [38.0, 40.0])
    assert two["pearson"] == pytest.approx(1.0) and two["residual_std"] is None
    assert score_agreement([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])["spearman"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="two points"):
        score_agreement([40.0], [39.0])
    with pytest.raises(ValueError, match="3 x values against 2"):
        score_agreement([1.0, 2.0, 3.0], [1.0, 2.0])
