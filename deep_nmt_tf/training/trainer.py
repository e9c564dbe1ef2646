"""The training task and its custom training loop (TensorFlow backend, ``tf.distribute``).

:class:`Trainer` gathers what a run needs, in the manner of a TF Model Garden task:
:meth:`~Trainer.build_model`, :meth:`~Trainer.build_train_dataset`,
:meth:`~Trainer.build_eval_dataset`, :meth:`~Trainer.compute_loss`, :meth:`~Trainer.train_step`,
:meth:`~Trainer.evaluate`; :meth:`~Trainer.train` is the loop around them.  Subclass and override
a ``build_*`` method to swap a component (the tests train a stand-in model that way).

One update (:meth:`~Trainer.train_step`), with ``k = training.gradient_accumulation_steps``
micro-batches and ``n`` replicas:

1. each replica runs forward and backward on its micro-batch and keeps the gradient of the
   loss *numerator* (the summed per-token losses, :func:`~deep_nmt_tf.training.losses.
   cross_entropy_sums`) and the denominators (target tokens, sentences); over the first
   ``k - 1`` micro-batches they are added into replica-local accumulators;
2. gradients and sums are all-reduced (summed) across replicas, once per update;
3. the summed gradient is divided by the global denominator (tokens or sentences:
   ``training.loss_normalization``), so ``k`` micro-batches on ``n`` replicas give the same
   update as one batch holding all of them;
4. L2 weight decay adds ``wd * w`` (:mod:`~deep_nmt_tf.training.optimizers`); the global norm is
   computed; the gradient transforms run (``training.clip_norm``: global-norm clipping, and any
   added with ``gradient_transforms=``);
5. Adam applies the update, unless the norm is not finite or a transform asked to skip it; a
   skipped update is counted (``skipped_updates``) and leaves the weights and Adam's state alone.

The learning-rate schedule reads ``optimizer.iterations`` (updates applied); ``step`` counts
update attempts, skipped ones included.

Checkpoints (every ``training.checkpoint_every`` steps and at the end; ``keep_checkpoints``
kept) hold the model (with the dropout ``SeedGenerator`` states, so dropout masks continue
exactly), the optimizer (iteration counter and moments), ``step``, ``skipped_updates``,
``data_position`` (micro-batches consumed), the state of the gradient transforms and, if asked
(``checkpoint_iterator``, default strategy only), the ``tf.data`` iterator.  On resume the
iterator is restored, or else the training dataset is rebuilt and its first ``data_position``
micro-batches are read and dropped (:meth:`Trainer.make_train_iterator`), so the dataset must be
deterministic for a given ``training.seed`` (as the data pipeline is).  A run killed at any point
continues from its latest checkpoint as if it had not been stopped.

Evaluation (every ``training.eval_every`` steps and at the end) computes the dev loss and, with
``training.eval_bleu``, sacreBLEU over greedy decoding; it runs on the first device of the
strategy.  Logs: a console line every ``training.log_every`` steps, TensorBoard scalars under
``MODEL_DIR/train`` (loss, nll, perplexity, learning_rate, grad_norm, tokens_per_second,
skipped_updates, the gradient transforms' statistics, the model's mixing weights
(:meth:`Trainer.model_diagnostics`), and every ``training.grad_norm_ratio_every`` steps Bapna et
al.'s ``grad_norm_ratio``, ``grad_norm_h1`` and ``grad_norm_hN``, also in the console log;
every ``training.diagnostics_every`` steps (default ``log_every``) heatmaps ``weights/...`` of
the mixing matrices and the mean lexical-shortcut gates ``gates/...`` on a fixed batch,
:meth:`Trainer.write_diagnostics`) and ``MODEL_DIR/eval`` (loss, nll,
perplexity, bleu, mean lexical-shortcut gates on the first dev batch).
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.training import checkpoints as ckpt_lib
from deep_nmt_tf.training import diagnostics as diagnostics_lib
from deep_nmt_tf.training import losses, metrics, optimizers, schedules
from deep_nmt_tf.training import warm_start as warm_start_lib
from deep_nmt_tf.training.strategy import is_chief

__all__ = ["Trainer", "TrainHook"]

#: ``hook(trainer, step, logs)`` called after every update (after logging, checkpointing and
#: evaluation of that step); ``logs`` holds the step's float metrics.
TrainHook = Callable[["Trainer", int, Dict[str, float]], None]

_SUM_KEYS = ("loss_sum", "nll_sum", "num_tokens", "num_sentences", "source_tokens",
             "h1_grad_sq", "hn_grad_sq")
_BATCH_KEYS = ("source_ids", "target_input_ids", "target_output_ids")


class _LogWindow:
    """Training metrics between two console/TensorBoard logs."""

    def __init__(self):
        self.sums = {k: 0.0 for k in _SUM_KEYS}
        self.norm_sum, self.applied, self.skipped = 0.0, 0, 0
        self.last: Dict[str, float] = {}
        self.start = time.perf_counter()
        self.excluded = 0.0

    def exclude(self, seconds: float):
        """Leaves time spent on other work (checkpoints, evaluation) out of tokens/s."""
        self.excluded += seconds

    def add(self, logs: Dict[str, float]):
        for k in _SUM_KEYS:
            self.sums[k] += logs[k]
        if logs["skipped"]:
            self.skipped += 1
        else:
            self.norm_sum += logs["grad_norm"]
            self.applied += 1
        self.last = dict(logs)

    def summary(self) -> Dict[str, float]:
        """Per-token losses over the window, mean norm of the applied updates, throughput,
        the current learning rate and the gradient transforms' latest statistics."""
        elapsed = max(time.perf_counter() - self.start - self.excluded, 1e-9)
        tokens = max(self.sums["num_tokens"], 1.0)
        nll = self.sums["nll_sum"] / tokens
        out = {k: v for k, v in self.last.items()
               if k not in _SUM_KEYS and k not in ("loss", "nll", "skipped")}
        out.update({
            "loss": self.sums["loss_sum"] / tokens,
            "nll": nll,
            "perplexity": math.exp(min(nll, 100.0)),
            "grad_norm": self.norm_sum / max(self.applied, 1),
            "tokens_per_second": (self.sums["num_tokens"] + self.sums["source_tokens"]) / elapsed,
            "target_tokens_per_second": self.sums["num_tokens"] / elapsed,
        })
        return out


@tf.function
def _advance(iterator, count):
    """Reads and drops ``count`` elements of ``iterator`` (in graph: no Python per element)."""
    for _ in tf.range(count):
        next(iterator)


def _densify(grad, variable):
    if grad is None:
        return tf.zeros(variable.shape, dtype=variable.dtype)
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


class Trainer:
    """Builds a model, its optimizer and data, and trains it with a custom loop.

    Args:
      config: the validated :class:`~deep_nmt_tf.config.Config`.
      model_dir: the model directory (checkpoints, ``config.yaml``, TensorBoard logs, and the
        data that :func:`deep_nmt_tf.data.prepare_data` writes there).
      strategy: a ``tf.distribute.Strategy`` (default: the default strategy); see
        :func:`deep_nmt_tf.training.strategy.make_strategy`.
      gradient_transforms: extra :class:`~deep_nmt_tf.training.optimizers.GradientTransform`s,
        run after the ones the config asks for.
      checkpoint_iterator: also save the ``tf.data`` iterator in the checkpoints when possible
        (see :meth:`make_train_iterator`).  Resuming is then instant, but every checkpoint
        holds the shuffle buffer (demo config: +34 MB and +3 s per checkpoint); the default
        re-reads the consumed batches on resume instead.

    Raises:
      ConfigError: ``model_dir`` was trained with a different model config.

    Example:
      >>> from deep_nmt_tf.config import load_config
      >>> cfg = load_config("configs/demo.yaml", overrides=["training.train_steps=100"])
      >>> Trainer(cfg, "/tmp/demo").train()
    """

    def __init__(self, config: Config, model_dir: str,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 gradient_transforms: Sequence[optimizers.GradientTransform] = (),
                 checkpoint_iterator: bool = False):
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError("deep_nmt_tf.training needs the TensorFlow Keras backend "
                               f"(KERAS_BACKEND={keras.backend.backend()!r})")
        self.model_dir = model_dir
        self.checkpoint_iterator = checkpoint_iterator
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = is_chief(self.strategy)
        self.tokenizer = None
        ckpt_lib.check_config(config, model_dir)  # Before any work; again once resolved.
        self.config = self.prepare(config)
        if self.config.model.vocab_size <= 0:
            raise ConfigError(f"{self.config.source}: model.vocab_size is still 0 after data "
                              "preparation")
        ckpt_lib.check_and_save_config(self.config, model_dir, write=self.is_chief)
        t = self.config.training
        self.accumulation_steps = t.gradient_accumulation_steps
        keras.utils.set_random_seed(t.seed)

        with self.strategy.scope():
            self.model = self.build_model()
            # Warm start (fresh runs) and freezing: training.warm_start, training.freeze.
            self._trainable_variables = warm_start_lib.initialize(self.model, self.config,
                                                                  model_dir)
            self.schedule = schedules.build_schedule(
                self.config, num_replicas=self.strategy.num_replicas_in_sync)
            self.optimizer = optimizers.build_optimizer(self.config, self.schedule)
            self.optimizer.build(self.trainable_variables)
            self.gradient_transforms: List[optimizers.GradientTransform] = (
                optimizers.build_gradient_transforms(self.config) + list(gradient_transforms))
            for transform in self.gradient_transforms:
                transform.build(self.trainable_variables)
            counter = dict(dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.step = tf.Variable(0, name="step", **counter)
            self.skipped_updates = tf.Variable(0, name="skipped_updates", **counter)
            self.data_position = tf.Variable(0, name="data_position", **counter)
            self._grad_accumulators = []
            self._sum_accumulator = None
            if self.accumulation_steps > 1:
                local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM)
                self._grad_accumulators = [
                    tf.Variable(tf.zeros(v.shape, v.dtype), name="grad_accumulator", **local)
                    for v in self.trainable_variables]
                self._sum_accumulator = tf.Variable(tf.zeros([len(_SUM_KEYS)]),
                                                    name="sum_accumulator", **local)
        self._decayed_mask = optimizers.decayed_variable_mask(self.trainable_variables)
        if t.grad_norm_ratio_every and not (hasattr(self.model, "encode") and
                                            hasattr(self.model, "decode")):
            raise ConfigError(f"{self.config.source}: training.grad_norm_ratio_every: the model "
                              f"{type(self.model).__name__} has no encode()/decode() to "
                              "differentiate the encoder layer outputs")

        items = dict(model=ckpt_lib.model_trackable(self.model), optimizer=self.optimizer,
                     step=self.step, skipped_updates=self.skipped_updates,
                     data_position=self.data_position)
        for i, transform in enumerate(self.gradient_transforms):
            for name, obj in transform.checkpoint_items().items():
                items[f"transform_{i}_{name}"] = obj
        self._checkpoint_items = items
        self.checkpoint = tf.train.Checkpoint(**items)
        self.checkpoint_saver = ckpt_lib.CheckpointSaver(
            self.checkpoint, model_dir, max_to_keep=t.keep_checkpoints,
            step_counter=self.step, chief=self.is_chief)
        restored = self.checkpoint_saver.restore_latest()
        if restored:
            logging.info("Restored %s (step %d, %d updates applied, %d micro-batches consumed)",
                         restored, int(self.step.numpy()), int(self.optimizer.iterations.numpy()),
                         int(self.data_position.numpy()))

        compute = self._compute_gradients
        if t.jit_compile:
            compute = tf.function(compute, jit_compile=True, reduce_retracing=True)
        self._compute_gradients_fn = compute
        self._train_step_fn = tf.function(self._train_step)
        self._eval_sums_fn = tf.function(
            lambda batch: self.compute_loss(batch, training=False), reduce_retracing=True)
        self._greedy_fn = tf.function(
            lambda source_ids, max_length: metrics.greedy_decode(self.model, source_ids,
                                                                 max_length),
            input_signature=[tf.TensorSpec([None, None], tf.int32),
                             tf.TensorSpec([], tf.int32)])
        self._writers: Dict[str, tf.summary.SummaryWriter] = {}
        self._gate_batch = self._gates_fn = None  # write_diagnostics' fixed batch.

    # ------------------------------------------------------------------------------------
    # Components (override in a subclass to swap one)
    # ------------------------------------------------------------------------------------

    def prepare(self, config: Config) -> Config:
        """Prepares the data (corpus, vocabulary) and returns the resolved config.

        The default checks that a training corpus is configured, runs
        :func:`deep_nmt_tf.data.prepare_data` and loads the tokenizer.
        """
        from deep_nmt_tf.config import require_training_data
        from deep_nmt_tf.data import Tokenizer, prepare_data

        require_training_data(config)
        config = prepare_data(config, self.model_dir)
        self.tokenizer = Tokenizer.from_config(config)
        return config

    def build_model(self) -> keras.Model:
        """The model (built: its variables exist); called inside the strategy scope."""
        from deep_nmt_tf.models import build_model

        return build_model(self.config)

    def build_train_dataset(self, input_context: Optional[tf.distribute.InputContext]
                            ) -> tf.data.Dataset:
        """This input pipeline's training micro-batches (an endless, deterministic dataset).

        Each element is one replica's part of a global micro-batch (``docs/DESIGN.md`` format).
        """
        from deep_nmt_tf.data import make_train_dataset

        return make_train_dataset(self.config, self.tokenizer, input_context=input_context)

    def build_eval_dataset(self) -> Optional[tf.data.Dataset]:
        """Dev batches in corpus order with ``target_text`` (the references), or None."""
        if not self.config.data.dev_source:
            return None
        from deep_nmt_tf.data import make_dev_dataset

        return make_dev_dataset(self.config, self.tokenizer, include_text=True)

    def detokenize(self, ids: np.ndarray) -> List[str]:
        """Greedy output ids ``[B, L]`` (``EOS``, then padding) -> text, for BLEU."""
        return [t.decode("utf-8") for t in self.tokenizer.detokenize(ids).numpy()]

    @property
    def trainable_variables(self) -> List:
        """The variables that are trained (and that the optimizer and accumulators track)."""
        return self._trainable_variables

    # ------------------------------------------------------------------------------------
    # Loss and gradients
    # ------------------------------------------------------------------------------------

    def compute_loss(self, batch: Dict[str, tf.Tensor], training: bool) -> losses.LossSums:
        """Forward pass and loss sums of one (per-replica) batch."""
        logits = self.model({"source_ids": batch["source_ids"],
                             "target_input_ids": batch["target_input_ids"]}, training=training)
        return losses.cross_entropy_sums(logits, batch["target_output_ids"],
                                         self.config.training.label_smoothing)

    def _diagnostic_loss(self, batch):
        """``compute_loss`` (training) through ``encode``/``decode``, also returning the first
        and the top encoder layer outputs (``layer_outputs[1]`` and ``[-1]``)."""
        encoded = self.model.encode(batch["source_ids"], training=True)
        outputs = encoded.get("layer_outputs") if isinstance(encoded, dict) else None
        if not outputs or len(outputs) < 2:
            raise ValueError("training.grad_norm_ratio_every needs a model whose encode() "
                             "returns 'layer_outputs' (embedding output + one per layer)")
        logits = self.model.decode(encoded, batch["target_input_ids"], training=True)
        sums = losses.cross_entropy_sums(logits, batch["target_output_ids"],
                                         self.config.training.label_smoothing)
        return sums, [outputs[1], outputs[-1]]

    def _compute_gradients(self, batch, diagnostics=False):
        """Replica context: gradients of the loss numerator, and the vector of sums.

        With ``diagnostics`` the vector also holds the squared norms of the numerator's
        gradients with respect to the first and the top encoder layer outputs (Bapna et al.
        2018's grad-norm ratio; ``call`` is ``decode(encode(...))``, so the update is the same).
        """
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            if diagnostics:
                sums, watched = self._diagnostic_loss(batch)
            else:
                sums, watched = self.compute_loss(batch, training=True), []
        grads = tape.gradient(sums.loss, list(variables) + watched)
        grads, watched_grads = grads[:len(variables)], grads[len(variables):]
        unused = [getattr(v, "path", v.name) for g, v in zip(grads, variables) if g is None]
        if unused:  # Runs once, while tracing.
            logging.warning("Trainable variables that the loss does not depend on (they will "
                            "not change): %s", ", ".join(unused))
        grads = [_densify(g, v) for g, v in zip(grads, variables)]
        squares = [tf.constant(0.0), tf.constant(0.0)]
        if diagnostics:
            if any(g is None for g in watched_grads):
                raise ValueError("grad-norm ratio: the loss does not depend on the first or "
                                 "the top encoder layer output")
            squares = [tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in watched_grads]
        source_tokens = tf.reduce_sum(tf.cast(tf.not_equal(batch["source_ids"], 0), tf.float32))
        vector = tf.stack([sums.loss, sums.nll, sums.num_tokens, sums.num_sentences,
                           source_tokens] + squares)
        return grads, vector

    def _accumulate_replica(self, batch, diagnostics):
        grads, vector = self._compute_gradients_fn(batch, diagnostics)
        for acc, g in zip(self._grad_accumulators, grads):
            acc.assign_add(g)
        self._sum_accumulator.assign_add(vector)

    def _reduce_replica(self, batch, diagnostics):
        """Replica context: last micro-batch, all-reduce, normalise, transform.

        Returns the final gradients (identical on every replica) and the update's metrics.
        """
        grads, vector = self._compute_gradients_fn(batch, diagnostics)
        if self._grad_accumulators:
            grads = [g + acc.read_value() for g, acc in zip(grads, self._grad_accumulators)]
            vector = vector + self._sum_accumulator.read_value()
            for acc in self._grad_accumulators:
                acc.assign(tf.zeros_like(acc))
            self._sum_accumulator.assign(tf.zeros_like(self._sum_accumulator))
        ctx = tf.distribute.get_replica_context()
        grads, vector = ctx.all_reduce(tf.distribute.ReduceOp.SUM, (grads, vector))
        sums = dict(zip(_SUM_KEYS, tf.unstack(vector)))
        if self.config.training.loss_normalization == "token":
            denominator = sums["num_tokens"]
        else:
            denominator = sums["num_sentences"]
        denominator = tf.maximum(denominator, 1.0)
        variables = self.trainable_variables
        grads = [g / tf.cast(denominator, g.dtype) for g in grads]
        grads = optimizers.add_l2_gradients(grads, variables, self.config.training.weight_decay,
                                            self._decayed_mask)
        stats = {"grad_norm": tf.linalg.global_norm(grads)}
        for transform in self.gradient_transforms:
            grads = transform(grads, variables, stats)
        skip = tf.logical_not(tf.math.is_finite(stats["grad_norm"]))
        if "skip_update" in stats:
            skip = tf.logical_or(skip, tf.cast(stats.pop("skip_update"), tf.bool))
        out = dict(sums)
        out.update(stats)
        out["learning_rate"] = tf.cast(self.optimizer.learning_rate, tf.float32)
        out["skip"] = skip
        if diagnostics:
            # ||dL/dh_1|| / ||dL/dh_N|| over the global batch (the denominator cancels).
            h1, hn = tf.sqrt(sums["h1_grad_sq"]), tf.sqrt(sums["hn_grad_sq"])
            out["grad_norm_ratio"] = h1 / tf.maximum(hn, 1e-30)
            out["grad_norm_h1"] = h1 / denominator
            out["grad_norm_hN"] = hn / denominator
        return grads, out

    def _apply_replica(self, grads):
        self.optimizer.apply(grads, self.trainable_variables)

    def _train_step(self, iterator, diagnostics=False):
        if self.accumulation_steps > 1:
            accumulate = functools.partial(self._accumulate_replica, diagnostics=diagnostics)
            for _ in tf.range(self.accumulation_steps - 1):
                self.strategy.run(accumulate, args=(next(iterator),))
        reduce = functools.partial(self._reduce_replica, diagnostics=diagnostics)
        grads, outputs = self.strategy.run(reduce, args=(next(iterator),))
        # The metrics are identical across replicas (computed after the all-reduce).
        outputs = tf.nest.map_structure(
            lambda x: self.strategy.experimental_local_results(x)[0], outputs)

        # The optimizer's cross-replica update (merge_call) cannot sit inside control flow in
        # replica context, so the skip decision is taken here, around a second strategy.run.
        def apply():
            self.strategy.run(self._apply_replica, args=(grads,))
            return tf.constant(0.0)

        outputs["skipped"] = tf.cond(outputs.pop("skip"), lambda: tf.constant(1.0), apply)
        self.step.assign_add(1)
        self.data_position.assign_add(self.accumulation_steps)
        self.skipped_updates.assign_add(tf.cast(outputs["skipped"], tf.int64))
        return outputs

    def train_step(self, iterator, diagnostics: bool = False) -> Dict[str, tf.Tensor]:
        """One update from ``k`` micro-batches of a distributed iterator (see the module doc).

        Args:
          iterator: from :meth:`make_train_iterator`.
          diagnostics: also compute Bapna et al.'s grad-norm ratio
            ``||dL/dh_1|| / ||dL/dh_N||`` (first and top encoder layer outputs, over the
            global batch); the update is the same either way.

        Returns:
          The update's metrics (float32 scalars): the sums ``loss_sum``, ``nll_sum``,
          ``num_tokens``, ``num_sentences``, ``source_tokens`` over the global batch,
          ``grad_norm`` (before clipping), ``learning_rate`` (of this update), ``skipped``, the
          gradient transforms' statistics and, with ``diagnostics``, ``grad_norm_ratio``,
          ``grad_norm_h1`` and ``grad_norm_hN``.
        """
        return self._train_step_fn(iterator, bool(diagnostics))

    # ------------------------------------------------------------------------------------
    # Data
    # ------------------------------------------------------------------------------------

    def _dataset_fn(self, skip: int):
        def dataset_fn(input_context):
            dataset = self.build_train_dataset(input_context)
            if skip:
                per_pipeline = (input_context.num_replicas_in_sync //
                                max(input_context.num_input_pipelines, 1))
                dataset = dataset.skip(skip * per_pipeline)
            return dataset

        return dataset_fn

    def make_train_iterator(self):
        """An iterator over the training data, positioned after ``data_position``.

        A resumed run sees the same batches as an uninterrupted one:

        * by default, and whenever the iterator cannot be checkpointed (distributed iterators,
          datasets with Python ops such as ``from_generator``), the ``data_position``
          micro-batches consumed before the checkpoint are read again and dropped (about 100
          demo-config batches/s on 2 CPU cores);
        * with ``checkpoint_iterator=True`` under the default strategy, the ``tf.data``
          iterator is saved in the checkpoints (``data_iterator``) and restored from them.
        """
        position = int(self.data_position.numpy())

        def make(skip=0):
            return iter(self.strategy.distribute_datasets_from_function(self._dataset_fn(skip)))

        if self.checkpoint_iterator:
            restored = self._restored_iterator(make) if position else None
            iterator = make() if restored is None else restored
            if compat.is_trackable(iterator):
                if position and restored is None:
                    logging.info("Re-reading the %d training micro-batches consumed before "
                                 "the checkpoint", position)
                    _advance(iterator, tf.constant(position, tf.int64))
                self.checkpoint_saver.set_checkpoint(
                    tf.train.Checkpoint(**self._checkpoint_items, data_iterator=iterator))
                return iterator
        if position:
            logging.info("Skipping the %d training micro-batches consumed before the checkpoint",
                         position)
        return make(position)

    def _restored_iterator(self, make):
        """The data iterator restored from the latest checkpoint, or None if it has none."""
        latest = self.checkpoint_saver.latest_checkpoint
        if not latest or not ckpt_lib.has_object(latest, "data_iterator"):
            return None
        iterator = make()
        try:
            tf.train.Checkpoint(data_iterator=iterator).restore(latest).expect_partial()
        except (tf.errors.OpError, ValueError, AssertionError) as e:
            logging.warning("Cannot restore the training data iterator from %s (%s); re-reading "
                            "the consumed batches instead", latest, str(e).splitlines()[0])
            return None
        logging.info("Restored the training data iterator from %s", latest)
        return iterator

    # ------------------------------------------------------------------------------------
    # Loop
    # ------------------------------------------------------------------------------------

    def _writer(self, name: str):
        if name not in self._writers:
            if self.is_chief:
                self._writers[name] = tf.summary.create_file_writer(
                    os.path.join(self.model_dir, name))
            else:
                self._writers[name] = tf.summary.create_noop_writer()
        return self._writers[name]

    def save_checkpoint(self) -> Optional[str]:
        """Writes a checkpoint numbered by the current step (every worker must call it)."""
        try:
            path = self.checkpoint_saver.save()
        except tf.errors.FailedPreconditionError as e:
            if self.checkpoint_saver.checkpoint is self.checkpoint:
                raise
            logging.warning("The training data iterator cannot be checkpointed (%s); a resumed "
                            "run will re-read the consumed batches instead",
                            str(e).splitlines()[0])
            self.checkpoint_saver.set_checkpoint(self.checkpoint)
            path = self.checkpoint_saver.save()
        if path:
            logging.info("Saved checkpoint %s", path)
        return path

    def train(self, hooks: Sequence[TrainHook] = (), max_steps: Optional[int] = None) -> Dict:
        """Trains until ``training.train_steps`` (or ``max_steps``) updates.

        Args:
          hooks: callables ``hook(trainer, step, logs)`` run after each step (after its
            logging, checkpoint and evaluation).  ``logs``: the step's metrics
            (:meth:`train_step`) plus ``loss`` and ``nll`` per target token, and ``eval_*``
            after an evaluation.
          max_steps: stop earlier (a checkpoint and an evaluation are made there as at the end).

        Returns:
          The last logged training metrics (averages over the last ``log_every`` steps) and the
          last evaluation (``eval_*`` keys); empty if there was nothing to do.
        """
        t = self.config.training
        last = min(t.train_steps, max_steps) if max_steps else t.train_steps
        step = int(self.step.numpy())
        if step >= last:
            logging.info("Nothing to do: step %d >= %d", step, last)
            return {}
        iterator = self.make_train_iterator()
        writer = self._writer("train")
        window = _LogWindow()
        summary: Dict[str, float] = {}
        logging.info("Training from step %d to %d (%d replica(s), %d micro-batch(es) per update)",
                     step, last, self.strategy.num_replicas_in_sync, self.accumulation_steps)
        ratio_every = t.grad_norm_ratio_every
        while step < last:
            diagnostics = bool(ratio_every) and (step + 1) % ratio_every == 0
            try:
                out = self.train_step(iterator, diagnostics=diagnostics)
            except tf.errors.OutOfRangeError:
                raise RuntimeError("the training dataset ended; it must repeat forever") from None
            logs = {k: float(v.numpy()) for k, v in out.items()}
            step += 1
            tokens = max(logs["num_tokens"], 1.0)
            logs["loss"], logs["nll"] = logs["loss_sum"] / tokens, logs["nll_sum"] / tokens
            if logs["skipped"]:
                logging.warning("Step %d: update skipped (gradient norm %g)", step,
                                logs["grad_norm"])
            ratio = {k: logs.pop(k) for k in diagnostics_lib.RATIO_KEYS if k in logs}
            if ratio:
                metrics.write_scalars(writer, step, ratio)
                logging.info("step %d: grad-norm ratio %.4g (|dL/dh_1| %.4g, |dL/dh_N| %.4g)",
                             step, ratio["grad_norm_ratio"], ratio["grad_norm_h1"],
                             ratio["grad_norm_hN"])
            window.add(logs)
            logs.update(ratio)
            if step % t.log_every == 0 or step == last:
                summary = window.summary()
                summary["skipped_updates"] = float(self.skipped_updates.numpy())
                metrics.write_scalars(writer, step, {**summary, **self.model_diagnostics()})
                logging.info("step %d/%d: loss %.4f (nll %.4f, ppl %.2f), lr %.3e, |g| %.3f, "
                             "%.0f tok/s%s", step, last, summary["loss"], summary["nll"],
                             summary["perplexity"], summary["learning_rate"],
                             summary["grad_norm"], summary["tokens_per_second"],
                             f", {window.skipped} skipped" if window.skipped else "")
                window = _LogWindow()
            if step % (t.diagnostics_every or t.log_every) == 0 or step == last:
                start = time.perf_counter()
                self.write_diagnostics(writer, step)
                window.exclude(time.perf_counter() - start)
            if step % t.checkpoint_every == 0 or step == last:
                start = time.perf_counter()
                self.save_checkpoint()
                window.exclude(time.perf_counter() - start)
            if t.eval_every and (step % t.eval_every == 0 or step == last):
                start = time.perf_counter()
                results = {f"eval_{k}": v for k, v in self.evaluate().items()}
                logs.update(results)
                summary.update(results)
                window.exclude(time.perf_counter() - start)
            for hook in hooks:
                hook(self, step, logs)
        return summary

    # ------------------------------------------------------------------------------------
    # Evaluation and diagnostics
    # ------------------------------------------------------------------------------------

    def model_diagnostics(self) -> Dict[str, float]:
        """The model's learned mixing weights as named scalars (logged with the training logs).

        From ``model.diagnostic_weights()`` when the model has it:
        ``transparent_attention/decoder_layer_{j}/source_{i}`` (Bapna et al. Fig. 4; source 0 is
        the embedding output) and ``{encoder,decoder}_dlcl/row_{l}/input_{k}`` (``k <= l``:
        row ``l`` feeds layer ``l + 1``; Wang et al. Fig. 5).
        """
        if not hasattr(self.model, "diagnostic_weights"):
            return {}
        out = {}
        for name, matrix in self.model.diagnostic_weights().items():
            matrix = np.asarray(keras.ops.convert_to_numpy(matrix))
            if name == "transparent_attention":
                for i, j in np.ndindex(*matrix.shape):
                    out[f"{name}/decoder_layer_{j}/source_{i}"] = float(matrix[i, j])
            else:
                for i, j in np.ndindex(*matrix.shape):
                    if j <= i:
                        out[f"{name}/row_{i}/input_{j}"] = float(matrix[i, j])
        return out

    def write_diagnostics(self, writer, step: int) -> None:
        """Every ``training.diagnostics_every`` steps (default ``log_every``), chief only: the
        heatmaps of the mixing matrices (``weights/...``,
        :func:`~deep_nmt_tf.training.diagnostics.write_weight_images`) and, with lexical
        shortcuts, the mean gates per layer on a fixed batch (``gates/...``; the first dev
        batch, else the first training micro-batch)."""
        if not self.is_chief:
            return
        diagnostics_lib.write_weight_images(writer, step, self.model)
        if not diagnostics_lib.has_shortcut_gates(self.model):
            return
        if self._gate_batch is None:
            dataset = self.build_eval_dataset()
            if dataset is None:
                dataset = self.build_train_dataset(None)
            batch = next(iter(dataset))
            self._gate_batch = {k: tf.cast(batch[k], tf.int32)
                                for k in ("source_ids", "target_input_ids")}
            self._gates_fn = tf.function(
                lambda s, t: self.model.lexical_shortcut_gates(
                    {"source_ids": s, "target_input_ids": t}, training=False))
        gates = diagnostics_lib.shortcut_gate_scalars(self.model, self._gate_batch,
                                                      gates_fn=self._gates_fn)
        metrics.write_scalars(writer, step, gates)

    def evaluate(self, write_summaries: bool = True) -> Dict[str, float]:
        """Dev loss, NLL, perplexity and (``training.eval_bleu``) greedy BLEU.

        The loss is the label-smoothed per-token loss (comparable with the training loss);
        ``nll``/``perplexity`` are unsmoothed.  With lexical shortcuts, the mean gates on the
        first dev batch are written to TensorBoard too (``gates/...``).  BLEU (sacreBLEU, detokenised greedy output
        against the dev set's raw ``target_text``) is computed when the batches carry
        ``target_text``.  Returns an empty dict when there is no dev set.
        """
        dataset = self.build_eval_dataset()
        if dataset is None:
            return {}
        start = time.perf_counter()
        t = self.config.training
        d = self.config.decoding
        totals = np.zeros(4)
        hypotheses: List[str] = []
        references: List[str] = []
        gates: Dict[str, float] = {}
        for i, batch in enumerate(dataset):
            if i == 0:
                gates = diagnostics_lib.shortcut_gate_scalars(self.model, batch)
            sums = self._eval_sums_fn({k: batch[k] for k in _BATCH_KEYS})
            totals += [float(sums.loss), float(sums.nll), float(sums.num_tokens),
                       float(sums.num_sentences)]
            if t.eval_bleu and "target_text" in batch:
                source_ids = tf.cast(batch["source_ids"], tf.int32)
                max_length = metrics.max_decoding_length(source_ids, d.max_length_a,
                                                         d.max_length_b)
                hypotheses.extend(self.detokenize(self._greedy_fn(source_ids, max_length).numpy()))
                references.extend(x.decode("utf-8") for x in batch["target_text"].numpy())
        tokens = max(totals[2], 1.0)
        results = {"loss": totals[0] / tokens, "nll": totals[1] / tokens,
                   "perplexity": math.exp(min(totals[1] / tokens, 100.0))}
        if references:
            results["bleu"] = metrics.corpus_bleu(hypotheses, references)
        results = {k: float(v) for k, v in results.items()}
        step = int(self.step.numpy())
        if write_summaries:
            metrics.write_scalars(self._writer("eval"), step, {**results, **gates})
        logging.info("eval at step %d: %s (%.1fs)", step,
                     ", ".join(f"{k} {v:.4f}" for k, v in results.items()),
                     time.perf_counter() - start)
        return results
