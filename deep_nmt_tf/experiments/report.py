"""The report of an experiment suite: ``results.json`` and ``results.md`` (the table, with the
machines each run trained on; then, from results.json's ``systems`` and ``comparisons``
(:mod:`.statistics`), the table of each system over its seeds and the table of its paired
comparisons; from its ``dev_test``, how far dev predicted test across the runs) and
``figures/`` (r_t curves, transparent-attention weights, DLCL matrices, lexical shortcut gates,
embedding-to-layer similarity)."""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from deep_nmt_tf.experiments.state import AVERAGED_DIRNAME, write_json
from deep_nmt_tf.experiments.suite import REPORT_KEYS, PlannedRun, Suite
from deep_nmt_tf.run_dir import checkpoint_step

__all__ = ["markdown", "spikes_text", "seed_table", "comparison_table", "dev_test_text", "figures",
           "write_results"]

_METRIC_NAMES = {"bleu_lc": "BLEU lc", "bleu": "BLEU", "chrf": "chrF",
                 "bleu_tok_lc": "BLEU tok lc"}


def _metrics(score_dicts) -> Tuple[str, ...]:
    """The table's score columns: ``bleu_tok_lc`` after the three when any row has it."""
    extra = any("bleu_tok_lc" in s for s in score_dicts)
    return ("bleu_lc", "bleu", "chrf") + (("bleu_tok_lc",) if extra else ())


def _interval(values) -> str:
    return "" if values is None else f"[{values[0]:.2f}, {values[1]:.2f}]"


def seed_table(systems: Dict[str, Dict], tests: Sequence[str]) -> str:
    """Each system's scores over its seeds: mean +- standard deviation [95% t-interval]."""
    metrics = _metrics(s["tests"].get(t, {}) for s in systems.values() for t in tests)
    head = ["system", "seeds"] + [f"{t} {_METRIC_NAMES[m]}" for t in tests for m in metrics]
    lines = ["Each system over its seeds: mean ± standard deviation [95% t-interval of the "
             "mean] (one seed: its score).", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, system in systems.items():
        cells = [name, ", ".join(str(s) for s in system["seeds"])]
        for test in tests:
            for metric in metrics:
                s = system["tests"].get(test, {}).get(metric)
                cells.append("" if s is None else f"{s['mean']:.2f}" if s["n"] < 2 else
                             f"{s['mean']:.2f} ± {s['std']:.2f} {_interval(s['ci95'])}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_table(comparisons: Sequence[Dict]) -> str:
    """The paired comparisons: one row per system, reference system, test set and metric."""
    n = comparisons[0]["n_samples"] if comparisons else 1000
    head = ["system", "against", "test", "metric", "seed pairs", "Δ", "95% interval of Δ",
            "p", "Δ over seeds (95% t)", "call"]
    lines = [f"Paired bootstrap (sacreBLEU, {n:,} resamples) of each system against each "
             "reference system on the same test sentences, seed by seed (seed s against seed "
             "s); Δ = system − reference, the mean over the pairs; per pair the 95% interval of "
             "Δ and the p-value; call: an effect only when two seed pairs or more are each "
             "significant (p < 0.05) in the direction of the seed means.", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in comparisons:
        pairs = c["pairs"]
        cells = [c["system"], c["reference"], c["test"], _METRIC_NAMES[c["metric"]],
                 "; ".join(f"{p['system_seed']}-{p['reference_seed']}" for p in pairs),
                 f"{c['delta']:+.2f}", "; ".join(_interval(p["delta_ci95"]) for p in pairs),
                 "; ".join(f"{p['p_value']:.3f}" for p in pairs),
                 _interval(c["delta_seed_ci95"]) or "(one pair)", c["effect"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _agreement_sentence(a: Dict) -> str:
    choice, best = a["dev_choice"], a["test_best"]
    picked = ("it is also the best on test" if a["regret"] == 0 else
              f"{a['regret']:.2f} below the best on test, {best['run']} "
              f"(dev {best['dev']:.2f}, test {best['test']:.2f})")
    return (f"{a['n']} runs: Pearson r {_fmt(a['pearson'], '.2f')}, Spearman "
            f"{_fmt(a['spearman'], '.2f')}, {_fmt(a['slope'], '+.2f')} test per dev point, "
            f"residual standard deviation {_fmt(a['residual_std'], '.2f')}; the best dev score, "
            f"{choice['run']} (dev {choice['dev']:.2f}), scores {choice['test']:.2f} on test: "
            f"{picked}")


def dev_test_text(dev_test: Dict[str, Dict]) -> str:
    """results.md's paragraph on results.json's ``dev_test``: one line per test set and set
    of runs (all, and those near the best dev score)."""
    lines = ["How far the dev score predicts the test score across the runs (each seed a run; "
             "dev: the score that chose the length penalty; test: lowercased BLEU):", ""]
    for test, d in dev_test.items():
        for key, label in (("all", "all runs"),
                           ("near_best", f"runs within {d['near_best_dev']:g} dev points of the "
                                         "best")):
            if d.get(key):
                lines.append(f"- {test}, {label}: {_agreement_sentence(d[key])}.")
            else:
                lines.append(f"- {test}, {label}: fewer than three runs.")
    return "\n".join(lines) + "\n"


def spikes_text(spikes: Sequence[Dict]) -> str:
    """What a run's spikes were and what was done, e.g. ``"update 6,700 (|g| 28.4, 25x the
    median): rolled back to 6,600, 100 micro-batch(es) skipped"``."""
    parts = []
    for s in spikes:
        if s.get("action") == "rolled_back":
            what = (f"rolled back to {s['to_step']:,}, {s['skipped_micro_batches']:,} "
                    "micro-batch(es) skipped")
        elif s.get("action") == "kept":
            what = f"kept the checkpoint of update {checkpoint_step(s['checkpoint']):,}"
        else:
            what = "nothing done (no checkpoint kept)"
        size = (f" (|g| {s['grad_norm']:.4g}, {s['grad_norm'] / max(s['median'], 1e-30):.3g}x "
                "the median)" if "grad_norm" in s and "median" in s else "")
        parts.append(f"update {s['step']:,}{size}: {what}")
    return ", ".join(parts)


def markdown(results: Dict[str, Dict], tests: Sequence[str]) -> str:
    """``results.md``: the runs' table, then the systems' and the comparisons' tables when
    results.json has them."""
    report = {k: results[k] for k in REPORT_KEYS if k in results}
    results = {k: v for k, v in results.items() if k not in REPORT_KEYS}
    head = ["run", "params", "precision", "updates", "train min", "alpha"]
    metrics = _metrics(r.get(t, {}) for r in results.values() for t in tests)
    head += [f"{t} {_METRIC_NAMES[m]}" for t in tests for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in results.items():
        t = r["training"]
        minutes = f"{t.get('seconds', 0.0) / 60:.0f}"
        if t.get("timed_from_update", 0) > 0:  # partly or wholly trained outside the tool
            minutes = "n/a" if not t.get("seconds") else f"{minutes} (from update " \
                f"{t['timed_from_update']})"
        updates = str(t.get("updates", ""))
        if "budget" in t:
            updates += f" ({t['budget']['minutes']:g}-min budget)"
        if "continued_from" in t:  # a copy of a shorter run, trained on (--continue_from)
            updates += f" (continued from {t['continued_from']['run']} at " \
                f"{t['continued_from']['update']})"
        cells = [name, f"{t.get('parameters', 0) / 1e6:.2f}M", t.get("precision", ""), updates,
                 minutes, str(r["decoding"]["length_penalty"])]
        for test in tests:
            s = r.get(test, {})
            cells += [f"{s[m]:.2f}" if m in s else "" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    timed = [r["training"] for r in results.values() if r["training"].get("seconds")]
    if timed:
        untimed = len(results) - sum(t.get("timed_from_update", 0) == 0 for t in timed)
        lines += ["", f"Training time of the {len(timed)} timed run(s): "
                      f"{sum(t['seconds'] for t in timed) / 3600:.2f} h wall, "
                      f"{sum(t.get('cpu_seconds', 0.0) for t in timed) / 3600:.2f} CPU-hours"
                      + (f" ({untimed} run(s) trained in part or wholly outside the tool are "
                         "not fully counted)" if untimed else "") + "."]
    machines: Dict[str, List[str]] = {}
    for name, r in results.items():
        if r["training"].get("hardware"):
            machines.setdefault(r["training"]["hardware"], []).append(name)
    if machines:  # wall times are comparable only between runs on the same machine
        lines += [""] + [f"Trained on {hw}: {', '.join(names)}." for hw, names in machines.items()]
    spiky = [f"{name}: {spikes_text(r['training']['spikes'])}" for name, r in results.items()
             if r["training"].get("spikes")]
    if spiky:
        lines += ["", "Gradient-norm spikes met in training (training.grad_spike_factor; "
                      "the run directory's spikes.json): " + "; ".join(spiky) + "."]
    archives: Dict[str, List[str]] = {}
    for name, r in results.items():
        if "archive" in r:
            archives.setdefault(os.path.dirname(r["archive"]["dir"]), []).append(name)
    if archives:
        lines += [""] + [f"From the results archive {d} (no run directory here): "
                         f"{', '.join(names)}." for d, names in archives.items()]
    if report.get("systems"):
        lines += ["", seed_table(report["systems"], tests).rstrip("\n")]
    if report.get("comparisons"):
        lines += ["", comparison_table(report["comparisons"]).rstrip("\n")]
    if report.get("dev_test"):
        lines += ["", dev_test_text(report["dev_test"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def figures(suite: Suite, runs: List[PlannedRun], output_dir: str, test: Tuple[str, str],
            log: Callable, archived: Optional[Dict[str, str]] = None) -> List[str]:
    """The suite's figures; ``archived`` (run -> its directory in a results archive) adds the
    kept r_t curves of runs without a run directory here to the grad-norm-ratio figure."""
    from deep_nmt_tf.analysis.figures import plot_runs
    from deep_nmt_tf.analysis.probe import probe_models, save_results

    figures_dir = os.path.join(output_dir, "figures")
    directory = {r.name: os.path.join(output_dir, "runs", r.name) for r in runs}
    for name, path in (archived or {}).items():
        if not os.path.isdir(directory.get(name, "")):
            directory[name] = path
    by_base = {}
    for r in runs:
        by_base.setdefault(r.base, []).append(r.name)
    written = []
    ratio = [n for base in suite.grad_norm_ratio_runs for n in by_base.get(base, [])
             if os.path.isdir(directory[n])]
    if ratio:
        written += plot_runs([directory[n] for n in ratio], ratio, figures_dir,
                             figures=("grad_norm_ratio",), log=log)
    # The other figures need a run directory here (per-layer scalars, checkpoints).
    runs = [r for r in runs if os.path.isdir(os.path.join(output_dir, "runs", r.name))]
    if not runs:
        return written
    written += plot_runs([directory[r.name] for r in runs], [r.name for r in runs], figures_dir,
                         figures=("transparent", "dlcl", "gates"), log=log)
    probe = [n for base in suite.probe_runs for n in by_base.get(base, [])]
    if probe:
        results = probe_models([os.path.join(directory[n], AVERAGED_DIRNAME) for n in probe], probe,
                               source=test[0], target=test[1], max_sentences=500)
        written += save_results(results, os.path.join(figures_dir, "probe"))
    return written


def write_results(results: Dict[str, Dict], path: str, tests: List[str],
                  output_dir: str) -> None:
    write_json(path, results)
    names = [t for t in tests if any(t in r for k, r in results.items() if k not in REPORT_KEYS)]
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results, names))
