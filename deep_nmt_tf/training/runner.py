"""The runner: a training run around a :class:`~deep_nmt_tf.training.Trainer`.

The trainer owns one update (model, loss, optimizer, gradient accumulation, distribution); the
runner owns everything around it, in this order:

1. :func:`prepare_run`: checks the config against the run directory
   (:class:`~deep_nmt_tf.run_dir.RunDir`; a changed model is refused before any work),
   prepares the data and the vocabulary (the trainer's ``prepare`` hook, by default
   :func:`deep_nmt_tf.data.prepare_data`) and saves ``config.yaml`` and ``run.json``;
2. :class:`Runner` (built once the trainer has its model and optimizer): restore of the newest
   checkpoint that can be read (damaged or missing newer ones are skipped with a WARNING and
   kept; none readable is an error unless ``start_over``: :class:`~deep_nmt_tf.checkpointing.
   CheckpointSaver`), or else warm start (``training.warm_start``);
3. :meth:`Runner.run`: the loop, and after every step the periodic actions of
   :meth:`Runner.actions`, a declared list of :class:`PeriodicAction` run in this order:

   * ``log``, every ``training.log_every`` steps: console line (with the ETA) and ``train/``
     scalars; on a terminal also a progress bar redrawn after every step
     (:class:`deep_nmt_tf.progress.Progress`: step, loss, tokens/s, ETA);
   * ``diagnostics``, every ``training.diagnostics_every`` (default ``log_every``) steps:
     weight heatmaps and lexical-shortcut gates;
   * ``checkpoint``, every ``training.checkpoint_every`` steps: ``ckpt-N``;
   * ``eval``, every ``training.eval_every`` steps (0: never): dev loss and BLEU, ``eval/``
     scalars;
   * the caller's hooks, every step: ``hook(trainer, step, logs)`` callables, or
     :class:`PeriodicAction` s of their own.

   The first four also run after the last step.  Time spent in diagnostics, checkpoints and
   evaluation is left out of ``tokens_per_second``.

   Around every step, :mod:`~deep_nmt_tf.training.health`: SIGTERM and Ctrl-C save a
   checkpoint at the current step and raise :class:`~deep_nmt_tf.training.health.
   TrainingInterrupted`; ``training.max_consecutive_skipped`` non-finite updates in a row raise
   :class:`~deep_nmt_tf.training.health.TrainingDiverged` (a due checkpoint waits for the next
   applied update); an exploding loss is warned about; a lost worker of a multi-worker run
   raises :class:`~deep_nmt_tf.training.health.WorkerLost`.

Checkpoints (:mod:`deep_nmt_tf.checkpointing`; ``keep_checkpoints`` kept) hold the model
(with the dropout ``SeedGenerator`` states, so dropout masks continue exactly), the optimizer,
the trainer's counters ``step``, ``skipped_updates`` and ``data_position`` (micro-batches
consumed), the gradient transforms' state and (``checkpoint_iterator``, the default, where the
iterator can be saved: the default strategy) the ``tf.data`` iterator.  On resume the iterator
is restored, or else the training dataset is rebuilt and its first ``data_position``
micro-batches are read and dropped (:meth:`Runner.make_train_iterator`), so the dataset must be
deterministic for a given ``training.seed`` (as the data pipeline is).  A run killed at any
point continues from its latest checkpoint as if it had not been stopped.

Logs: a console line every ``training.log_every`` steps; TensorBoard scalars under
``MODEL_DIR/train`` (loss, nll, perplexity, learning_rate, grad_norm, tokens_per_second,
skipped_updates, the gradient transforms' statistics, the model's mixing weights
(:func:`~deep_nmt_tf.training.evaluation.model_diagnostics`), and every
``training.grad_norm_ratio_every`` steps Bapna et al.'s ``grad_norm_ratio``, ``grad_norm_h1``
and ``grad_norm_hN``, also in the console log; heatmaps ``weights/...`` and gates ``gates/...``
(:class:`~deep_nmt_tf.training.evaluation.DiagnosticsWriter`)) and ``MODEL_DIR/eval`` (loss,
nll, perplexity, bleu, mean lexical-shortcut gates on the first dev batch).

The runner imports no trainer class: it drives any object with the attributes that
:class:`~deep_nmt_tf.training.Trainer` has (``config``, ``run_dir``, ``strategy``,
``is_chief``, ``model``, ``step``, ``data_position``, ``skipped_updates``, ``optimizer``,
``accumulation_steps``, ``SUM_KEYS``, ``checkpoint_items()``, ``train_step()``,
``distributed_iterator()`` and the methods :mod:`~deep_nmt_tf.training.evaluation` uses).
"""

from __future__ import annotations

import dataclasses
import logging as py_logging
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat
from deep_nmt_tf.checkpointing import CheckpointSaver, has_object
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.progress import Progress
from deep_nmt_tf.run_dir import EVAL_LOGS, TRAIN_LOGS, RunDir
from deep_nmt_tf.training import diagnostics as diagnostics_lib
from deep_nmt_tf.training import evaluation, health, metrics
from deep_nmt_tf.training import warm_start as warm_start_lib

__all__ = ["prepare_run", "PeriodicAction", "Runner", "TrainHook", "quiet_expected_retracing"]


class _ExpectedRetracing(py_logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warnings about the named functions."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def filter(self, record):
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message and
                    any(name in message for name in self.names))


_EXPECTED_RETRACING = _ExpectedRetracing()


def quiet_expected_retracing(*names: str) -> None:
    """Silences TensorFlow's retracing warnings for functions whose names contain one of
    ``names`` (``training.static_shapes`` traces its step once per batch shape on purpose)."""
    _EXPECTED_RETRACING.names.update(names)
    py_logging.getLogger("tensorflow").addFilter(_EXPECTED_RETRACING)  # Added once at most.
    logging.info("training.static_shapes: the step is traced once per batch shape (one per "
                 "length bucket), so the first updates are slower")

#: ``hook(trainer, step, logs)`` called after every update (after logging, checkpointing and
#: evaluation of that step); ``logs`` holds the step's float metrics.
TrainHook = Callable[..., None]


def prepare_run(config: Config, run_dir: RunDir, prepare: Callable[[Config], Config],
                write: bool = True) -> Config:
    """Checks, prepares and records a run's config (step 1 of the module docstring).

    Args:
      config: the validated config of this run.
      run_dir: the run directory.
      prepare: ``config -> resolved config`` (data and vocabulary; fills ``model.vocab_size``).
      write: whether this process writes ``config.yaml`` (False on non-chief workers).

    Returns:
      The resolved config.

    Raises:
      ConfigError: the run directory was trained with another model or vocabulary, or the
        vocabulary size is still unknown.
    """
    run_dir.check_config(config)  # Before any work; again once resolved.
    config = prepare(config)
    if config.model.vocab_size <= 0:
        raise ConfigError(f"{config.source}: model.vocab_size is still 0 after data "
                          "preparation")
    run_dir.save_config(config, write=write)
    return config


@dataclasses.dataclass
class PeriodicAction:
    """Something the loop does after a step: ``fn(step, logs)`` every ``every`` steps.

    Attributes:
      name: what it is (for readers and error messages).
      every: period in steps; 0 or None: never.
      fn: ``fn(step, logs) -> Optional[dict]``; a returned dict of floats is added to the
        step's ``logs`` (what later actions and hooks see) and to the run's summary.
      at_end: also after the last step of :meth:`Runner.run`.
      exclude_time: leave its time out of the throughput (``tokens_per_second``).
    """

    name: str
    every: Optional[int]
    fn: Callable[[int, Dict[str, float]], Optional[Dict[str, float]]]
    at_end: bool = True
    exclude_time: bool = True

    def due(self, step: int, last: int) -> bool:
        """Whether it runs after ``step`` of a run ending at ``last``."""
        if not self.every:
            return False
        return step % self.every == 0 or (self.at_end and step == last)


def _hook_action(trainer, hook: TrainHook) -> PeriodicAction:
    """A ``hook(trainer, step, logs)`` as an action of every step (its time counts as training
    time, as it always did)."""

    def call(step, logs):
        hook(trainer, step, logs)

    return PeriodicAction(getattr(hook, "__name__", "hook"), 1, call, exclude_time=False)


class _LogWindow:
    """Training metrics between two console/TensorBoard logs."""

    def __init__(self, sum_keys: Sequence[str]):
        self.sum_keys = tuple(sum_keys)
        self.sums = {k: 0.0 for k in self.sum_keys}
        self.norm_sum, self.applied, self.skipped = 0.0, 0, 0
        self.last: Dict[str, float] = {}
        self.start = time.perf_counter()
        self.excluded = 0.0

    def exclude(self, seconds: float):
        """Leaves time spent on other work (checkpoints, evaluation) out of tokens/s."""
        self.excluded += seconds

    def add(self, logs: Dict[str, float]):
        for k in self.sum_keys:
            self.sums[k] += logs[k]
        if logs["skipped"]:
            self.skipped += 1
        else:
            self.norm_sum += logs["grad_norm"]
            self.applied += 1
        self.last = dict(logs)

    def elapsed(self) -> float:
        """Training time in the window (seconds, other work excluded)."""
        return max(time.perf_counter() - self.start - self.excluded, 1e-9)

    def tokens_per_second(self) -> float:
        """Source and target tokens per second of training time in the window."""
        return (self.sums["num_tokens"] + self.sums["source_tokens"]) / self.elapsed()

    def summary(self) -> Dict[str, float]:
        """Per-token losses over the window, mean norm of the applied updates, throughput,
        the current learning rate and the gradient transforms' latest statistics."""
        elapsed = self.elapsed()
        tokens = max(self.sums["num_tokens"], 1.0)
        nll = self.sums["nll_sum"] / tokens
        out = {k: v for k, v in self.last.items()
               if k not in self.sum_keys and k not in ("loss", "nll", "skipped")}
        out.update({
            "loss": self.sums["loss_sum"] / tokens,
            "nll": nll,
            "perplexity": math.exp(min(nll, 100.0)),
            "grad_norm": self.norm_sum / max(self.applied, 1),
            "tokens_per_second": self.tokens_per_second(),
            "target_tokens_per_second": self.sums["num_tokens"] / elapsed,
        })
        return out


@tf.function
def _advance(iterator, count):
    """Reads and drops ``count`` elements of ``iterator`` (in graph: no Python per element)."""
    for _ in tf.range(count):
        next(iterator)


class Runner:
    """Warm start or restore, checkpoints, evaluation and the loop of one trainer.

    Args:
      trainer: a trainer whose model, optimizer and counters exist (module docstring).
      checkpoint_iterator: also save the ``tf.data`` iterator in the checkpoints when possible
        (see :meth:`make_train_iterator`).
      start_over: train from step 0 when the run directory has checkpoint files of which none
        can be read (they are kept, renamed ``*.unreadable``); without it that is an error.

    Raises:
      CheckpointError: checkpoint files, none readable (and not ``start_over``), or
        ``start_over`` with a readable checkpoint.
    """

    def __init__(self, trainer, checkpoint_iterator: bool = True, start_over: bool = False):
        self.trainer = trainer
        self.run_dir: RunDir = trainer.run_dir
        self.checkpoint_iterator = checkpoint_iterator
        config = trainer.config
        self._checkpoint_items = trainer.checkpoint_items()
        self.checkpoint = tf.train.Checkpoint(**self._checkpoint_items)
        self.saver = CheckpointSaver(self.checkpoint, self.run_dir.path,
                                     max_to_keep=config.training.keep_checkpoints,
                                     step_counter=trainer.step, chief=trainer.is_chief)
        restored = self.saver.restore_latest(start_over, getattr(trainer, "resume", None))
        if restored:
            logging.info("Restored %s (step %d, %d updates applied, %d micro-batches consumed)",
                         restored, int(trainer.step.numpy()),
                         int(trainer.optimizer.iterations.numpy()),
                         int(trainer.data_position.numpy()))
        elif config.training.warm_start.checkpoint:
            with trainer.strategy.scope():
                warm_start_lib.warm_start(trainer.model, config)
        t = config.training
        self.health = health.HealthMonitor(t.max_consecutive_skipped, t.loss_explosion_factor)
        self.health.checkpoint_saved(int(trainer.step.numpy()), restored)
        self._multi_worker = isinstance(trainer.strategy,
                                        tf.distribute.MultiWorkerMirroredStrategy)
        self._checkpoint_pending = False
        self.evaluator = evaluation.Evaluator(trainer)
        self.write_diagnostics = evaluation.DiagnosticsWriter(trainer)
        self._writers: Dict[str, tf.summary.SummaryWriter] = {}
        self._window: Optional[_LogWindow] = None
        self._summary: Dict[str, float] = {}

    # -- files -------------------------------------------------------------------------------
    def writer(self, name: str):
        """The TensorBoard writer of ``MODEL_DIR/<name>`` (a no-op writer off the chief)."""
        if name not in self._writers:
            if self.trainer.is_chief:
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
        writer = self.writer(EVAL_LOGS) if write_summaries else None
        return self.evaluator.evaluate(int(self.trainer.step.numpy()), writer)

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
                    tf.train.Checkpoint(**self._checkpoint_items, data_iterator=iterator))
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
                            "the consumed batches instead", latest, str(e).splitlines()[0])
            return None
        logging.info("Restored the training data iterator from %s", latest)
        return iterator

    # -- the loop ----------------------------------------------------------------------------
    def actions(self, last: int) -> List[PeriodicAction]:
        """The periodic actions of a run ending at step ``last``, in the order they run."""
        t = self.trainer.config.training
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

        # The ETA of the log lines; on a terminal also a bar after every step.
        self._progress = Progress(last, int(self.trainer.step.numpy())).__enter__()

        def progress(step, logs):
            self._progress.update(step, logs.get("loss"), self._window.tokens_per_second())

        return [
            PeriodicAction("progress", 1 if self._progress.interactive else 0, progress,
                           at_end=False, exclude_time=False),
            PeriodicAction("log", t.log_every, log, exclude_time=False),
            PeriodicAction("diagnostics", t.diagnostics_every or t.log_every, diagnostics),
            PeriodicAction("checkpoint", t.checkpoint_every, checkpoint),
            PeriodicAction("eval", t.eval_every, evaluate),
        ]

    def _log(self, writer, step: int, last: int) -> None:
        window = self._window
        summary = window.summary()
        summary["skipped_updates"] = float(self.trainer.skipped_updates.numpy())
        metrics.write_scalars(writer, step,
                              {**summary, **evaluation.model_diagnostics(self.trainer.model)})
        logging.info("step %d/%d: loss %.4f (nll %.4f, ppl %.2f), lr %.3e, |g| %.3f, "
                     "%.0f tok/s%s, ETA %s", step, last, summary["loss"], summary["nll"],
                     summary["perplexity"], summary["learning_rate"],
                     summary["grad_norm"], summary["tokens_per_second"],
                     f", {window.skipped} skipped" if window.skipped else "",
                     self._progress.eta(step))
        if step >= last:
            self._progress.close()
        self._summary = summary
        self._window = _LogWindow(self.trainer.SUM_KEYS)
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
          last evaluation (``eval_*`` keys); empty if there was nothing to do.
        """
        trainer = self.trainer
        t = trainer.config.training
        last = min(t.train_steps, max_steps) if max_steps else t.train_steps
        step = int(trainer.step.numpy())
        if step >= last:
            logging.info("Nothing to do: step %d >= %d", step, last)
            return {}
        if t.eval_every and trainer.build_eval_dataset() is None:
            logging.warning("training.eval_every=%d, but there is no dev set (data.dev_source / "
                            "data.dev_target): no dev evaluation will run", t.eval_every)
        iterator = self.make_train_iterator()
        actions = self.actions(last) + [
            h if isinstance(h, PeriodicAction) else _hook_action(trainer, h) for h in hooks]
        self._window, self._summary = _LogWindow(trainer.SUM_KEYS), {}
        logging.info("Training from step %d to %d (%d replica(s), %d micro-batch(es) per update)",
                     step, last, trainer.strategy.num_replicas_in_sync,
                     trainer.accumulation_steps)
        try:
            with health.StopSignals() as signals:
                self._loop(iterator, step, last, actions, signals)
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError) as e:
            if not self._multi_worker:
                raise
            raise health.worker_lost(e, self.saver.latest_checkpoint) from None
        return self._summary

    def _loop(self, iterator, step: int, last: int, actions: List[PeriodicAction],
              signals: "health.StopSignals") -> None:
        trainer = self.trainer
        writer = self.writer(TRAIN_LOGS)
        ratio_every = trainer.config.training.grad_norm_ratio_every
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
            self.health.after_step(step, logs)
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

    def _interrupt(self, step: int, signal_name: str) -> None:
        """Saves a checkpoint at ``step`` (unless there is one) and raises
        :class:`~deep_nmt_tf.training.health.TrainingInterrupted`."""
        path = self.checkpoint_here()
        logging.warning("Interrupted by %s at step %d%s", signal_name, step,
                        f": saved {path}" if path else "")
        raise health.TrainingInterrupted(signal_name, step, path)
