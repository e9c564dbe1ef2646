"""The runner: a training run, built from (config, run directory, strategy); it owns the
trainer (Orbit's ``Controller`` shape).

The trainer (:class:`~deep_nmt_tf.training.Trainer`, or any object with the declared
:class:`~deep_nmt_tf.training.interface.TrainerInterface`) owns one update; the runner builds
it and owns everything around it, in this order:

1. the resume point, decided once before any file is written, by the run directory's checkpoint
   store (:meth:`deep_nmt_tf.checkpoints.CheckpointStore.resume_point`): the newest ``ckpt-N``
   that can be read (damaged or missing newer ones are skipped with a WARNING and kept, renamed
   ``*.unreadable``; none readable is an error unless ``start_over``);
2. the config against the run directory (:class:`~deep_nmt_tf.run_dir.RunDir`; a changed model
   or vocabulary is refused before any work), then the trainer, built by its factory (a trainer
   class is one: it prepares the data and the vocabulary, by default with
   :func:`deep_nmt_tf.data.prepare_data`, and builds the model and optimizer), then
   ``config.yaml`` and ``run.json`` of the resolved config;
3. the checkpoint saver (the store's :class:`~deep_nmt_tf.checkpointing.CheckpointSaver`) and
   the restore of the resume point, or else warm start (``training.warm_start``); the evaluator
   (:class:`~deep_nmt_tf.training.evaluation.Evaluator`, when the trainer has the
   :class:`~deep_nmt_tf.training.interface.DevEvaluation` members);
4. :meth:`Runner.run`: the loop, and after every step the periodic actions of
   :meth:`Runner.actions`, a declared list of :class:`~deep_nmt_tf.training.actions.
   PeriodicAction` run in this order:

   * ``log``, every ``training.log_every`` steps: console line (with the ETA) and ``train/``
     scalars; on a terminal also a progress bar redrawn after every step
     (:class:`deep_nmt_tf.progress.Progress`: step, loss, tokens/s, ETA);
   * ``diagnostics``, every ``training.diagnostics_every`` (default ``log_every``) steps:
     weight heatmaps and lexical-shortcut gates;
   * ``checkpoint``, every ``training.checkpoint_every`` steps: ``ckpt-N``;
   * ``eval``, every ``training.eval_every`` steps (0: never): dev loss and BLEU, ``eval/``
     scalars;
   * the caller's hooks, every step: ``hook(trainer, step, logs)`` callables, or
     :class:`~deep_nmt_tf.training.actions.PeriodicAction` s of their own.

   The first four also run after the last step.  Time spent in diagnostics, checkpoints and
   evaluation is left out of ``tokens_per_second``.  An action (or hook) may ask the run to
   stop, :meth:`Runner.request_stop` (the experiment suite's time budget): the loop ends after
   that step and a checkpoint is written there.

   Around every step, :mod:`~deep_nmt_tf.health`: SIGTERM and Ctrl-C save a
   checkpoint at the current step and raise :class:`~deep_nmt_tf.health.
   TrainingInterrupted`; ``training.max_consecutive_skipped`` non-finite updates in a row raise
   :class:`~deep_nmt_tf.health.TrainingDiverged` (a due checkpoint waits for the next
   applied update); an exploding loss is warned about, and so is a gradient-norm spike, after
   which the run rolls back to the newest checkpoint before it (``training.spike_rollbacks``)
   or keeps that checkpoint (:mod:`~deep_nmt_tf.training.spikes`); a lost worker of a
   multi-worker run raises :class:`~deep_nmt_tf.health.WorkerLost`.  A checkpoint
   (periodic, on a signal, at a stop request or at the end) or ``config.yaml``/``run.json``
   that cannot be written because the disk is full raises
   :class:`~deep_nmt_tf.checkpoints.DiskFullError` (its partial files removed; the message
   names the free space and the last intact checkpoint, which a rerun resumes from).

Checkpoints (:mod:`deep_nmt_tf.checkpointing`; ``keep_checkpoints`` kept) hold the trainer's
:meth:`~deep_nmt_tf.training.interface.TrainerInterface.checkpoint_items` (the model, with the
dropout ``SeedGenerator`` states so that dropout masks continue exactly, the optimizer, the
counters ``step``, ``skipped_updates`` and ``data_position``, the gradient transforms' state)
and (``checkpoint_iterator``, the default, where the iterator can be saved: the default
strategy) the ``tf.data`` iterator.  On resume the iterator is restored, or else the training
dataset is rebuilt and its first ``data_position`` micro-batches are read and dropped
(:meth:`Runner.make_train_iterator`), so the dataset must be deterministic for a given
``training.seed`` (as the data pipeline is).  A run killed at any point continues from its
latest checkpoint as if it had not been stopped.  A gradient transform whose state the resumed
checkpoint lacks (adaptive clipping turned on at the resume, after a loss spike: the config
change is logged) starts with fresh state, and a log line says so; every other object must
find its value.

Logs: a console line every ``training.log_every`` steps; TensorBoard scalars under
``MODEL_DIR/train`` (loss, nll, perplexity, learning_rate, grad_norm, tokens_per_second,
skipped_updates, the gradient transforms' statistics, the model's mixing weights
(:func:`~deep_nmt_tf.training.evaluation.model_diagnostics`), and every
``training.grad_norm_ratio_every`` steps Bapna et al.'s ``grad_norm_ratio``, ``grad_norm_h1``
and ``grad_norm_hN``, also in the console log; heatmaps ``weights/...`` and gates ``gates/...``
(:class:`~deep_nmt_tf.training.evaluation.DiagnosticsWriter`)) and ``MODEL_DIR/eval`` (loss,
nll, perplexity, bleu, mean lexical-shortcut gates on the first dev batch).

Example:
    >>> from deep_nmt_tf.config import load_config
    >>> runner = Runner(load_config("configs/demo.yaml"), "runs/demo")
    >>> runner.run()                       # {"loss": ..., "eval_bleu": ...}
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat, health
from deep_nmt_tf.checkpointing import has_object, object_names
from deep_nmt_tf.checkpoints import TF_CHECKPOINT, CheckpointStore
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.progress import LogWindow, Progress
from deep_nmt_tf.run_dir import EVAL_LOGS, TRAIN_LOGS, RunDir
from deep_nmt_tf.task import per_token_metrics
from deep_nmt_tf.training import diagnostics as diagnostics_lib
from deep_nmt_tf.training import evaluation, metrics, spikes
from deep_nmt_tf.training import warm_start as warm_start_lib
from deep_nmt_tf.training.actions import PeriodicAction, TrainHook, hook_action
from deep_nmt_tf.training.gradient_transforms import new_transform_items
from deep_nmt_tf.training.interface import DevEvaluation, TrainerInterface
from deep_nmt_tf.training.strategy import is_chief

__all__ = ["PeriodicAction", "Runner", "TrainHook", "TrainerFactory"]

#: ``factory(config, run_dir, strategy, **options) -> trainer``: a trainer class, or a function
#: that returns an object with the :class:`~deep_nmt_tf.training.interface.TrainerInterface`.
TrainerFactory = Callable[..., TrainerInterface]


def _check_interface(trainer) -> None:
    """A ``TypeError`` naming the members of the declared interface a trainer lacks."""
    if isinstance(trainer, TrainerInterface):
        return
    members = [n for n in TrainerInterface.__annotations__] + [
        "train_step", "checkpoint_items", "distributed_iterator"]
    missing = [n for n in members if not hasattr(trainer, n)]
    raise TypeError(f"{type(trainer).__name__} is not a trainer: it lacks "
                    f"{', '.join(missing)} (deep_nmt_tf.training.interface.TrainerInterface)")


def _window_summary(window: LogWindow) -> Dict[str, float]:
    """Per-token losses over a log window (the task's metrics), mean norm of the applied
    updates, throughput, the current learning rate and the gradient transforms' latest
    statistics."""
    sums = window.sums
    out = {k: v for k, v in window.last.items()
           if k not in window.sum_keys and k not in ("loss", "nll", "skipped")}
    out.update(per_token_metrics(sums["loss_sum"], sums["nll_sum"], sums["num_tokens"]))
    out.update({
        "grad_norm": window.mean_grad_norm(),
        "tokens_per_second": window.tokens_per_second(),
        "target_tokens_per_second": window.rate("num_tokens"),
    })
    return out


@tf.function
def _advance(iterator, count):
    """Reads and drops ``count`` elements of ``iterator`` (in graph: no Python per element)."""
    for _ in tf.range(count):
        next(iterator)


class Runner:
    """A training run: builds the trainer, restores or warm-starts it, and runs the loop with
    its checkpoints, evaluation and logs (module docstring).

    Args:
      config: the validated :class:`~deep_nmt_tf.config.Config`.
      model_dir: the run directory (a path or :class:`~deep_nmt_tf.run_dir.RunDir`).
      strategy: a ``tf.distribute.Strategy`` (default: the default strategy); see
        :func:`deep_nmt_tf.training.strategy.make_strategy`.
      trainer: the trainer factory, ``trainer(config, run_dir, strategy, **trainer_options)``
        (default :class:`~deep_nmt_tf.training.Trainer`; a subclass swaps a component).
      checkpoint_iterator: save the ``tf.data`` iterator in the checkpoints when possible (the
        default: a resume costs the same at any position, BENCHMARKS.md "Scale"; each
        checkpoint holds the shuffle buffer, demo config +34 MB, +3 s); False re-reads the
        consumed batches on resume (:meth:`make_train_iterator`).
      start_over: train from step 0 in a run directory whose checkpoint files all fail to read
        (they are kept, renamed ``*.unreadable``; ``deep-nmt-train --start_over``); otherwise
        that is an error.
      **trainer_options: passed to the factory (``gradient_transforms=[...]`` of the
        :class:`~deep_nmt_tf.training.Trainer`).

    Raises:
      ConfigError: ``model_dir`` was trained with a different model config or vocabulary;
        ``training.shape_classes`` (fit only); ``training.spike_rollbacks`` under
        ``MultiWorkerMirroredStrategy``.
      CheckpointError: checkpoint files, none readable (and not ``start_over``), or
        ``start_over`` with a readable checkpoint; :class:`~deep_nmt_tf.checkpoints.
        DiskFullError` when ``config.yaml`` or ``run.json`` cannot be written for space.
      TypeError: the factory's trainer lacks a member of the declared interface.
    """

    def __init__(self, config: Config, model_dir, strategy: Optional[tf.distribute.Strategy] = None,
                 trainer: Optional[TrainerFactory] = None, checkpoint_iterator: bool = True,
                 start_over: bool = False, **trainer_options):
        if trainer is None:
            from deep_nmt_tf.training.trainer import Trainer as trainer
        if config.training.shape_classes:
            raise ConfigError(
                f"{config.source}: training.shape_classes={config.training.shape_classes}: "
                f"only the Keras fit route (deep-nmt-fit, deep-nmt-experiment --route=fit) "
                f"groups its batch shapes; set it to 0 for the custom loop")
        self.run_dir = RunDir(model_dir)
        self.model_dir = self.run_dir.path
        self.strategy = strategy or tf.distribute.get_strategy()
        self._multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if config.training.spike_rollbacks and self._multi_worker:
            raise ConfigError(f"{config.source}: training.spike_rollbacks="
                              f"{config.training.spike_rollbacks}: not supported under "
                              "MultiWorkerMirroredStrategy (every worker would have to restore "
                              "the chief's checkpoint); set it to 0 there")
        self.is_chief = is_chief(self.strategy)
        self.checkpoint_iterator = checkpoint_iterator
        #: The run directory's checkpoints (both kinds; the loop writes ``ckpt-N``).
        self.checkpoints = CheckpointStore(self.run_dir)
        # Which checkpoint to resume from, decided once, before any file is written.
        self.resume = self.checkpoints.resume_point(TF_CHECKPOINT, start_over)
        self.run_dir.check_config(config)  # Before any work; again once resolved.
        self.trainer = trainer(config, self.run_dir, self.strategy, **trainer_options)
        _check_interface(self.trainer)
        self.config = self.trainer.config
        with self.checkpoints.writing("config.yaml and run.json", kind=TF_CHECKPOINT):
            self.run_dir.save_config(self.config, write=self.is_chief)
        trainer = self.trainer
        #: What a checkpoint holds besides the data iterator (the trainer's items).
        self.checkpoint_items = trainer.checkpoint_items()
        self.checkpoint = tf.train.Checkpoint(**self.checkpoint_items)
        t = self.config.training
        self.saver = self.checkpoints.saver(self.checkpoint, t.keep_checkpoints, trainer.step,
                                            chief=self.is_chief)
        resume_path = self.checkpoints.set_aside_skipped(self.resume, self.is_chief)
        fresh = new_transform_items(self.checkpoint_items,
                                    object_names(resume_path)) if resume_path else []
        if fresh:
            # Gradient-transform state new at this resume: restored without it, saved with it.
            self.saver.set_checkpoint(tf.train.Checkpoint(**{
                k: v for k, v in self.checkpoint_items.items() if k not in fresh}))
        restored = self.saver.restore(resume_path)
        if fresh:
            self.saver.set_checkpoint(self.checkpoint)
            logging.info("%s has no state for %s (a gradient transform new since it was "
                         "written): it starts fresh", resume_path, ", ".join(fresh))
        if restored:
            logging.info("Restored %s (step %d, %d updates applied, %d micro-batches consumed)",
                         restored, int(trainer.step.numpy()),
                         int(trainer.optimizer.iterations.numpy()),
                         int(trainer.data_position.numpy()))
        elif t.warm_start.checkpoint:
            with self.strategy.scope():
                warm_start_lib.warm_start(trainer.model, self.config)
        self.health = health.HealthMonitor(t.max_consecutive_skipped, t.loss_explosion_factor,
                                           t.grad_spike_factor)
        self.health.checkpoint_saved(int(trainer.step.numpy()), restored)
        #: At a gradient-norm spike: roll back, or keep the checkpoint before it.
        self.spike_response = spikes.SpikeResponse(self, t.spike_rollbacks,
                                                   t.max_kept_spikes)
        self._checkpoint_pending = False
        dev = isinstance(trainer, DevEvaluation)
        self.evaluator = evaluation.Evaluator(trainer) if dev else None
        self.write_diagnostics = evaluation.DiagnosticsWriter(trainer, self.is_chief)
        self._writers: Dict[str, tf.summary.SummaryWriter] = {}
        self._window: Optional[LogWindow] = None
        self._summary: Dict[str, float] = {}
        self._stop: Optional[str] = None

    # -- files -------------------------------------------------------------------------------
    def writer(self, name: str):
        """The TensorBoard writer of ``MODEL_DIR/<name>`` (a no-op writer off the chief)."""
        if name not in self._writers:
            if self.is_chief:
                self._writers[name] = tf.summary.create_file_writer(self.run_dir.log_dir(name))
            else:
                self._writers[name] = tf.summary.create_noop_writer()
        return self._writers[name]

    def save_checkpoint(self) -> Optional[str]:
        """Writes a checkpoint numbered by the current step (every worker must call it)."""
        try:
            path = self.saver.save()
        except tf.errors.FailedPreconditionError as e:
            if self.saver.checkpoint is self.checkpoint:
                raise
            logging.warning("The training data iterator cannot be checkpointed (%s); a resumed "
                            "run will re-read the consumed batches instead",
                            str(e).splitlines()[0])
            self.saver.set_checkpoint(self.checkpoint)
            path = self.saver.save()
        if path:
            logging.info("Saved checkpoint %s", path)
        step = int(self.trainer.step.numpy())
        self.health.checkpoint_saved(step, path or self.saver.chief_path(step))
        self._checkpoint_pending = False
        return path

    def checkpoint_here(self) -> Optional[str]:
        """The checkpoint of the current step: the one already written there, or a new one
        (every worker must call it)."""
        step = int(self.trainer.step.numpy())
        saved_step, saved = self.health.last_checkpoint
        return saved if saved_step == step else self.save_checkpoint()

    def evaluate(self, write_summaries: bool = True) -> Dict[str, float]:
        """Dev evaluation at the current step (:class:`~deep_nmt_tf.training.evaluation.
        Evaluator`); written to ``MODEL_DIR/eval`` unless ``write_summaries`` is False."""
        if self.evaluator is None:
            return {}
        writer = self.writer(EVAL_LOGS) if write_summaries else None
        return self.evaluator.evaluate(int(self.trainer.step.numpy()), writer)

    def request_stop(self, reason: str) -> None:
        """Asks the run to stop after the current step (an action's way to end training, e.g.
        a time budget): the loop ends once the step's actions have run, a checkpoint is written
        at that step and :meth:`run` returns.  :attr:`stopped` then holds the reason.  Under
        a multi-worker strategy every worker must ask at the same step (each takes part in the
        checkpoint)."""
        self._stop = str(reason)

    @property
    def stopped(self) -> Optional[str]:
        """Why the last :meth:`run` stopped early at a request (:meth:`request_stop`), or None."""
        return self._stop

    # -- data ----------------------------------------------------------------------------------
    def make_train_iterator(self):
        """An iterator over the training data, positioned after ``data_position``.

        A resumed run sees the same batches as an uninterrupted one:

        * with ``checkpoint_iterator`` (the default) under the default strategy, the
          ``tf.data`` iterator is saved in the checkpoints (``data_iterator``) and restored
          from them: a resume costs the same at any position;
        * with ``checkpoint_iterator=False``, and whenever the iterator cannot be checkpointed
          (distributed iterators, datasets with Python ops such as ``from_generator``), the
          ``data_position`` micro-batches consumed before the checkpoint are read again and
          dropped (about 100 demo-config batches/s on 2 CPU cores).
        """
        position = int(self.trainer.data_position.numpy())
        make = self.trainer.distributed_iterator
        if self.checkpoint_iterator:
            restored = self._restored_iterator() if position else None
            iterator = make() if restored is None else restored
            if compat.is_trackable(iterator):
                if position and restored is None:
                    logging.info("Re-reading the %d training micro-batches consumed before "
                                 "the checkpoint", position)
                    _advance(iterator, tf.constant(position, tf.int64))
                self.saver.set_checkpoint(
                    tf.train.Checkpoint(**self.checkpoint_items, data_iterator=iterator))
                return iterator
        if position:
            logging.info("Skipping the %d training micro-batches consumed before the checkpoint",
                         position)
        return make(position)

    def _restored_iterator(self):
        """The data iterator restored from the latest checkpoint, or None if it has none."""
        latest = self.saver.restored
        if not latest or not has_object(latest, "data_iterator"):
            return None
        iterator = self.trainer.distributed_iterator()
        try:
            tf.train.Checkpoint(data_iterator=iterator).restore(latest).expect_partial()
        except (tf.errors.OpError, ValueError, AssertionError) as e:
            logging.warning("Cannot restore the training data iterator from %s (%s); re-reading "
                            "the consumed batches instead (the pipeline differs from the one "
                            "saved: its corpora, or data.autotune)", latest,
                            str(e).splitlines()[0])
            return None
        logging.info("Restored the training data iterator from %s", latest)
        return iterator

    # -- the loop ----------------------------------------------------------------------------
    def actions(self, last: int) -> List[PeriodicAction]:
        """The periodic actions of a run ending at step ``last``, in the order they run."""
        t = self.config.training
        writer = self.writer(TRAIN_LOGS)

        def log(step, logs):
            self._log(writer, step, last)

        def diagnostics(step, logs):
            self.write_diagnostics(writer, step)

        def checkpoint(step, logs):
            if self.health.last_checkpoint[0] == step:
                return  # Written already (a checkpoint that was put off).
            if self.health.in_streak:  # Put off until an update is applied again.
                logging.info("Step %d: checkpoint put off (the update was skipped as "
                             "non-finite)", step)
                self._checkpoint_pending = True
            else:
                self.save_checkpoint()

        def evaluate(step, logs):
            return {f"eval_{k}": v for k, v in self.evaluate().items()}

        # The ETA of the log lines (its pace from the first finished step on); on a terminal
        # also a bar after every step.
        self._progress = Progress(last, int(self.trainer.step.numpy())).__enter__()

        def progress(step, logs):
            self._progress.update(step, logs.get("loss"), self._window.tokens_per_second())

        return [
            PeriodicAction("progress", 1, progress,
                           at_end=False, exclude_time=False),
            PeriodicAction("log", t.log_every, log, exclude_time=False),
            PeriodicAction("diagnostics", t.diagnostics_every or t.log_every, diagnostics),
            PeriodicAction("checkpoint", t.checkpoint_every, checkpoint),
            PeriodicAction("eval", t.eval_every, evaluate),
        ]

    def _log(self, writer, step: int, last: int) -> None:
        window = self._window
        summary = _window_summary(window)
        summary["skipped_updates"] = float(self.trainer.skipped_updates.numpy())
        metrics.write_scalars(writer, step,
                              {**summary, **evaluation.model_diagnostics(self.trainer.model)})
        logging.info("%s", self._progress.log_line(step, [
            f"loss {summary['loss']:.4f} (nll {summary['nll']:.4f}, ppl "
            f"{summary['perplexity']:.2f})", f"lr {summary['learning_rate']:.3e}",
            f"|g| {summary['grad_norm']:.3f}", f"{summary['tokens_per_second']:.0f} tok/s"]
            + ([f"{window.skipped} skipped"] if window.skipped else [])))
        if step >= last:
            self._progress.close()
        self._summary = summary
        self._window = LogWindow(self.trainer.SUM_KEYS)
        self.health.after_log(step, summary["loss"])

    def _step_logs(self, out: Dict[str, tf.Tensor], step: int) -> Dict[str, float]:
        logs = {k: float(v.numpy()) for k, v in out.items()}
        tokens = max(logs["num_tokens"], 1.0)
        logs["loss"], logs["nll"] = logs["loss_sum"] / tokens, logs["nll_sum"] / tokens
        if logs["skipped"]:
            logging.warning("Step %d: update skipped (gradient norm %g)", step,
                            logs["grad_norm"])
        return logs

    def run(self, hooks: Sequence[Union[TrainHook, PeriodicAction]] = (),
            max_steps: Optional[int] = None) -> Dict[str, float]:
        """Trains until ``training.train_steps`` (or ``max_steps``) updates.

        Args:
          hooks: callables ``hook(trainer, step, logs)`` run after each step (after its
            logging, checkpoint and evaluation), or :class:`PeriodicAction` s.  ``logs``: the
            step's metrics (``Trainer.train_step``) plus ``loss`` and ``nll`` per target
            token, and ``eval_*`` after an evaluation.
          max_steps: stop earlier (a checkpoint and an evaluation are made there as at the end).

        Returns:
          The last logged training metrics (averages over the last ``log_every`` steps) and the
          last evaluation (``eval_*`` keys); empty if there was nothing to do.  After a stop
          request (:meth:`request_stop`) :attr:`stopped` says why.

        Raises:
          DiskFullError: a checkpoint could not be written for space (module docstring).
          TrainingInterrupted, TrainingDiverged, WorkerLost: :mod:`~deep_nmt_tf.training.
            health`.
        """
        trainer = self.trainer
        t = self.config.training
        last = min(t.train_steps, max_steps) if max_steps else t.train_steps
        step = int(trainer.step.numpy())
        self._stop = None
        if step >= last:
            logging.info("Nothing to do: step %d >= %d", step, last)
            return {}
        if t.eval_every and (self.evaluator is None or not self.evaluator.has_dev_set()):
            logging.warning("training.eval_every=%d, but there is no dev set (data.dev_source / "
                            "data.dev_target): no dev evaluation will run", t.eval_every)
        iterator = self.make_train_iterator()
        actions = self.actions(last) + [
            h if isinstance(h, PeriodicAction) else hook_action(trainer, h) for h in hooks]
        self._window, self._summary = LogWindow(trainer.SUM_KEYS), {}
        logging.info("Training from step %d to %d (%d replica(s), %d micro-batch(es) per update)",
                     step, last, self.strategy.num_replicas_in_sync,
                     trainer.accumulation_steps)
        try:
            with health.StopSignals() as signals:
                self._loop(iterator, step, last, actions, signals)
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError) as e:
            if not self._multi_worker:
                raise
            raise health.worker_lost(e, self.checkpoints.latest(valid=False)) from None
        if self._stop is not None:
            path = self.checkpoint_here()
            logging.info("Stopped at step %d (%s)%s", int(trainer.step.numpy()), self._stop,
                         f": saved {path}" if path else "")
        return self._summary

    def _loop(self, iterator, step: int, last: int, actions: List[PeriodicAction],
              signals: "health.StopSignals") -> None:
        trainer = self.trainer
        writer = self.writer(TRAIN_LOGS)
        ratio_every = self.config.training.grad_norm_ratio_every
        stop_variable = getattr(trainer, "stop_requested", None)
        while step < last:
            if signals.requested:
                if not self._multi_worker:
                    self._interrupt(step, signals.received)
                if stop_variable is not None and not stop_variable.numpy():
                    stop_variable.assign(1.0)  # Told to every worker by the next update.
            diagnostics = bool(ratio_every) and (step + 1) % ratio_every == 0
            try:
                out = trainer.train_step(iterator, diagnostics=diagnostics)
            except tf.errors.OutOfRangeError:
                raise RuntimeError("the training dataset ended; it must repeat forever") from None
            step += 1
            logs = self._step_logs(out, step)
            if logs.pop("stop_requested", 0.0) > 0 or (signals.requested and
                                                        not self._multi_worker):
                self._interrupt(step, signals.received or "a signal to another worker")
            if self.health.after_step(step, logs):
                back = self.spike_response(step)
                if back is not None:  # Rolled back: this update is undone.
                    step, self._window = back, LogWindow(trainer.SUM_KEYS)
                    continue
            if self._checkpoint_pending and not self.health.in_streak:
                self.save_checkpoint()
            ratio = {k: logs.pop(k) for k in diagnostics_lib.RATIO_KEYS if k in logs}
            if ratio:
                metrics.write_scalars(writer, step, ratio)
                logging.info("step %d: grad-norm ratio %.4g (|dL/dh_1| %.4g, |dL/dh_N| %.4g)",
                             step, ratio["grad_norm_ratio"], ratio["grad_norm_h1"],
                             ratio["grad_norm_hN"])
            self._window.add(logs)
            logs.update(ratio)
            for action in actions:
                if not action.due(step, last):
                    continue
                start = time.perf_counter()
                results = action.fn(step, logs)
                if results:
                    logs.update(results)
                    self._summary.update(results)
                if action.exclude_time:
                    self._window.exclude(time.perf_counter() - start)
            if self._stop is not None:
                self._progress.close()
                return

    def _interrupt(self, step: int, signal_name: str) -> None:
        """Saves a checkpoint at ``step`` (unless there is one) and raises
        :class:`~deep_nmt_tf.health.TrainingInterrupted`."""
        path = self.checkpoint_here()
        logging.warning("Interrupted by %s at step %d%s", signal_name, step,
                        f": saved {path}" if path else "")
        raise health.TrainingInterrupted(signal_name, step, path)
