"""A training run with ``compile``/``fit`` on the current Keras backend (``deep-nmt-fit``).

:func:`train` trains the model of a run directory that ``deep-nmt-preprocess`` prepared
(``config.yaml``, ``vocab.txt``, ``data/train.npz`` and, for dev loss, ``data/dev.npz``); no
TensorFlow is needed, so it runs on a machine with only JAX (or PyTorch)::

    deep-nmt-preprocess --config=configs/demo.yaml --model_dir=runs/demo_fit   # TensorFlow
    KERAS_BACKEND=jax deep-nmt-fit --model_dir=runs/demo_fit                   # any backend
    deep-nmt-translate --model_dir=runs/demo_fit < test.src                    # TensorFlow

The run:

1. the saved config with ``overrides`` applied (training keys only: the model is the run
   directory's; :meth:`~deep_nmt_tf.run_dir.RunDir.save_config` refuses another) is checked
   for what fit cannot do (:func:`~deep_nmt_tf.fit.compiling.check_fit_config`);
2. on JAX, the persistent compilation cache (:func:`~deep_nmt_tf.fit.compiling.
   use_compilation_cache`: a resumed run loads its compiled steps), ``keras.distribution.
   DataParallel`` over several devices
   (:func:`~deep_nmt_tf.fit.compiling.setup_distribution`), the seed, the model
   (:func:`~deep_nmt_tf.fit.compiling.build_fit_model`) and :func:`~deep_nmt_tf.fit.
   compiling.compile_model`;
3. resume, decided by the run directory's checkpoint store as in the custom loop
   (:meth:`~deep_nmt_tf.checkpoints.CheckpointStore.resume_point`): the newest
   ``ckpt-N.weights.h5`` that passes the integrity check (damaged newer ones are skipped with a
   WARNING and kept, renamed ``*.unreadable``; none readable is a ``CheckpointError``) restores
   the model and the optimizer (its update counter, so the schedule continues), and the batch
   stream skips the ``N * gradient_accumulation_steps`` batches consumed;
4. ``fit`` on :class:`~deep_nmt_tf.data.batching.TokenBatches` with one ``fit`` epoch per
   ``training.log_every`` updates, until ``training.train_steps`` updates; the dev loss every
   ``training.eval_every`` updates (rounded to whole epochs; :class:`~deep_nmt_tf.data.
   batching.EvalBatches` of ``data/dev.npz``); checkpoints every ``training.checkpoint_every``
   updates (:class:`~deep_nmt_tf.fit.callbacks.RunDirCheckpoint`).  Dev BLEU is not computed
   during fit (``deep-nmt-evaluate`` scores the checkpoints);
5. a micro-batch whose gradients are not finite is skipped and counted, as in the custom loop
   (:class:`~deep_nmt_tf.task.skipping.SkipNonFiniteUpdates`); ``training.
   max_consecutive_skipped`` updates' worth of them in a row, or non-finite weights, stop the
   run with nothing saved after it: :class:`~deep_nmt_tf.fit.callbacks.FitDiverged` names the
   last good checkpoint; SIGTERM or Ctrl-C stop it at the end of the update with a checkpoint
   there (:class:`~deep_nmt_tf.health.TrainingInterrupted`).
"""

from __future__ import annotations

import math
import os
from typing import Dict, Sequence

import keras
from absl import logging

from deep_nmt_tf.checkpoints import KERAS_WEIGHTS, CheckpointStore
from deep_nmt_tf.data.batching import EvalBatches, TokenBatches
from deep_nmt_tf.data.token_ids import TokenIds
from deep_nmt_tf.fit import compiling
from deep_nmt_tf.fit.callbacks import FitDiverged, ProgressLogger, RunDirCheckpoint
from deep_nmt_tf.health import StopSignals, TrainingInterrupted
from deep_nmt_tf.run_dir import RunDir
from deep_nmt_tf.task.skipping import skip_counts, updates_read

__all__ = ["restore_resume_point", "train"]


def restore_resume_point(model, run_dir: RunDir) -> int:
    """Loads the resume point of ``run_dir`` (the newest ``ckpt-N.weights.h5`` that can be
    read) into a compiled ``model`` (the optimizer too); returns its update count, the data
    position in updates (micro-batches read, skipped ones included, over the accumulation
    steps: :func:`~deep_nmt_tf.task.skipping.updates_read`; 0 when there is none).

    Raises:
      CheckpointError: ``.weights.h5`` files, none readable (named with their problems).
    """
    store = CheckpointStore(run_dir)
    path = store.set_aside_skipped(store.resume_point(
        KERAS_WEIGHTS, start_over_hint="move them away to train from update 0"))
    if path is None:
        return 0
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    model.load_weights(path)
    updates = updates_read(optimizer)
    counts = skip_counts(optimizer)
    logging.info("Restored %s (update %d; %d micro-batches skipped as non-finite)", path,
                 updates, counts[0] if counts else 0)
    return updates


def train(model_dir, overrides: Sequence[str] = (), callbacks: Sequence = (),
          progress_stream=None) -> Dict[str, float]:
    """Trains ``model_dir``'s model with ``fit`` until ``training.train_steps`` updates
    (module docstring).

    Args:
      model_dir: a run directory written by ``deep-nmt-preprocess`` (or by ``deep-nmt-train``:
        then its ``data/*.npz`` must be written by ``deep-nmt-preprocess`` first).
      overrides: config overrides (``training.train_steps=3000`` ...).
      callbacks: more Keras callbacks.
      progress_stream: where the progress bar goes (default stderr).

    Returns:
      The last logged values: ``loss``, ``learning_rate``, ``tokens_per_second`` and
      ``eval_loss`` (when the dev loss ran); {} when there was nothing to do.

    Raises:
      FileNotFoundError: no ``config.yaml``.
      ConfigError: a changed model, or a key fit cannot honour.
      CheckpointError: checkpoints, none readable.
      DataError: no ``data/train.npz``, or one tokenised with another vocabulary.
      FitDiverged: non-finite weights, or ``training.max_consecutive_skipped`` updates'
        worth of skipped micro-batches in a row (nothing saved after it; the message names the
        last good checkpoint).
      TrainingInterrupted: SIGTERM or Ctrl-C (a checkpoint saved at the update reached).
    """
    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    compiling.check_fit_config(config)
    with CheckpointStore(run_dir).writing(kind=KERAS_WEIGHTS):  # A full disk: DiskFullError.
        run_dir.save_config(config)
    t = config.training
    sha = (run_dir.metadata().get("vocab") or {}).get("sha256")
    train_ids = TokenIds.load(run_dir.token_file("train"), vocab_sha256=sha)

    cache = compiling.use_compilation_cache()
    if cache:
        logging.info("Compiled steps cached in %s (%s=off: not)", cache, compiling.CACHE_ENV)
    replicas = compiling.setup_distribution()
    keras.utils.set_random_seed(t.seed)
    model = compiling.build_fit_model(config)
    compiling.compile_model(model, config, num_replicas=replicas)
    start = restore_resume_point(model, run_dir)
    if start >= t.train_steps:
        logging.info("Nothing to do: update %d >= %d", start, t.train_steps)
        return {}

    k = t.gradient_accumulation_steps
    per_epoch = max(1, min(t.log_every, t.train_steps))
    batches = TokenBatches.from_config(config, train_ids, num_batches=per_epoch * k,
                                       start=start * k, batch_size_multiple=replicas)
    if batches.num_dropped:
        logging.info("%d of %d training pairs dropped (an empty side, or longer than "
                     "data.max_source_length / data.max_target_length)", batches.num_dropped,
                     len(train_ids))
    validation, validation_freq = None, 1
    if t.eval_every and os.path.exists(run_dir.token_file("dev")):
        dev = TokenIds.load(run_dir.token_file("dev"), vocab_sha256=sha)
        validation = EvalBatches.from_config(config, dev)
        validation_freq = max(1, round(t.eval_every / per_epoch))
    logger = ProgressLogger(t.train_steps, start, k, batches, stream=progress_stream,
                            loss_explosion_factor=t.loss_explosion_factor)
    first_epoch = start // per_epoch
    epochs = first_epoch + math.ceil((t.train_steps - start) / per_epoch)
    with StopSignals() as signals:
        saver = RunDirCheckpoint(run_dir, t.checkpoint_every, t.keep_checkpoints, start, k,
                                 signals=signals,
                                 max_consecutive_skipped=t.max_consecutive_skipped)
        model.fit(batches, epochs=epochs, initial_epoch=first_epoch, shuffle=False, verbose=0,
                  validation_data=validation, validation_freq=validation_freq,
                  callbacks=[logger, saver, *callbacks])
    if saver.diverged:
        raise FitDiverged(saver.diverged_message())
    if saver.interrupted:
        raise TrainingInterrupted(*saver.interrupted)
    return dict(logger.history)
