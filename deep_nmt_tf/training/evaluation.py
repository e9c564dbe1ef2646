"""What the runner measures besides the training step: dev evaluation and model diagnostics.

:class:`Evaluator` computes the dev loss, NLL, perplexity and, with ``training.eval_bleu``,
sacreBLEU of greedy decoding (case-insensitive when ``data.lowercase``: such a model cannot
produce case).  Greedy decoding is :meth:`deep_nmt_tf.decoding.SearchOptions.search`
with beam size 1 and the per-sentence length limit ``floor(a * n + b)`` of
``decoding.max_length_a`` / ``decoding.max_length_b`` (``n`` = source tokens), the search and
the rule that ``deep-nmt-translate`` and ``deep-nmt-evaluate`` use; it runs in a
``tf.function`` on the first device of the strategy.

:func:`model_diagnostics` and :func:`write_diagnostics` turn the model's learned mixing weights
and lexical-shortcut gates into TensorBoard scalars and images (``training.diagnostics_every``).

The runner (:mod:`deep_nmt_tf.training.runner`) builds both from its trainer: they read the
trainer's declared members (:mod:`deep_nmt_tf.training.interface`: ``model``, ``config`` and,
for dev evaluation and the gates' batch, the :class:`~deep_nmt_tf.training.interface.
DevEvaluation` ones ``compute_loss``, ``build_eval_dataset``, ``build_train_dataset``,
``detokenize``).
"""

from __future__ import annotations

import time
from typing import Dict, List

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from deep_nmt_tf.data.options import default_autotune
from deep_nmt_tf.decoding.scoring import corpus_bleu
from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.task import per_token_metrics
from deep_nmt_tf.training import diagnostics as diagnostics_lib
from deep_nmt_tf.training import metrics

__all__ = ["Evaluator", "greedy_ids", "model_diagnostics", "DiagnosticsWriter"]

_BATCH_KEYS = ("source_ids", "target_input_ids", "target_output_ids")


def greedy_ids(model, source_ids, decoding):
    """Greedy output ids ``[B, L]`` (``PAD_ID`` after the last token; no ``EOS``): the search
    options of the ``decoding`` section, greedy (:meth:`~deep_nmt_tf.decoding.SearchOptions.
    greedy`: beam 1, ``decoding.max_length_a/b``)."""
    return SearchOptions.from_config(decoding).greedy().search(model, source_ids)["ids"][:, 0]


class Evaluator:
    """Dev loss, NLL, perplexity and greedy BLEU of a trainer's model (module docstring).

    Args:
      trainer: the trainer (``model``, ``config``, ``compute_loss``, ``build_eval_dataset``,
        ``detokenize``).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self._sums_fn = tf.function(
            lambda batch: trainer.compute_loss(batch, training=False), reduce_retracing=True)
        # autograph=False, as the translator's: the search is keras.ops loops (nothing to
        # convert), and converting its modules took about 8 s of the first evaluation.
        self._greedy_fn = tf.function(
            lambda source_ids: greedy_ids(trainer.model, source_ids, trainer.config.decoding),
            input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)

    def has_dev_set(self) -> bool:
        """Whether the trainer has dev batches (``data.dev_source``/``dev_target``)."""
        return self.trainer.build_eval_dataset() is not None

    def __call__(self):
        """Evaluates on the dev set; returns ``(results, gates)`` (empty dicts without a dev
        set).

        ``results``: ``loss`` (the label-smoothed per-token loss, comparable with the training
        loss), ``nll`` and ``perplexity`` (unsmoothed) and, when ``training.eval_bleu`` and the
        batches carry ``target_text``, ``bleu`` (sacreBLEU of the detokenised greedy output
        against the raw references).  ``gates``: with lexical shortcuts, the mean gates on the
        first dev batch (``gates/...``).
        """
        trainer = self.trainer
        dataset = trainer.build_eval_dataset()
        if dataset is None:
            return {}, {}
        dataset = default_autotune(dataset, trainer.config.data.autotune)
        totals = np.zeros(4)
        hypotheses: List[str] = []
        references: List[str] = []
        gates: Dict[str, float] = {}
        for i, batch in enumerate(dataset):
            if i == 0:
                gates = diagnostics_lib.shortcut_gate_scalars(trainer.model, batch)
            sums = self._sums_fn({k: batch[k] for k in _BATCH_KEYS})
            totals += [float(sums.loss), float(sums.nll), float(sums.num_tokens),
                       float(sums.num_sentences)]
            if trainer.config.training.eval_bleu and "target_text" in batch:
                ids = self._greedy_fn(tf.cast(batch["source_ids"], tf.int32)).numpy()
                hypotheses.extend(trainer.detokenize(ids))
                references.extend(x.decode("utf-8") for x in batch["target_text"].numpy())
        results = per_token_metrics(totals[0], totals[1], totals[2])
        if references:
            results["bleu"] = corpus_bleu(hypotheses, references,
                                          lowercase=trainer.config.data.lowercase)
        return {k: float(v) for k, v in results.items()}, gates

    def evaluate(self, step: int, writer=None) -> Dict[str, float]:
        """:meth:`__call__`, logged (``eval at step N: ...``) and, given a TensorBoard
        ``writer``, written there with the gates."""
        start = time.perf_counter()
        results, gates = self()
        if not results:
            return {}
        if writer is not None:
            metrics.write_scalars(writer, step, {**results, **gates})
        logging.info("eval at step %d: %s (%.1fs)", step,
                     ", ".join(f"{k} {v:.4f}" for k, v in results.items()),
                     time.perf_counter() - start)
        return results


def model_diagnostics(model) -> Dict[str, float]:
    """The model's learned mixing weights as named scalars (logged with the training logs).

    From ``model.diagnostic_weights()`` when the model has it:
    ``transparent_attention/decoder_layer_{j}/source_{i}`` (Bapna et al. Fig. 4; source 0 is
    the embedding output) and ``{encoder,decoder}_dlcl/row_{l}/input_{k}`` (``k <= l``:
    row ``l`` feeds layer ``l + 1``; Wang et al. Fig. 5).
    """
    if not hasattr(model, "diagnostic_weights"):
        return {}
    out = {}
    for name, matrix in model.diagnostic_weights().items():
        matrix = np.asarray(keras.ops.convert_to_numpy(matrix))
        if name == "transparent_attention":
            for i, j in np.ndindex(*matrix.shape):
                out[f"{name}/decoder_layer_{j}/source_{i}"] = float(matrix[i, j])
        else:
            for i, j in np.ndindex(*matrix.shape):
                if j <= i:
                    out[f"{name}/row_{i}/input_{j}"] = float(matrix[i, j])
    return out


class DiagnosticsWriter:
    """Every ``training.diagnostics_every`` steps (default ``log_every``), chief only: the
    heatmaps of the mixing matrices (``weights/...``,
    :func:`~deep_nmt_tf.training.diagnostics.write_weight_images`) and, with lexical
    shortcuts, the mean gates per layer on a fixed batch (``gates/...``; the first dev batch,
    else the first training micro-batch).

    Args:
      trainer: the trainer (``model``, and ``build_eval_dataset``, ``build_train_dataset`` for
        the gates).
      chief: whether this worker writes (the others do nothing).
    """

    def __init__(self, trainer, chief: bool = True):
        self.trainer = trainer
        self.chief = chief
        self._batch = self._gates_fn = None

    def __call__(self, writer, step: int) -> None:
        trainer, model = self.trainer, self.trainer.model
        if not self.chief:
            return
        diagnostics_lib.write_weight_images(writer, step, model)
        if not diagnostics_lib.has_shortcut_gates(model):
            return
        if self._batch is None:
            dataset = trainer.build_eval_dataset()
            if dataset is None:
                dataset = trainer.build_train_dataset(None)
            batch = next(iter(default_autotune(dataset, trainer.config.data.autotune)))
            self._batch = {k: tf.cast(batch[k], tf.int32)
                           for k in ("source_ids", "target_input_ids")}
            self._gates_fn = tf.function(
                lambda s, t: model.lexical_shortcut_gates(
                    {"source_ids": s, "target_input_ids": t}, training=False))
        gates = diagnostics_lib.shortcut_gate_scalars(model, self._batch,
                                                      gates_fn=self._gates_fn)
        metrics.write_scalars(writer, step, gates)
