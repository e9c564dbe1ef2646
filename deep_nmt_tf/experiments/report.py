"""The report of an experiment suite: ``results.json`` and ``results.md`` (the table, with the
machines each run trained on) and ``figures/`` (r_t curves, transparent-attention weights, DLCL
matrices, lexical shortcut gates, embedding-to-layer similarity)."""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Sequence, Tuple

from deep_nmt_tf.experiments.suite import PlannedRun, Suite

__all__ = ["markdown", "figures", "write_results"]


def markdown(results: Dict[str, Dict], tests: Sequence[str]) -> str:
    head = ["run", "params", "precision", "updates", "train min", "alpha"]
    for t in tests:
        head += [f"{t} BLEU lc", f"{t} BLEU", f"{t} chrF"]
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
        cells = [name, f"{t.get('parameters', 0) / 1e6:.2f}M", t.get("precision", ""), updates,
                 minutes, str(r["decoding"]["length_penalty"])]
        for test in tests:
            s = r.get(test, {})
            cells += [f"{s.get('bleu_lc', float('nan')):.2f}", f"{s.get('bleu', float('nan')):.2f}",
                      f"{s.get('chrf', float('nan')):.2f}"]
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
    return "\n".join(lines) + "\n"


def figures(suite: Suite, runs: List[PlannedRun], output_dir: str, test: Tuple[str, str],
            log: Callable) -> List[str]:
    from deep_nmt_tf.analysis.figures import plot_runs
    from deep_nmt_tf.analysis.probe import probe_models, save_results

    figures_dir = os.path.join(output_dir, "figures")
    directory = {r.name: os.path.join(output_dir, "runs", r.name) for r in runs}
    by_base = {}
    for r in runs:
        by_base.setdefault(r.base, []).append(r.name)
    written = []
    ratio = [n for base in suite.grad_norm_ratio_runs for n in by_base.get(base, [])]
    if ratio:
        written += plot_runs([directory[n] for n in ratio], ratio, figures_dir,
                             figures=("grad_norm_ratio",), log=log)
    written += plot_runs([directory[r.name] for r in runs], [r.name for r in runs], figures_dir,
                         figures=("transparent", "dlcl", "gates"), log=log)
    probe = [n for base in suite.probe_runs for n in by_base.get(base, [])]
    if probe:
        results = probe_models([os.path.join(directory[n], "averaged") for n in probe], probe,
                               source=test[0], target=test[1], max_sentences=500)
        written += save_results(results, os.path.join(figures_dir, "probe"))
    return written


def write_results(results: Dict[str, Dict], path: str, tests: List[str],
                  output_dir: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    names = [t for t in tests if any(t in r for r in results.values())]
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results, names))
