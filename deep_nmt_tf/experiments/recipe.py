"""Which run directory may hold which run of a suite: the seed and recipe checks, and
continuing one run's training as another run (``--continue_from``).

A run directory is only resumed for the run it was made for (:func:`check_seed`,
:func:`check_recipe`): one trained with another seed, or with another recipe, is refused with
the differing keys.  The keys declared ``affects_results=False`` in the config schema
(:func:`deep_nmt_tf.config.operational_keys`: the train length, logging, checkpointing,
evaluation, compilation, data paths) may differ.

Continuing a run (:func:`continue_run`).  The schedules do not depend on the train length, so
the first N updates of a longer run of a recipe are a shorter run's N updates.  A suite run
that differs from another only in operational keys (``deep_pre_12k`` is ``deep_pre`` trained
12,000 updates instead of 6,000) can therefore start from a copy of that run's directory, seed
for seed, instead of training its first updates again::

    deep-nmt-experiment --suite=multi30k ... --only=deep_pre_12k --seeds=3 --continue_from=deep_pre

copies ``runs/deep_pre-seed3`` (its checkpoints with the data iterator's position, config,
vocabulary, metadata and training curves; not its average, translations, exports, scores or
``kept/`` checkpoints) to
``runs/deep_pre_12k-seed3``, whose ``experiment.json`` starts with the source's training record
(its clock and CPU time: the record counts the first updates too) and ``continued_from``
(``{"run", "update"}``, kept in ``results.json``'s ``training``; when the source was itself
continued from another run, its own record is kept as ``source_continued_from``).  The
source must hold the same model and seed, a recipe that differs only in operational keys, and
fewer updates than the new run trains; it is locked while it is copied (a run still training
is refused).  A copy interrupted part-way is redone; a run directory that already trained on
its own, or was continued from another run, is refused.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from deep_nmt_tf.config import Config, ConfigError, operational_keys
from deep_nmt_tf.experiments.state import AVERAGED_DIRNAME, STATE_FILENAME, RunState
from deep_nmt_tf.experiments.suite import PlannedRun
from deep_nmt_tf.run_dir import AVERAGED_FILENAME, EXPORTS_DIRNAME, KEPT_DIRNAME
from deep_nmt_tf.run_lock import LOCK_NAME

__all__ = ["check_seed", "check_recipe", "continue_run", "NOT_COPIED"]

#: Keys a run's recipe may change between invocations of the tool: declared
#: ``affects_results=False`` in the schema (how long it trains, how it is logged, checkpointed,
#: evaluated and compiled, where its data lies; not what it computes).  (The model section is
#: compared by the runner itself.)
OPERATIONAL_KEYS = frozenset(operational_keys(Config))

#: What a continued run does not take from its source: what the source made of its training
#: (its average, translations, exports and the tool's record, rewritten), the checkpoints it
#: kept before gradient-norm spikes (run directories of the source's own) and its lock.
NOT_COPIED = frozenset({AVERAGED_DIRNAME, AVERAGED_FILENAME, EXPORTS_DIRNAME, KEPT_DIRNAME,
                        STATE_FILENAME, LOCK_NAME, LOCK_NAME + ".takeover"})


def check_seed(run: PlannedRun, saved, run_dir: str, state: RunState) -> None:
    """Refuses a run directory trained with another seed (a directory adopted from
    deep-nmt-train, or a suite file whose seed changed): resuming it would label one seed's
    model as another's.
    ``saved`` is the run directory's saved config (None for a new run)."""
    seed = state.data.get("training", {}).get("seed")
    if seed is None:
        seed = None if saved is None else saved.training.seed
    if seed is not None and int(seed) != run.seed:
        raise ValueError(
            f"{run_dir} holds {run.name!r} trained with training.seed={seed}, but seed "
            f"{run.seed} was asked for: give another --output_dir, or rename the directory "
            f"{run.base}-seed{seed} (--seeds={seed} names seed {seed}'s run so)")


def check_recipe(run: PlannedRun, config, saved, run_dir: str, remedy: str = "Move that run "
                 "directory aside (or give another --output_dir) to train the new recipe"):
    """Refuses to resume (or re-score) a run directory trained with another recipe: a changed
    schedule, optimiser, batch, precision or data setting would leave results that no recipe
    file describes.  ``data.vocab`` (a path) is not compared; the vocabulary's identity is.
    ``saved`` is the run directory's saved config (None for a new run)."""
    from deep_nmt_tf.run_dir import config_differences

    if saved is None:
        return
    changed = [k for section in ("training", "data")
               for k in config_differences(saved, config, section) if k not in OPERATIONAL_KEYS]
    if changed:
        raise ValueError(
            f"{run_dir} holds {run.name!r} trained with another recipe than {run.config}: "
            f"{', '.join(changed)} differ. {remedy}, or restore these keys")


def _copy(source_dir: str, run_dir: str) -> None:
    for name in sorted(os.listdir(source_dir)):
        if name in NOT_COPIED or name.endswith((".hyp", ".tmp")):
            continue
        src, dst = os.path.join(source_dir, name), os.path.join(run_dir, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)


def _check_source(source: PlannedRun, run: PlannedRun, config, source_dir: str,
                  source_state: RunState, flag: str) -> int:
    """Refuses a source of another seed, model, vocabulary or recipe, or as long as the run;
    returns the update of its last checkpoint."""
    from deep_nmt_tf.run_dir import RunDir, checkpoint_step

    source_run = RunDir(source_dir)
    checkpoints = source_run.list_checkpoints()
    saved = source_run.saved_config()
    if not checkpoints or saved is None:
        raise FileNotFoundError(
            f"{flag}: {source_dir} holds no checkpoints of {source.name!r} to continue from "
            "(train it first, in this --output_dir; an archived run keeps none)")
    check_seed(run, saved, source_dir, source_state)
    try:  # the runner's own check on resuming: model section, tokenizer, vocabulary
        source_run.check_config(config)
    except ConfigError as e:
        raise ValueError(f"{flag}: {source_dir} holds another model or vocabulary than "
                         f"{run.config}: {e}") from e
    check_recipe(run, config, saved, source_dir,
                 f"{flag} continues a run of the same recipe only")
    step = checkpoint_step(checkpoints[-1])
    if step >= config.training.train_steps:
        raise ValueError(f"{flag}: {source.name!r} has trained {step} updates, and "
                         f"{run.name!r} trains {config.training.train_steps}: nothing to "
                         "continue")
    return step


def continue_run(source: PlannedRun, run: PlannedRun, config, output_dir: str,
                 state: RunState) -> Optional[int]:
    """Makes ``runs/<run.name>`` a copy of ``runs/<source.name>`` to train on from (module
    docstring); returns the update it continues from, or None when that was done before.
    ``config`` is the run's config as this invocation trains it; ``state`` its
    ``experiment.json`` (saved here).  The caller holds the run directory's lock."""
    from deep_nmt_tf import run_lock
    from deep_nmt_tf.run_dir import RunDir

    run_dir = os.path.join(output_dir, "runs", run.name)
    source_dir = os.path.join(output_dir, "runs", source.name)
    flag = f"--continue_from={source.base}"
    done = state.data.get("training", {}).get("continued_from")
    if done is not None and done.get("run") != source.name:
        raise ValueError(f"{run_dir} was continued from {done.get('run')!r}, not {source.name!r}"
                         f" ({flag}): give another --output_dir, or drop {flag}")
    if done is not None and not done.get("incomplete"):
        return None
    if done is None and ("training" in state.data or RunDir(run_dir).run_files()):
        raise ValueError(f"{run_dir} already holds {run.name!r} trained on its own: {flag} "
                         "starts a new run directory only (drop the flag to resume it, or move "
                         "the directory aside)")
    if source.name == run.name:
        raise ValueError(f"{flag}: {run.name!r} cannot continue itself")
    if not os.path.isdir(source_dir):
        raise FileNotFoundError(f"{flag}: no run directory {source_dir} to continue from "
                                f"(train {source.name!r} first, in this --output_dir)")
    # The source's lock for the checks and the copy: a run still training is refused, and the
    # checkpoint checked is the one copied.
    with run_lock.hold(source_dir, f"deep-nmt-experiment {flag}"):
        source_state = RunState.of(source_dir)
        step = _check_source(source, run, config, source_dir, source_state, flag)
        mark = {"run": source.name, "update": step}
        state.data = {"training": {"continued_from": dict(mark, incomplete=True)}}
        state.save()  # a copy interrupted from here on is redone
        _copy(source_dir, run_dir)
    training = dict(source_state.data.get("training", {}))
    training.pop("budget", None)  # the source's own stop; this run has its own budget
    if "continued_from" in training:  # a chain (6,000 -> 12,000 -> 24,000): keep the lineage
        mark["source_continued_from"] = training["continued_from"]
    training["continued_from"] = mark
    state.data = {"training": training}
    state.save()
    return step
