"""Experiment suites: several runs on one corpus, each trained, checkpoint-averaged, decoded with
beam search and scored, with the papers' figures (``deep-nmt-experiment``).

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
    grad_norm_ratio_runs: [deep_post, deep_post_transparent]
    probe_runs: [baseline, lexical_shortcuts]
    runs:
      - name: baseline
        config: baseline.yaml    # relative to the suite file
      - name: deep_post
        config: deep_post.yaml
        seeds: [1, 2]            # two runs: deep_post-seed1, deep_post-seed2

Every stage is resumable and skipped when done, so a killed suite continues where it stopped:
training resumes from the run's last checkpoint; the average, the length-penalty choice, the
translations and the scores are recorded in the run's ``experiment.json``.  A run directory
is only resumed for the run it was made for: one trained with another seed, or with another
recipe (a training or data key that changes what is computed; not the train length, logging,
checkpointing, evaluation, compilation or data paths), is refused with the differing keys, and
``--override=training.seed=N`` is refused for ``--seeds`` (which names the runs).

``OUTPUT_DIR`` receives ``runs/<run>/`` (the run directories, with ``averaged/`` and the
translations), ``results.json`` (run -> test set -> ``{"bleu", "bleu_lc", "chrf"}``; each run
also has the reserved keys ``"training"``: updates, seconds, CPU seconds (of the updates this tool
ran: ``timed_from_update`` says where its clock started), parameters, seed, precision,
``hardware`` (CPU name with its family and model numbers, cores, TensorFlow version; machines
joined by ``"; then "`` when a run resumed on another), and ``budget`` (``minutes``,
``stopped_at``) for a run stopped by ``--max_train_minutes``; and
``"decoding"``: the beam, the chosen length penalty, its dev BLEU and ``dev_metric``, ``bleu``
or, for a model trained on lowercased text (``data.lowercase``), ``bleu_lc``), ``results.md``
(the table, with the machines each run trained on) and ``figures/`` (r_t curves,
transparent-attention weights, DLCL matrices, lexical shortcut gates, embedding-to-layer
similarity).

Scores: ``bleu`` is sacreBLEU (13a, cased) on detokenised output, ``bleu_lc`` the same
lowercased (the number the Multi30k literature reports), ``chrf`` sacreBLEU chrF2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from deep_nmt_tf.config import ConfigError, field, load_config
from deep_nmt_tf.config.loading import load_section
from deep_nmt_tf.hardware import describe_machine, record_hardware

__all__ = ["SuiteRun", "Suite", "load_suite", "find_suite", "planned_runs", "run_suite",
           "score", "RESERVED_KEYS"]

#: Keys of a run's entry in results.json that are not test sets.
RESERVED_KEYS = ("training", "decoding")


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
    grad_norm_ratio_runs: Tuple[str, ...] = field((), "Runs whose r_t curves share a figure.")
    probe_runs: Tuple[str, ...] = field((), "Runs of the embedding-to-layer similarity figure "
                                        "(Emelin et al. Fig. 6-7).")
    runs: Tuple[SuiteRun, ...] = field((), "The runs.")

    # Where it was read from (not a key).
    path: str = dataclasses.field(default="", compare=False, metadata={"internal": True})


def load_suite(path: str) -> Suite:
    """Reads and checks a suite file (errors name file, line and key)."""
    suite = load_section(Suite, path)
    suite.path = path
    names = [r.name for r in suite.runs]
    for i, run in enumerate(suite.runs):
        if not run.name or not all(c.isalnum() or c in "_-." for c in run.name):
            raise ConfigError(f"{path}: runs[{i}].name: {run.name!r} is not a usable name")
        if not run.config:
            raise ConfigError(f"{path}: runs[{i}].config: required")
        if names.count(run.name) > 1:
            raise ConfigError(f"{path}: runs[{i}].name: {run.name!r} is used twice")
    for key in ("grad_norm_ratio_runs", "probe_runs"):
        unknown = [n for n in getattr(suite, key) if n not in names]
        if unknown:
            raise ConfigError(f"{path}: {key}: no run named {unknown[0]!r}")
    return suite


def find_suite(name_or_path: str) -> str:
    """A suite file: the path itself, or ``configs/<name>/suite.yaml`` of the working
    directory or of the source checkout this package runs from."""
    if os.path.isfile(name_or_path):
        return name_or_path
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    seed alone)."""
    out = []
    for run in suite.runs:
        run_seeds = list(seeds or run.seeds or suite.seeds)
        for seed in run_seeds:
            name = run.name if len(run_seeds) == 1 else f"{run.name}-seed{seed}"
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


# --------------------------------------------------------------------------------------------
# Scores and state
# --------------------------------------------------------------------------------------------


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, object]:
    """``bleu`` (sacreBLEU 13a, cased), ``bleu_lc`` (lowercased), ``chrf``, their signatures
    and the brevity penalty, rounded for the results table
    (:func:`deep_nmt_tf.decoding.scoring.corpus_scores`, which ``deep-nmt-evaluate`` reports)."""
    from deep_nmt_tf.decoding.scoring import corpus_scores

    scores = corpus_scores(hypotheses, references)
    out: Dict[str, object] = {key: round(scores[key], 2) for key in ("bleu", "bleu_lc", "chrf")}
    out["brevity_penalty"] = round(scores["brevity_penalty"], 4)
    out.update({f"{key}_signature": scores[f"{key}_signature"]
                for key in ("bleu", "bleu_lc", "chrf")})
    return out


class _State:
    """A run's ``experiment.json``: what is done, written atomically after each stage."""

    def __init__(self, path: str):
        self.path = path
        self.data: Dict = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def _read_lines(path: str) -> List[str]:
    from deep_nmt_tf.data.text_io import read_lines

    return list(read_lines(path))


def _write_lines(path: str, lines: Sequence[str]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def _check_seed(run: PlannedRun, saved, run_dir: str, state: _State) -> None:
    """Refuses a run directory trained with another seed (a run named without ``-seedN``, asked
    for another seed with ``--seeds``): resuming it would label one seed's model as another's.
    ``saved`` is the run directory's saved config (None for a new run)."""
    seed = state.data.get("training", {}).get("seed")
    if seed is None:
        seed = None if saved is None else saved.training.seed
    if seed is not None and int(seed) != run.seed:
        raise ValueError(
            f"{run_dir} holds {run.name!r} trained with training.seed={seed}, but seed "
            f"{run.seed} was asked for: give another --output_dir, or several seeds "
            f"(--seeds={seed},{run.seed} names the runs {run.base}-seed{seed}, "
            f"{run.base}-seed{run.seed})")


#: Keys a run's recipe may change between invocations of the tool: how long it trains and how
#: it is logged, checkpointed, evaluated and compiled, and where its data lies; not what it
#: computes.  (The model section is compared by the trainer itself.)
_OPERATIONAL_KEYS = frozenset(f"training.{k}" for k in (
    "train_steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
    "eval_bleu", "grad_norm_ratio_every", "diagnostics_every", "jit_compile", "static_shapes",
    "max_consecutive_skipped", "loss_explosion_factor")) | frozenset(
    f"data.{split}_{side}" for split in ("train", "dev", "test")
    for side in ("source", "target")) | {"data.vocab"}


def _check_recipe(run: PlannedRun, config, saved, run_dir: str) -> None:
    """Refuses to resume (or re-score) a run directory trained with another recipe: a changed
    schedule, optimiser, batch, precision or data setting would leave results that no recipe
    file describes.  ``data.vocab`` (a path) is not compared; the vocabulary's identity is.
    ``saved`` is the run directory's saved config (None for a new run)."""
    from deep_nmt_tf.run_dir import config_differences

    if saved is None:
        return
    changed = [k for section in ("training", "data")
               for k in config_differences(saved, config, section) if k not in _OPERATIONAL_KEYS]
    if changed:
        raise ValueError(
            f"{run_dir} holds {run.name!r} trained with another recipe than {run.config}: "
            f"{', '.join(changed)} differ. Move that run directory aside (or give another "
            f"--output_dir) to train the new recipe, or restore these keys")


def _train(run: PlannedRun, config, run_dir: str, state: _State, log: Callable,
           max_train_minutes: Optional[float] = None) -> None:
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.training import Runner

    saved = RunDir(run_dir).saved_config()
    _check_seed(run, saved, run_dir, state)
    _check_recipe(run, config, saved, run_dir)
    runner = Runner(config, run_dir)
    trainer = runner.trainer
    done = int(trainer.step.numpy())
    target = config.training.train_steps
    training = state.data.setdefault("training", {"seconds": 0.0, "cpu_seconds": 0.0})
    # The update this tool first saw the run at: its clock covers only the updates after it (a
    # run trained, or begun, by deep-nmt-train has no training time here; the table says so).
    training.setdefault("timed_from_update", done)
    training.update(seed=run.seed, parameters=int(trainer.model.count_params()),
                    config=os.path.abspath(run.config), precision=config.training.precision)
    budget = max_train_minutes * 60.0 if max_train_minutes else None
    if done >= target or (budget is not None and training["seconds"] >= budget):
        training["updates"] = done
        if done < target:  # Stopped by the clock, now or in an earlier invocation.
            training["budget"] = {"minutes": max_train_minutes, "stopped_at": done}
        elif "budget" in training and training["budget"]["stopped_at"] != done:
            del training["budget"]  # Trained on to the target since.
        state.save()
        return
    training.pop("budget", None)
    record_hardware(training, describe_machine())  # only where it trains, not where re-scored
    log(f"{run.name}: training from update {done} to {target}"
        + (f", or until its clock reaches {max_train_minutes:g} minutes (now "
           f"{training['seconds'] / 60:.1f})" if budget is not None else ""))
    start = [time.perf_counter(), time.process_time()]

    def account(trainer_, step, logs):  # every step: cheap; persisted at each log step
        now = [time.perf_counter(), time.process_time()]
        training["seconds"] += now[0] - start[0]
        training["cpu_seconds"] += now[1] - start[1]
        start[:] = now
        training["updates"] = step
        if budget is not None and training["seconds"] >= budget and step < target:
            training["budget"] = {"minutes": max_train_minutes, "stopped_at": step}
            runner.request_stop(f"{max_train_minutes:g} minutes of training")
        if step % config.training.log_every == 0 or step == target:
            state.save()

    runner.run(hooks=[account])
    if runner.stopped:  # the budget: the runner wrote a checkpoint at the update reached
        log(f"{run.name}: {max_train_minutes:g} minutes of training reached at update "
            f"{training['updates']}: stopped there ({runner.checkpoint_here()})")
    state.save()


def _average(run: PlannedRun, run_dir: str, state: _State) -> str:
    from deep_nmt_tf.checkpoints import CheckpointStore

    out = os.path.join(run_dir, "averaged")
    store = CheckpointStore(run_dir)
    checkpoints = store.list()[-run.average_last:]
    if state.data.get("averaged") != checkpoints:
        # ``averaged/`` is this tool's own output, derived from the run's checkpoints: replaced
        # even when it names checkpoints elsewhere (a run directory copied or moved here).
        store.average(out, checkpoints=checkpoints, overwrite=True)
        state.data["averaged"] = checkpoints
        state.data.pop("decoding", None)  # a new average: decode again
        state.data.pop("tests", None)
        state.save()
    return out


def _translate(translator, sentences: Sequence[str], beam: int, alpha: float) -> List[str]:
    return [h[0].text for h in translator.translate(sentences, beam_size=beam,
                                                    length_penalty=alpha)]


def _decode(run: PlannedRun, suite: Suite, model_dir: str, dev: Tuple[str, str],
            tests: Dict[str, Tuple[str, str]], run_dir: str, state: _State,
            log: Callable) -> Dict[str, Dict]:
    from deep_nmt_tf.export.translator import Translator
    from deep_nmt_tf.run_dir import RunDir

    translator = None
    # The dev score that chooses the length penalty: cased BLEU, or lowercased BLEU for a
    # model trained on lowercased text (it cannot produce case).
    metric = "bleu_lc" if RunDir(model_dir).load_config().data.lowercase else "bleu"
    decoding = state.data.get("decoding")
    same_metric = decoding is not None and decoding.get("metric", "bleu") == metric
    if not same_metric or decoding.get("candidates") != list(suite.length_penalties):
        translator = Translator.from_model_dir(model_dir)
        sources, refs = _read_lines(dev[0]), _read_lines(dev[1])
        # Penalties scored before (a grid that grew) are kept, not decoded again.
        earlier = (decoding.get("tried", {}) if same_metric
                   and decoding.get("beam_size") == suite.beam_size else {})
        tried = {}
        for alpha in suite.length_penalties:
            if str(alpha) in earlier:
                tried[str(alpha)] = earlier[str(alpha)]
                continue
            tried[str(alpha)] = score(_translate(translator, sources, suite.beam_size, alpha),
                                      refs)[metric]
            log(f"{run.name}: dev {'lowercased ' if metric == 'bleu_lc' else ''}BLEU "
                f"{tried[str(alpha)]:.2f} at length penalty {alpha}")
        best = max(suite.length_penalties, key=lambda a: (tried[str(a)], -a))
        decoding = {"beam_size": suite.beam_size, "length_penalty": best,
                    "dev_bleu": tried[str(best)], "tried": tried, "metric": metric,
                    "candidates": list(suite.length_penalties)}
        state.data["decoding"] = decoding
        state.data.pop("tests", None)
        state.save()
    results = state.data.setdefault("tests", {})
    for name, (src, ref) in tests.items():
        if name in results:
            continue
        translator = translator or Translator.from_model_dir(model_dir)
        hyps = _translate(translator, _read_lines(src), decoding["beam_size"],
                          decoding["length_penalty"])
        _write_lines(os.path.join(run_dir, f"{name}.hyp"), hyps)
        results[name] = score(hyps, _read_lines(ref))
        log(f"{run.name}: {name}: BLEU {results[name]['bleu']:.2f} (lowercased "
            f"{results[name]['bleu_lc']:.2f}), chrF {results[name]['chrf']:.2f}")
        state.save()
    return results


def run_one(run: PlannedRun, suite: Suite, data_overrides: Sequence[str],
            dev: Tuple[str, str], tests: Dict[str, Tuple[str, str]], output_dir: str,
            max_steps: Optional[int] = None, overrides: Sequence[str] = (),
            log: Callable = logging.info, max_train_minutes: Optional[float] = None) -> Dict:
    """Trains, averages, decodes and scores one run (each stage skipped when done); returns
    its results.json entry."""
    run_dir = os.path.join(output_dir, "runs", run.name)
    os.makedirs(run_dir, exist_ok=True)
    state = _State(os.path.join(run_dir, "experiment.json"))
    extra = [f"training.seed={run.seed}"] + list(overrides)
    config = load_config(run.config, list(data_overrides) + list(run.overrides) + extra)
    if max_steps:
        steps = min(config.training.train_steps, max_steps)
        config = load_config(run.config, list(data_overrides) + list(run.overrides) + extra +
                             [f"training.train_steps={steps}"])
    _train(run, config, run_dir, state, log, max_train_minutes)
    averaged = _average(run, run_dir, state)
    results = dict(_decode(run, suite, averaged, dev, tests, run_dir, state, log))
    out = {name: {k: results[name][k] for k in ("bleu", "bleu_lc", "chrf")}
           for name in tests}
    out["training"] = dict(state.data["training"], averaged=len(state.data["averaged"]))
    out["decoding"] = {k: state.data["decoding"][k]
                       for k in ("beam_size", "length_penalty", "dev_bleu")}
    out["decoding"]["dev_metric"] = state.data["decoding"].get("metric", "bleu")
    return out


# --------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------


def _markdown(results: Dict[str, Dict], tests: Sequence[str]) -> str:
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


def _figures(suite: Suite, runs: List[PlannedRun], output_dir: str, test: Tuple[str, str],
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


def run_suite(suite: Suite, data_dir: str, output_dir: str, only: Sequence[str] = (),
              seeds: Sequence[int] = (), max_steps: Optional[int] = None,
              extra_tests: Sequence[Tuple[str, str, str]] = (),
              overrides: Sequence[str] = (), log: Callable = logging.info,
              max_train_minutes: Optional[float] = None) -> Dict[str, Dict]:
    """Runs the suite (module docstring); returns and writes ``results.json``.

    Args:
      suite: from :func:`load_suite`.
      data_dir: holds ``<split>.<suffix>`` files for the suite's train, dev and test splits.
      output_dir: where runs, results and figures go (reused: finished stages are skipped).
      only: run names to do (default all).
      seeds: seeds instead of the suite's.
      max_steps: cap on every run's ``training.train_steps`` (smoke tests).
      extra_tests: ``(name, source, reference)`` test sets scored besides the suite's.
      overrides: config overrides for every run.
      max_train_minutes: stop each run's training once its clock (``training.seconds`` in
        results.json, summed over resumes) reaches this many minutes; the run is then averaged,
        decoded and scored at the update it reached (``training.budget`` records it).  Run
        again with a larger budget or none, it trains on towards ``training.train_steps``.
    """
    if max_train_minutes is not None and not max_train_minutes > 0:
        raise ValueError(f"max_train_minutes={max_train_minutes}: must be > 0")
    def split(name):
        return tuple(os.path.abspath(os.path.join(data_dir, f"{name}.{suffix}"))
                     for suffix in (suite.source_suffix, suite.target_suffix))

    for override in overrides:
        if override.split("=", 1)[0].strip() == "training.seed":
            raise ValueError(f"--override={override}: the seed of a run is set with --seeds "
                             "(it names the run and its directory), not with an override")
    train, dev = split(suite.train), split(suite.dev)
    tests = {name: split(name) for name in suite.tests}
    for name, src, ref in extra_tests:
        if name in tests or name in RESERVED_KEYS:
            raise ValueError(f"--extra_test: the name {name!r} is taken")
        tests[name] = (os.path.abspath(src), os.path.abspath(ref))
    for path in (*train, *dev, *(p for pair in tests.values() for p in pair)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: not found (--data_dir={data_dir}, suite "
                                    f"{suite.path})")
    data_overrides = ["data.corpus=files", f"data.train_source={train[0]}",
                      f"data.train_target={train[1]}", f"data.dev_source={dev[0]}",
                      f"data.dev_target={dev[1]}", f"data.test_source={tests[suite.tests[0]][0]}"
                      if suite.tests else "data.test_source=",
                      f"data.test_target={tests[suite.tests[0]][1]}"
                      if suite.tests else "data.test_target="]
    runs = planned_runs(suite, only, seeds)
    os.makedirs(output_dir, exist_ok=True)
    results_path = os.path.join(output_dir, "results.json")
    results: Dict[str, Dict] = {}
    if os.path.exists(results_path):
        with open(results_path, encoding="utf-8") as f:
            results = json.load(f)
    for run in runs:
        results[run.name] = run_one(run, suite, data_overrides, dev, tests, output_dir,
                                    max_steps, overrides, log, max_train_minutes)
        _write_results(results, results_path, list(tests), output_dir)
    first_test = next(iter(tests.values()), dev)
    _figures(suite, runs, output_dir, first_test, log)
    return results


def _write_results(results: Dict[str, Dict], path: str, tests: List[str],
                   output_dir: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    names = [t for t in tests if any(t in r for r in results.values())]
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(results, names))
