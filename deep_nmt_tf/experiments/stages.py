"""The stages of an experiment suite over the runner: each run trained, checkpoint-averaged,
decoded with beam search and scored (``deep-nmt-experiment``), then the suite's report.

Every stage is resumable and skipped when done, so a killed suite continues where it stopped:
training resumes from the run's last checkpoint (the :class:`~deep_nmt_tf.training.Runner`
decides where); the average, the length-penalty choice (and each dev score on the way), the
translations (``<test>.hyp``) and the scores (with the reference file) are recorded in the run's
``experiment.json`` (:class:`~deep_nmt_tf.experiments.state.RunState`).
A run directory is only resumed for the run it was made for: one trained with another seed, or
with another recipe (a training or data key that changes what is computed: the keys declared
``affects_results=False`` in the config schema, :func:`deep_nmt_tf.config.operational_keys`,
may differ: the train length, logging, checkpointing, evaluation, compilation, data paths), is
refused with the differing keys (:mod:`.recipe`), and ``--override=training.seed=N`` is refused
for ``--seeds`` (which names the runs).  A new run may start from a copy of another run of the
same model and recipe but a shorter train length (``continue_from``, ``--continue_from``;
:func:`~.recipe.continue_run`).  ``--max_train_minutes`` is a training action that asks the
runner to stop (:meth:`~deep_nmt_tf.training.Runner.request_stop`) once the run's clock reaches
it.

``OUTPUT_DIR`` receives ``runs/<run>/`` (the run directories, with ``averaged/`` and the
translations), ``results.json`` (run -> test set -> ``{"bleu", "bleu_lc", "chrf"}``; each run
also has the reserved keys ``"training"``: updates, seconds, CPU seconds (of the updates this tool
ran: ``timed_from_update`` says where its clock started), parameters, seed, precision,
``hardware`` (CPU name with its family and model numbers, cores, TensorFlow version; machines
joined by ``"; then "`` when a run resumed on another), and ``budget`` (``minutes``,
``stopped_at``) for a run stopped by ``--max_train_minutes``; and
``"decoding"``: the beam, the chosen length penalty, its dev BLEU and ``dev_metric``, ``bleu``
or, for a model trained on lowercased text (``data.lowercase``), ``bleu_lc``,
``length_penalty_grid`` (every penalty tried -> its dev score) and ``extended`` (whether the
grid was extended); and beside the runs, ``"systems"`` and ``"comparisons"``: each system's
scores over its seeds and its paired bootstrap tests against the suite's ``compare_to``
systems, rebuilt from every run on disk each time (:mod:`deep_nmt_tf.experiments.statistics`)),
``results.md`` and ``figures/`` (:mod:`deep_nmt_tf.experiments.report`).

The length penalty is chosen on dev from the suite's ``length_penalties``; when the best is at
an end of that grid, and is the best alone (a tie there extends nothing), the grid extends that
way by its spacing at that end (never below 0) while the dev score improves (a tie chooses the
value inside the grid), at most ``length_penalty_extension`` values (a log line says when
the cap stopped it).  Each penalty's dev score is saved as soon as it is known, so a resumed
tool decodes none again; a choice recorded before this extension existed stands as made.

Scores (:mod:`deep_nmt_tf.decoding.scoring`, the one place that scores): ``bleu`` is sacreBLEU
(13a, cased) on detokenised output, ``bleu_lc`` the same lowercased, ``chrf`` sacreBLEU chrF2;
with the suite's ``tokenized_bleu_lc`` also ``bleu_tok_lc``, BLEU on lowercased Moses-tokenised
text (how papers score the official tokenised Multi30k; :mod:`.statistics`).

Training routes.  By default a run trains with the custom loop (TensorFlow,
:class:`~deep_nmt_tf.training.Runner`).  With ``route="fit"`` (``--route=fit``) it trains with
Keras ``compile``/``fit`` on the current backend (:func:`deep_nmt_tf.fit.run.train`), so a suite
can train on a machine with only JAX and a GPU: the run directory must then hold
``deep-nmt-preprocess``'s token ids (written here first where TensorFlow is installed), the
grad-norm ratio is turned off (``fit`` cannot compute it; the run has no r_t curve), and the
average is written as a model-only ``.weights.h5`` where TensorFlow is missing.  ``stop_after=
"average"`` (``--stop_after=average``) stops each run after its average: copy ``runs/<run>/``
without its checkpoints (``experiment.json``, ``config.yaml``, ``run.json``, ``vocab.txt``,
``averaged/``) to a machine with TensorFlow and run the same suite there to decode and score it.
A run directory whose ``experiment.json`` records the training done and an average, with
``averaged/`` present but none of the averaged checkpoints, is such a copy: neither trained nor
averaged again.

With a results archive (``archive_dir``, :mod:`.archive`) every scored run's entry,
translations, config and curves are also kept there (a directory that outlives the machine,
e.g. in the repository); the archived runs join the report, and a run found in the archive is
not trained again.

Each run directory is locked while its run works (:mod:`deep_nmt_tf.run_lock`): a second suite,
or a ``deep-nmt-train``, on the same run is refused naming the process that has it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from deep_nmt_tf import run_lock
from deep_nmt_tf.config import load_config
from deep_nmt_tf.decoding.scoring import table_scores
from deep_nmt_tf.experiments.archive import Archive, archived_dirs
from deep_nmt_tf.experiments.averaged import average, copied_after_average, listed
from deep_nmt_tf.experiments.recipe import check_recipe, check_seed, continue_run
from deep_nmt_tf.experiments.report import figures, write_results
from deep_nmt_tf.experiments.state import RunState, read_lines, write_lines
from deep_nmt_tf.experiments.statistics import (SCORE_KEYS, require_tokenizer, tokenized_bleu_lc,
                                                update_report)
from deep_nmt_tf.experiments.suite import RESERVED_KEYS, PlannedRun, Suite, planned_runs
from deep_nmt_tf.hardware import describe_machine, record_hardware

__all__ = ["RESERVED_KEYS", "ROUTES", "STOP_AFTER", "run_one", "run_suite"]

#: How a run trains: the custom loop (TensorFlow) or Keras ``fit`` on the current backend.
ROUTES = ("custom", "fit")
#: Where ``stop_after`` may stop each run (module docstring).
STOP_AFTER = ("preprocess", "train", "average")


def _check_route(route: str, stop_after: Optional[str]) -> None:
    if route not in ROUTES:
        raise ValueError(f"route={route!r}: expected one of {', '.join(ROUTES)}")
    if stop_after not in (None,) + STOP_AFTER:
        raise ValueError(f"stop_after={stop_after!r}: expected one of {', '.join(STOP_AFTER)}")


def _write_token_ids(config, run_dir: str) -> None:
    """``deep-nmt-preprocess``'s token ids of the train and dev splits, unless written."""
    from deep_nmt_tf.data.preprocess import preprocess_run
    from deep_nmt_tf.run_dir import RunDir

    if not os.path.exists(RunDir(run_dir).token_file("train")):
        preprocess_run(config, run_dir, ("train", "dev"))


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def _train(run: PlannedRun, config, run_dir: str, state: RunState, log: Callable,
           max_train_minutes: Optional[float] = None) -> None:
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.training import Runner

    saved = RunDir(run_dir).saved_config()
    check_seed(run, saved, run_dir, state)
    check_recipe(run, config, saved, run_dir)
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
    _record_spikes(training, run_dir)
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
    _record_spikes(training, run_dir)  # (After a crash: at the next invocation's start.)
    if runner.stopped:  # the budget: the runner wrote a checkpoint at the update reached
        log(f"{run.name}: {max_train_minutes:g} minutes of training reached at update "
            f"{training['updates']}: stopped there ({runner.checkpoint_here()})")
    state.save()


def _record_spikes(training: Dict, run_dir: str) -> None:
    """The training record's ``spikes``: the run directory's gradient-norm spikes
    (:func:`~deep_nmt_tf.training.spikes.read_spikes`), absent when it met none."""
    from deep_nmt_tf.training.spikes import read_spikes

    spikes = read_spikes(run_dir)
    if spikes:
        training["spikes"] = spikes
    else:
        training.pop("spikes", None)


def _train_fit(run: PlannedRun, config, run_dir: str, state: RunState, log: Callable,
               overrides: Sequence[str], max_train_minutes: Optional[float] = None) -> None:
    """Trains ``run`` with ``compile``/``fit`` on the current Keras backend (module
    docstring); the same bookkeeping as :func:`_train`."""
    import keras

    from deep_nmt_tf.checkpoints import KERAS_WEIGHTS, CheckpointStore
    from deep_nmt_tf.run_dir import RunDir, checkpoint_step
    from deep_nmt_tf.task.skipping import updates_read

    rd = RunDir(run_dir)
    saved = rd.saved_config()
    check_seed(run, saved, run_dir, state)
    check_recipe(run, config, saved, run_dir)
    if copied_after_average(run_dir, state, CheckpointStore(run_dir).list()):
        return
    if not os.path.exists(rd.token_file("train")):
        log(f"{run.name}: writing the token ids (deep-nmt-preprocess)")
        try:
            _write_token_ids(config, run_dir)
        except ImportError as e:
            raise FileNotFoundError(
                f"{rd.token_file('train')}: not found, and the token ids cannot be written here "
                f"({e}): run deep-nmt-preprocess (or this suite with --stop_after=preprocess) "
                f"where TensorFlow is installed and copy {run_dir} here") from None
    existing = CheckpointStore(run_dir).list(kinds=[KERAS_WEIGHTS])
    done = checkpoint_step(existing[-1]) if existing else 0
    target = config.training.train_steps
    training = state.data.setdefault("training", {"seconds": 0.0, "cpu_seconds": 0.0})
    training.setdefault("timed_from_update", done)
    training.update(seed=run.seed, config=os.path.abspath(run.config),
                    precision=config.training.precision, route="fit",
                    backend=keras.backend.backend())
    budget = max_train_minutes * 60.0 if max_train_minutes else None
    if done >= target or (budget is not None and training["seconds"] >= budget):
        training["updates"] = done
        state.save()
        return
    record_hardware(training, describe_machine())
    fit_overrides = [f"training.train_steps={target}", f"training.seed={run.seed}"]
    if config.training.grad_norm_ratio_every:
        log(f"{run.name}: training.grad_norm_ratio_every={config.training.grad_norm_ratio_every}"
            f" turned off: fit cannot compute the grad-norm ratio (this run has no r_t curve)")
        fit_overrides.append("training.grad_norm_ratio_every=0")
    for override in overrides:  # the training keys (fit refuses a changed model)
        key = override.split("=", 1)[0].strip()
        if key.startswith("training.") and key not in ("training.train_steps", "training.seed"):
            fit_overrides.append(override)
    log(f"{run.name}: training with fit ({keras.backend.backend()}) from update {done} to "
        f"{target}")
    start = [time.perf_counter(), time.process_time()]

    class Account(keras.callbacks.Callback):
        """Every ``fit`` epoch (``training.log_every`` updates): the clock and the updates;
        the budget of ``max_train_minutes`` stops the training."""

        def on_train_begin(self, logs=None):
            training["parameters"] = int(self.model.count_params())

        def on_epoch_end(self, epoch, logs=None):
            now = [time.perf_counter(), time.process_time()]
            training["seconds"] += now[0] - start[0]
            training["cpu_seconds"] += now[1] - start[1]
            start[:] = now
            updates = updates_read(self.model.optimizer)
            training["updates"] = min(updates, target)
            if budget is not None and training["seconds"] >= budget and updates < target:
                training["budget"] = {"minutes": max_train_minutes, "stopped_at": updates}
                self.model.stop_training = True
            state.save()

    from deep_nmt_tf.fit.run import train as fit_train

    fit_train(run_dir, overrides=fit_overrides, callbacks=[Account()])
    state.save()


def _translate(translator, sentences: Sequence[str], beam: int, alpha: float) -> List[str]:
    return [h[0].text for h in translator.translate(sentences, beam_size=beam,
                                                    length_penalty=alpha)]


def _dev_score(translator, sources: Sequence[str], references: Sequence[str], beam: int,
               alpha: float, metric: str) -> float:
    """The dev score of one length penalty: the decoding the length-penalty search repeats."""
    return table_scores(_translate(translator, sources, beam, alpha), references)[metric]


def _next_penalty(grid: Sequence[float], tried: Dict[str, float]) -> Optional[float]:
    """The length penalty beyond the best one tried when that is at an end of what was tried:
    one step of the grid's spacing at that end further out (never below 0); None when the best
    is inside, or the grid has one value (no spacing).  The end must be the best alone: a tie
    there (a dev score flat up to the end, as a model that writes one sentence for every input
    gives) is no sign that going further helps, and extends nothing."""
    if len(grid) < 2:
        return None
    values = sorted(float(a) for a in tried)  # the grid and the values beyond it
    top = max(tried.values())
    best = [a for a in values if tried[str(a)] == top]
    if len(best) > 1:
        return None
    if best[0] == values[-1]:
        return round(best[0] + (grid[-1] - grid[-2]), 6)
    if best[0] == values[0] and best[0] > 0:
        return max(0.0, round(best[0] - (grid[1] - grid[0]), 6))
    return None


def _choose_penalty(grid: Sequence[float], tried: Dict[str, float]) -> float:
    """The penalty with the best dev score; on a tie the one inside the grid (or nearest it),
    then the smaller, so that a value beyond the grid that only equals the best is not taken."""
    def outside(a: float) -> float:
        return max(0.0, grid[0] - a, a - grid[-1])
    return max((float(a) for a in tried), key=lambda a: (tried[str(a)], -outside(a), -a))


def _tune_length_penalty(run: PlannedRun, suite: Suite, model_dir: str, dev: Tuple[str, str],
                         metric: str, state: RunState, log: Callable) -> Dict:
    """Chooses the length penalty on dev (``dev_metric``) from the suite's grid; when the best
    is at an end of the grid, extends it that way one step at a time
    (:func:`_next_penalty`) while the dev score improves, at most
    ``suite.length_penalty_extension`` values (logged when the cap stops it).  Every penalty
    scored is saved at once (``decoding_search`` in experiment.json until the choice is made)
    and never decoded again for this average, beam and metric."""
    from deep_nmt_tf.inference import Translator

    decoding = state.data.get("decoding") or {}
    earlier: Dict[str, float] = {}
    for record in (decoding, state.data.get("decoding_search") or {}):
        if record.get("metric", "bleu") == metric and record.get("beam_size") == suite.beam_size:
            earlier.update(record.get("tried", {}))
    grid = sorted(set(suite.length_penalties))
    tried: Dict[str, float] = {}
    search = {"beam_size": suite.beam_size, "metric": metric, "tried": earlier}
    data = []  # the translator and the dev set, loaded for the first penalty decoded

    def score(alpha: float, beyond: bool = False) -> float:
        if str(alpha) not in earlier:
            if not data:
                data.extend([Translator.from_model_dir(model_dir), read_lines(dev[0]),
                             read_lines(dev[1])])
            earlier[str(alpha)] = _dev_score(data[0], data[1], data[2], suite.beam_size, alpha,
                                             metric)
            log(f"{run.name}: dev {'lowercased ' if metric == 'bleu_lc' else ''}BLEU "
                f"{earlier[str(alpha)]:.2f} at length penalty {alpha}"
                + (" (beyond the grid)" if beyond else ""))
            state.data["decoding_search"] = search
            state.save()
        tried[str(alpha)] = earlier[str(alpha)]
        return tried[str(alpha)]

    for alpha in grid:
        score(alpha)
    capped = False
    while True:
        best = max(tried.values())
        alpha = _next_penalty(grid, tried)
        if alpha is None:
            break
        if len(tried) - len(grid) >= suite.length_penalty_extension:
            capped = suite.length_penalty_extension > 0
            if capped:
                log(f"{run.name}: the best length penalty is still at the end of the "
                    f"{len(tried)} tried after {suite.length_penalty_extension} beyond the grid "
                    "(length_penalty_extension): stopped there")
            break
        if not score(alpha, beyond=True) > best:
            break
    choice = _choose_penalty(grid, tried)
    return {"beam_size": suite.beam_size, "length_penalty": choice,
            "dev_bleu": tried[str(choice)], "metric": metric,
            "tried": dict(sorted(tried.items(), key=lambda item: float(item[0]))),
            "candidates": list(suite.length_penalties),
            "extension": suite.length_penalty_extension,
            "extended": len(tried) > len(grid), "capped": capped}


def _decode(run: PlannedRun, suite: Suite, model_dir: str, dev: Tuple[str, str],
            tests: Dict[str, Tuple[str, str]], run_dir: str, state: RunState,
            log: Callable) -> Dict[str, Dict]:
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.run_dir import RunDir

    translator = None
    # The dev score that chooses the length penalty: cased BLEU, or lowercased BLEU for a
    # model trained on lowercased text (it cannot produce case).
    metric = "bleu_lc" if RunDir(model_dir).load_config().data.lowercase else "bleu"
    decoding = state.data.get("decoding")
    # A choice made before the grid could extend (no "extension" record) stands as made.
    done = (decoding is not None and decoding.get("metric", "bleu") == metric
            and decoding.get("candidates") == list(suite.length_penalties)
            and decoding.get("extension", suite.length_penalty_extension)
            == suite.length_penalty_extension)
    if not done:
        chosen = _tune_length_penalty(run, suite, model_dir, dev, metric, state, log)
        if decoding is None or (decoding.get("length_penalty"), decoding.get("beam_size")) != (
                chosen["length_penalty"], chosen["beam_size"]):
            state.data.pop("tests", None)  # the tests are decoded with the new choice
        decoding = state.data["decoding"] = chosen
        state.data.pop("decoding_search", None)
        state.save()
    results = state.data.setdefault("tests", {})
    for name, (src, ref) in tests.items():
        if name in results:
            continue
        translator = translator or Translator.from_model_dir(model_dir)
        hyps = _translate(translator, read_lines(src), decoding["beam_size"],
                          decoding["length_penalty"])
        write_lines(os.path.join(run_dir, f"{name}.hyp"), hyps)
        results[name] = dict(table_scores(hyps, read_lines(ref)), reference=ref)
        log(f"{run.name}: {name}: BLEU {results[name]['bleu']:.2f} (lowercased "
            f"{results[name]['bleu_lc']:.2f}), chrF {results[name]['chrf']:.2f}")
        state.save()
    for name in (n for n in tests if suite.tokenized_bleu_lc and "bleu_tok_lc" not in results[n]):
        results[name].update(tokenized_bleu_lc(os.path.join(run_dir, f"{name}.hyp"),
                                               tests[name][1], suite.target_suffix))
        state.save()  # also for a run scored before the suite asked for it
    return results


def run_one(run: PlannedRun, suite: Suite, data_overrides: Sequence[str],
            dev: Tuple[str, str], tests: Dict[str, Tuple[str, str]], output_dir: str,
            max_steps: Optional[int] = None, overrides: Sequence[str] = (),
            log: Callable = logging.info, max_train_minutes: Optional[float] = None,
            route: str = "custom", stop_after: Optional[str] = None,
            continue_from: Optional[PlannedRun] = None) -> Optional[Dict]:
    """Trains, averages, decodes and scores one run (each stage skipped when done); returns
    its results.json entry (None when ``stop_after`` stopped it before decoding).
    ``continue_from``: the run of the same seed whose directory a new run starts from a copy
    of (:func:`~.recipe.continue_run`)."""
    _check_route(route, stop_after)
    run_dir = os.path.join(output_dir, "runs", run.name)
    os.makedirs(run_dir, exist_ok=True)
    state = RunState.of(run_dir)
    extra = [f"training.seed={run.seed}"] + list(overrides)
    config = load_config(run.config, list(data_overrides) + list(run.overrides) + extra)
    if max_steps:
        steps = min(config.training.train_steps, max_steps)
        config = load_config(run.config, list(data_overrides) + list(run.overrides) + extra +
                             [f"training.train_steps={steps}"])
    if continue_from is not None:
        step = continue_run(continue_from, run, config, output_dir, state)
        if step is not None:
            log(f"{run.name}: continues a copy of {continue_from.name} from its update {step}")
    if stop_after == "preprocess":
        _write_token_ids(config, run_dir)
        return None
    if route == "fit":
        _train_fit(run, config, run_dir, state, log, overrides, max_train_minutes)
    elif not copied_after_average(run_dir, state, listed(run_dir)):
        _train(run, config, run_dir, state, log, max_train_minutes)
    if stop_after == "train":
        return None
    averaged = average(run, run_dir, state)
    if stop_after == "average":
        return None
    results = dict(_decode(run, suite, averaged, dev, tests, run_dir, state, log))
    out = {name: {k: results[name][k] for k in SCORE_KEYS if k in results[name]}
           for name in tests}
    out["training"] = dict(state.data["training"], averaged=len(state.data["averaged"]))
    decoding = state.data["decoding"]
    out["decoding"] = {k: decoding[k] for k in ("beam_size", "length_penalty", "dev_bleu")}
    out["decoding"].update(dev_metric=decoding.get("metric", "bleu"),
                           length_penalty_grid=decoding["tried"],
                           extended=decoding.get("extended", False))
    return out


# --------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------


def _check_archived_recipe(run: PlannedRun, archive: Archive, overrides: Sequence[str]) -> None:
    """Refuses an archived run whose recipe is not the suite's now (as
    :func:`~.recipe.check_recipe` refuses a run directory's); a record archived without its
    config is not checked."""
    from deep_nmt_tf.run_dir import RunDir

    saved = RunDir(archive.run_dir(run.name)).saved_config()
    if saved is not None:
        check_recipe(run, load_config(run.config, overrides), saved, archive.run_dir(run.name),
                     "Delete that archived run (or give another --archive_dir) to train the "
                     "new recipe")


def run_suite(suite: Suite, data_dir: str, output_dir: str, only: Sequence[str] = (),
              seeds: Sequence[int] = (), max_steps: Optional[int] = None,
              extra_tests: Sequence[Tuple[str, str, str]] = (),
              overrides: Sequence[str] = (), log: Callable = logging.info,
              max_train_minutes: Optional[float] = None, route: str = "custom",
              stop_after: Optional[str] = None, archive_dir: Optional[str] = None,
              continue_from: Optional[str] = None) -> Dict[str, Dict]:
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
      route: ``"custom"`` (the custom loop, TensorFlow) or ``"fit"`` (Keras ``fit`` on the
        current backend; module docstring).
      stop_after: ``"preprocess"``, ``"train"`` or ``"average"``: each run stops there (nothing
        decoded, scored or reported; module docstring); None: every stage.
      archive_dir: a results archive (:mod:`.archive`): every scored run is archived there,
        the archived runs join the report, and an archived run is not trained again.
      continue_from: a run of the suite: each new run directory of another run starts from a
        copy of that run's directory of the same seed in ``output_dir`` and trains on from its
        last checkpoint (:func:`~.recipe.continue_run`; the custom loop only); that run's own
        seeds train as usual, so ``only=[RUN, LONGER]`` trains RUN, then continues it.
    """
    _check_route(route, stop_after)
    if continue_from and route != "custom":
        raise ValueError(f"--continue_from={continue_from}: continues the custom loop's "
                         f"checkpoints only, not --route={route}")
    if max_train_minutes is not None and not max_train_minutes > 0:
        raise ValueError(f"max_train_minutes={max_train_minutes}: must be > 0")
    require_tokenizer(suite)

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
    if continue_from and continue_from not in {r.name for r in suite.runs}:
        raise ValueError(f"--continue_from={continue_from}: no run named so in {suite.path} "
                         f"(runs: {', '.join(r.name for r in suite.runs)})")
    os.makedirs(output_dir, exist_ok=True)
    results_path = os.path.join(output_dir, "results.json")
    results: Dict[str, Dict] = {}
    if os.path.exists(results_path):
        with open(results_path, encoding="utf-8") as f:
            results = json.load(f)
    archive = None
    if archive_dir:
        archive = Archive(archive_dir, suite.name,
                          {name: ref for name, (_, ref) in tests.items()}, log)
        archive.sync(results, output_dir)
    for run in runs:  # Each run directory has one writer (deep_nmt_tf.run_lock).
        if archive is not None and run.name in archive and (
                run.name not in results or "archive" in results[run.name]):
            _check_archived_recipe(run, archive, data_overrides + list(run.overrides) + [
                f"training.seed={run.seed}"] + list(overrides))
            log(f"{run.name}: taken from the archive {archive.run_dir(run.name)}, not trained "
                "again (delete that directory to train it again)")
            continue
        with run_lock.hold(os.path.join(output_dir, "runs", run.name), "deep-nmt-experiment"):
            source = planned_runs(suite, [continue_from], [run.seed])[0] \
                if continue_from and run.base != continue_from else None  # RUN's own: trained
            entry = run_one(run, suite, data_overrides, dev, tests, output_dir, max_steps,
                            overrides, log, max_train_minutes, route=route, stop_after=stop_after,
                            continue_from=source)
        if entry is None:  # stop_after: nothing decoded or scored
            continue
        results[run.name] = entry
        if archive is not None:
            archive.store(run.name, entry, os.path.join(output_dir, "runs", run.name))
        # Every system's seed statistics and comparisons, from every run on disk (not only
        # those of this invocation): a pair tested before is reused.
        update_report(suite, results, {name: ref for name, (_, ref) in tests.items()},
                      output_dir, log)
        write_results(results, results_path, list(tests), output_dir)
    if archive is not None and results:  # the archived runs in the report, even when none ran
        update_report(suite, results, {name: ref for name, (_, ref) in tests.items()},
                      output_dir, log)
        write_results(results, results_path, list(tests), output_dir)
    if stop_after is not None:
        log(f"Stopped every run after its {stop_after} (stop_after); run the suite again "
            f"without it to go on")
        return results
    first_test = next(iter(tests.values()), dev)
    figures(suite, runs, output_dir, first_test, log, archived_dirs(results))
    return results
