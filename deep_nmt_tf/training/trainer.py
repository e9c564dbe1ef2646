"""The trainer: one update of the custom loop (TensorFlow backend, ``tf.distribute``).

:class:`Trainer` implements the runner's declared interface
(:class:`~deep_nmt_tf.training.interface.TrainerInterface`: :meth:`~Trainer.train_step`,
:meth:`~Trainer.checkpoint_items`, the counters) and the dev-evaluation one
(:class:`~deep_nmt_tf.training.interface.DevEvaluation`).  Its model, loss, schedule,
optimizer settings and weight-decay rule are the task's (:class:`deep_nmt_tf.task.
TranslationTask`, shared with ``compile``/``fit``); the trainer adds what the custom loop does
with them: the data (:meth:`~Trainer.prepare`, :meth:`~Trainer.build_train_dataset`,
:meth:`~Trainer.build_eval_dataset`), distribution, accumulation, gradient transforms and
mixed precision.  Subclass and override a ``build_*`` method (or :meth:`~Trainer.prepare`) to
swap a component (the tests train a stand-in model that way).  The runner
(:mod:`deep_nmt_tf.training.runner`) builds it and owns everything around the step; the
trainer knows nothing of the runner.

One update (:meth:`~Trainer.train_step`), with ``k = training.gradient_accumulation_steps``
micro-batches and ``n`` replicas:

1. each replica runs forward and backward on its micro-batch and keeps the gradient of the
   loss *numerator* (the summed per-token losses, :func:`~deep_nmt_tf.task.losses.
   cross_entropy_sums`) and the denominators (target tokens, sentences); over the first
   ``k - 1`` micro-batches they are added into replica-local accumulators;
2. gradients and sums are all-reduced (summed) across replicas, once per update;
3. the summed gradient is divided by the global denominator (tokens or sentences:
   ``training.loss_normalization``), so ``k`` micro-batches on ``n`` replicas give the same
   update as one batch holding all of them;
4. L2 weight decay adds ``wd * w`` (:mod:`~deep_nmt_tf.training.optimizers`); the global norm is
   computed; the gradient transforms run (``training.clip_norm``: global-norm clipping, and any
   added with ``gradient_transforms=``);
5. Adam applies the update (:func:`~deep_nmt_tf.training.adaptive_clipping.
   apply_gradients_if`), unless the norm is not finite or a transform asked to skip it; a
   skipped update is counted (``skipped_updates``) and leaves the weights and Adam's state alone.

``training.precision`` picks the model's dtype policy; ``mixed_float16`` multiplies the loss by
a dynamic loss scale before step 1 and divides it out with the denominator in step 3
(:mod:`~deep_nmt_tf.training.precision`): an overflow is a non-finite norm, skipped as above and
also counted in ``overflow_updates``; the scale is updated after each update.

The learning-rate schedule reads ``optimizer.iterations`` (updates applied); ``step`` counts
update attempts, skipped ones included; ``data_position`` counts the micro-batches consumed.
"""

from __future__ import annotations

import functools
import logging as py_logging
from typing import Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat
from deep_nmt_tf.checkpointing import model_trackable
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.run_dir import RunDir
from deep_nmt_tf.task import LossSums, TranslationTask, build_optimizer
from deep_nmt_tf.training import optimizers, precision
from deep_nmt_tf.training import warm_start as warm_start_lib
from deep_nmt_tf.training.adaptive_clipping import apply_gradients_if
from deep_nmt_tf.training.diagnostics import RATIO_KEYS
from deep_nmt_tf.training.gradient_transforms import TRANSFORM_ITEM_PREFIX
from deep_nmt_tf.training.strategy import distributed_iterator, is_chief

__all__ = ["Trainer"]


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


def _quiet_expected_retracing(*names: str) -> None:
    """Silences TensorFlow's retracing warnings for functions whose names contain one of
    ``names`` (``training.static_shapes`` traces its step once per batch shape on purpose)."""
    _EXPECTED_RETRACING.names.update(names)
    py_logging.getLogger("tensorflow").addFilter(_EXPECTED_RETRACING)  # Added once at most.
    logging.info("training.static_shapes: the step is traced once per batch shape (one per "
                 "length bucket), so the first updates are slower")


def _densify(grad, variable):
    if grad is None:
        return tf.zeros(variable.shape, dtype=variable.dtype)
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


class Trainer:
    """Builds a model, its optimizer and data, and runs one update at a time.

    Construction prepares the data (:meth:`prepare`: corpus and vocabulary in the run
    directory; ``config`` becomes the resolved config) and builds the model, optimizer and
    counters inside the strategy scope.  The runner (:class:`~deep_nmt_tf.training.runner.
    Runner`) constructs it (a trainer class is a trainer factory) and restores, warm-starts,
    checkpoints and drives it.

    Args:
      config: the validated :class:`~deep_nmt_tf.config.Config`.
      run_dir: the run directory (a path or :class:`~deep_nmt_tf.run_dir.RunDir`), where
        :meth:`prepare` puts the data and the vocabulary.
      strategy: a ``tf.distribute.Strategy`` (default: the default strategy); see
        :func:`deep_nmt_tf.training.strategy.make_strategy`.
      gradient_transforms: extra :class:`~deep_nmt_tf.training.optimizers.GradientTransform`s,
        run after the ones the config asks for.

    Example:
      >>> from deep_nmt_tf.training import Runner
      >>> cfg = load_config("configs/demo.yaml", overrides=["training.train_steps=100"])
      >>> Runner(cfg, "/tmp/demo").run()        # builds a Trainer and trains it
    """

    #: The sums of a step's metrics (added up over a log window, not averaged).
    SUM_KEYS = ("loss_sum", "nll_sum", "num_tokens", "num_sentences", "source_tokens",
                "h1_grad_sq", "hn_grad_sq")

    def __init__(self, config: Config, run_dir,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 gradient_transforms: Sequence[optimizers.GradientTransform] = ()):
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError("deep_nmt_tf.training needs the TensorFlow Keras backend "
                               f"(KERAS_BACKEND={keras.backend.backend()!r})")
        self.run_dir = RunDir(run_dir)
        self.model_dir = self.run_dir.path
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = is_chief(self.strategy)
        self.tokenizer = None
        self.config = self.prepare(config)
        if self.config.model.vocab_size <= 0:
            raise ConfigError(f"{self.config.source}: model.vocab_size is still 0 after data "
                              "preparation")
        t = self.config.training
        self.task = TranslationTask(self.config)
        self.accumulation_steps = self.task.accumulation_steps
        self._warned_unused = False
        keras.utils.set_random_seed(t.seed)

        with self.strategy.scope():
            self.model = self.build_model()
            self._trainable_variables = warm_start_lib.trainable_variables(self.model,
                                                                           self.config)
            self.schedule = self.task.build_schedule(self.strategy.num_replicas_in_sync)
            compat.check_optimizer_all_reduce_hook()
            self.optimizer = build_optimizer(self.config, self.schedule,
                                             optimizer_class=optimizers.ReducedGradientsAdam)
            self.loss_scaling = None
            if precision.uses_loss_scaling(t.precision):
                self.loss_scaling = precision.LossScaling(self.optimizer)
                self.loss_scaling.build(self.trainable_variables)
            else:
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
            # Set at SIGTERM/Ctrl-C (by the loop); summed with the update (not checkpointed).
            self.stop_requested = tf.Variable(0.0, name="stop_requested", trainable=False,
                                              aggregation=counter["aggregation"])
            self._grad_accumulators = []
            self._sum_accumulator = None
            if self.accumulation_steps > 1:
                local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM)
                self._grad_accumulators = [
                    tf.Variable(tf.zeros(v.shape, v.dtype), name="grad_accumulator", **local)
                    for v in self.trainable_variables]
                self._sum_accumulator = tf.Variable(tf.zeros([len(self.SUM_KEYS)]),
                                                    name="sum_accumulator", **local)
        self._decayed_mask = self.task.decayed_mask(self.trainable_variables)
        if t.grad_norm_ratio_every and not (hasattr(self.model, "encode") and
                                            hasattr(self.model, "decode")):
            raise ConfigError(f"{self.config.source}: training.grad_norm_ratio_every: the model "
                              f"{type(self.model).__name__} has no encode()/decode() to "
                              "differentiate the encoder layer outputs")

        compute = self._compute_gradients
        if t.jit_compile:
            compute = tf.function(compute, jit_compile=True, reduce_retracing=True)
        self._compute_gradients_fn = compute
        self._train_step_fn = tf.function(self._train_step)
        # training.static_shapes: micro-batches taken from the iterator eagerly, each one call
        # of a function traced once per batch shape (bucket bound), retracing unreported.
        self._per_shape = t.static_shapes
        # ... and with the grad-norm ratio, every update takes the diagnostic step (the same
        # update; its two extra squared norms are cheap: BENCHMARKS.md), reported only on the
        # ratio's updates: one trace per shape instead of two, each holding its own memory.
        self._diagnose_always = t.static_shapes and bool(t.grad_norm_ratio_every)
        if self._per_shape:
            _quiet_expected_retracing("Trainer._update_batch", "Trainer._accumulate_batch")
        self._accumulate_fn = tf.function(self._accumulate_batch)
        self._update_fn = tf.function(self._update_batch)

    # ------------------------------------------------------------------------------------
    # Components (override in a subclass to swap one)
    # ------------------------------------------------------------------------------------

    def prepare(self, config: Config) -> Config:
        """Prepares the data (corpus, vocabulary) and returns the resolved config.

        The default checks that a training corpus is configured, runs
        :func:`deep_nmt_tf.data.prepare_data` in the run directory and loads the tokenizer.
        """
        from deep_nmt_tf.config import require_training_data
        from deep_nmt_tf.data import build_tokenizer, prepare_data

        require_training_data(config)
        config = prepare_data(config, self.run_dir)
        self.tokenizer = build_tokenizer(config)
        return config

    def build_model(self) -> keras.Model:
        """The model (built: its variables exist) in the ``training.precision`` dtype policy;
        called inside the strategy scope."""
        return self.task.build_model()

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
        """Greedy output ids ``[B, L]`` (padded) -> text, for BLEU."""
        return [t.decode("utf-8") for t in self.tokenizer.detokenize(ids).numpy()]

    @property
    def trainable_variables(self) -> List:
        """The variables that are trained (and that the optimizer and accumulators track)."""
        return self._trainable_variables

    def checkpoint_items(self) -> Dict[str, object]:
        """What a training checkpoint holds (:mod:`deep_nmt_tf.checkpointing`): the model,
        the optimizer, the counters and the gradient transforms' state."""
        items = dict(model=model_trackable(self.model), optimizer=self.optimizer,
                     step=self.step, skipped_updates=self.skipped_updates,
                     data_position=self.data_position)
        for i, transform in enumerate(self.gradient_transforms):
            for name, obj in transform.checkpoint_items().items():
                items[f"{TRANSFORM_ITEM_PREFIX}{i}_{name}"] = obj
        if self.loss_scaling is not None:
            items.update(self.loss_scaling.checkpoint_items())
        return items

    # ------------------------------------------------------------------------------------
    # Loss and gradients
    # ------------------------------------------------------------------------------------

    def compute_loss(self, batch: Dict[str, tf.Tensor], training: bool) -> LossSums:
        """Forward pass and loss sums of one (per-replica) batch (the task's loss)."""
        logits = self.model({"source_ids": batch["source_ids"],
                             "target_input_ids": batch["target_input_ids"]}, training=training)
        return self.task.loss_sums(logits, batch["target_output_ids"])

    def _diagnostic_loss(self, batch):
        """``compute_loss`` (training) through ``encode``/``decode``, also returning the first
        and the top encoder layer outputs (``layer_outputs[1]`` and ``[-1]``)."""
        encoded = self.model.encode(batch["source_ids"], training=True)
        outputs = encoded.get("layer_outputs") if isinstance(encoded, dict) else None
        if not outputs or len(outputs) < 2:
            raise ValueError("training.grad_norm_ratio_every needs a model whose encode() "
                             "returns 'layer_outputs' (embedding output + one per layer)")
        logits = self.model.decode(encoded, batch["target_input_ids"], training=True)
        sums = self.task.loss_sums(logits, batch["target_output_ids"])
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
            loss = sums.loss if self.loss_scaling is None else self.loss_scaling.scale(sums.loss)
        grads = tape.gradient(loss, list(variables) + watched)
        grads, watched_grads = grads[:len(variables)], grads[len(variables):]
        unused = [getattr(v, "path", v.name) for g, v in zip(grads, variables) if g is None]
        if unused and not self._warned_unused:  # Runs while tracing.
            self._warned_unused = True
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

    def _update_replica(self, batch, diagnostics):
        """Replica context: last micro-batch, all-reduce, normalise, transform, apply.

        Returns the update's metrics (identical on every replica).
        """
        grads, vector = self._compute_gradients_fn(batch, diagnostics)
        if self._grad_accumulators:
            grads = [g + acc.read_value() for g, acc in zip(grads, self._grad_accumulators)]
            vector = vector + self._sum_accumulator.read_value()
            for acc in self._grad_accumulators:
                acc.assign(tf.zeros_like(acc))
            self._sum_accumulator.assign(tf.zeros_like(self._sum_accumulator))
        # A stop request travels with the sums, so every worker sees it after this update.
        vector = tf.concat([vector, [self.stop_requested.read_value()]], 0)
        ctx = tf.distribute.get_replica_context()
        grads, vector = ctx.all_reduce(tf.distribute.ReduceOp.SUM, (grads, vector))
        sums = dict(zip(self.SUM_KEYS, tf.unstack(vector)))  # The request is the last entry.
        if self.config.training.loss_normalization == "token":
            denominator = sums["num_tokens"]
        else:
            denominator = sums["num_sentences"]
        denominator = tf.maximum(denominator, 1.0)
        variables = self.trainable_variables
        if self.loss_scaling is not None:  # float16: unscale before clipping and the norm
            denominator = denominator * self.loss_scaling.current_scale()
        grads = [g / tf.cast(denominator, g.dtype) for g in grads]
        grads = optimizers.add_l2_gradients(grads, variables, self.task.weight_decay,
                                            self._decayed_mask)
        stats = {"grad_norm": tf.linalg.global_norm(grads)}
        for transform in self.gradient_transforms:
            grads = transform(grads, variables, stats)
        skip = tf.logical_not(tf.math.is_finite(stats["grad_norm"]))
        overflow = skip
        if "skip_update" in stats:
            skip = tf.logical_or(skip, tf.cast(stats.pop("skip_update"), tf.bool))
        out = dict(sums, stop_requested=vector[-1])
        out.update(stats)
        out["learning_rate"] = tf.cast(self.optimizer.learning_rate, tf.float32)
        if diagnostics:
            # ||dL/dh_1|| / ||dL/dh_N|| over the global batch (the denominator cancels).
            h1, hn = tf.sqrt(sums["h1_grad_sq"]), tf.sqrt(sums["hn_grad_sq"])
            out["grad_norm_ratio"] = h1 / tf.maximum(hn, 1e-30)
            out["grad_norm_h1"] = h1 / denominator
            out["grad_norm_hN"] = hn / denominator
        applied = apply_gradients_if(tf.logical_not(skip), self.optimizer, grads, variables)
        out["skipped"] = 1.0 - tf.cast(applied, tf.float32)
        if self.loss_scaling is not None:
            out["overflow"] = tf.cast(overflow, tf.float32)
            out["loss_scale"] = self.loss_scaling.current_scale()
        return out

    def _train_step(self, iterator, diagnostics=False):
        if self.accumulation_steps > 1:
            for _ in tf.range(self.accumulation_steps - 1):
                self._accumulate_batch(next(iterator), diagnostics)
        return self._update_batch(next(iterator), diagnostics)

    def _accumulate_batch(self, batch, diagnostics=False):
        accumulate = functools.partial(self._accumulate_replica, diagnostics=diagnostics)
        self.strategy.run(accumulate, args=(batch,))

    def _update_batch(self, batch, diagnostics=False):
        update = functools.partial(self._update_replica, diagnostics=diagnostics)
        outputs = self.strategy.run(update, args=(batch,))
        # The metrics are identical across replicas (computed after the all-reduce).
        outputs = tf.nest.map_structure(
            lambda x: self.strategy.experimental_local_results(x)[0], outputs)
        self.step.assign_add(1)
        self.data_position.assign_add(self.accumulation_steps)
        self.skipped_updates.assign_add(tf.cast(outputs["skipped"], tf.int64))
        if self.loss_scaling is not None:
            self.loss_scaling.update(outputs["overflow"] > 0)
            outputs["overflow_updates"] = tf.cast(self.loss_scaling.overflow_updates,
                                                  tf.float32)
        return outputs

    def train_step(self, iterator, diagnostics: bool = False) -> Dict[str, tf.Tensor]:
        """One update from ``k`` micro-batches of a distributed iterator (see the module doc).

        Args:
          iterator: from :meth:`distributed_iterator` (the runner positions it: :meth:`~deep_nmt_tf.
            training.runner.Runner.make_train_iterator`).
          diagnostics: also compute Bapna et al.'s grad-norm ratio
            ``||dL/dh_1|| / ||dL/dh_N||`` (first and top encoder layer outputs, over the
            global batch); the update is the same either way. With ``training.static_shapes``
            and ``training.grad_norm_ratio_every`` every update computes it (one trace per
            batch shape) and it is returned only when asked for.

        Returns:
          The update's metrics (float32 scalars): the sums ``loss_sum``, ``nll_sum``,
          ``num_tokens``, ``num_sentences``, ``source_tokens`` over the global batch,
          ``grad_norm`` (before clipping), ``learning_rate`` (of this update), ``skipped``, the
          gradient transforms' statistics, with ``diagnostics`` ``grad_norm_ratio``,
          ``grad_norm_h1`` and ``grad_norm_hN``, and with float16 loss scaling ``loss_scale``
          (the scale this step used), ``overflow`` (1.0: the step overflowed and was skipped)
          and ``overflow_updates`` (skipped overflow steps so far).
        """
        diagnostics = bool(diagnostics)
        if not self._per_shape:
            return self._train_step_fn(iterator, diagnostics)
        traced = diagnostics or self._diagnose_always
        for _ in range(self.accumulation_steps - 1):
            self._accumulate_fn(next(iterator), traced)
        out = self._update_fn(next(iterator), traced)
        return out if diagnostics else {k: v for k, v in out.items() if k not in RATIO_KEYS}

    # ------------------------------------------------------------------------------------
    # Data distribution
    # ------------------------------------------------------------------------------------

    def distributed_iterator(self, skip: int = 0):
        """An iterator over the training data distributed by the strategy (one pipeline per
        worker), after dropping the first ``skip`` micro-batches."""
        return distributed_iterator(self.strategy, self.build_train_dataset, skip,
                                    autotune=self.config.data.autotune)
