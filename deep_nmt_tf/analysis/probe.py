"""The layer probe of Emelin et al. (2019, appendix A.3, Fig. 6-7): lexical content per layer.

For a trained model and a parallel data set, the mean over all non-padding tokens of
``cos(y_0, y_l)`` at the same position, for every layer l of the encoder and of the decoder
(teacher-forced on the target side), where ``y_0`` is the embedding output (scaled token
embedding plus positions: the layer-0 input and the lexical shortcuts' source) and ``y_l``
layer l's raw output.  With lexical shortcuts the hidden states need to carry less of the
embedding, so the similarity drops faster.

* :func:`layer_states`, :func:`cosine_sums`, :class:`CosineProbe`: the computation on a model
  and batches;
* :func:`probe_model` / :func:`probe_models`: on model directories (latest or given checkpoint,
  the config's test set by default, else its dev set);
* :func:`format_table`, :func:`plot_probe`, :func:`save_results`: the text table, the figure
  (``cosine_similarity.png``) and the JSON (``cosine_similarity.json``) that
  ``deep-nmt-probe-layers`` prints and writes.

The decoder's states come from the decoder itself
(``TransformerDecoder(..., return_layer_outputs=True)``); they are reported for Transformer
decoders only.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.models.transformer import TransformerDecoder

__all__ = [
    "layer_states",
    "cosine_sums",
    "CosineProbe",
    "probe_model",
    "probe_models",
    "format_table",
    "plot_probe",
    "save_results",
]


def layer_states(model, source_ids, target_input_ids=None) -> Dict[str, List[tf.Tensor]]:
    """Every layer's states, inference mode: ``{"encoder": [y_0 .. y_N], "decoder": [y_0 ..
    y_M]}`` (``y_0``: the embedding output, scaled embedding plus positions; ``y_l``: layer l's
    raw output).  ``"decoder"`` is present when ``target_input_ids`` is given and the decoder is
    a Transformer stack."""
    source_ids = tf.cast(source_ids, tf.int32)
    encoded = model.encode(source_ids, training=False)
    out = {"encoder": list(encoded["layer_outputs"])}
    if target_input_ids is not None and isinstance(getattr(model, "decoder", None),
                                                   TransformerDecoder):
        _, decoder = model.decode(encoded, tf.cast(target_input_ids, tf.int32), training=False,
                                  return_layer_outputs=True)
        out["decoder"] = list(decoder)
    return out


def cosine_sums(model, source_ids, target_input_ids=None):
    """Per stack, the sums over non-padding positions of ``cos(y_0, y_l)`` for every layer l,
    and the number of positions: ``({"encoder": [N+1], "decoder": [M+1]}, {"encoder": n, ...})``
    float32 tensors.  A layer whose width differs from the embedding's gives NaN."""
    source_ids = tf.cast(source_ids, tf.int32)
    states = layer_states(model, source_ids, target_input_ids)
    masks = {"encoder": tf.not_equal(source_ids, PAD_ID)}
    if "decoder" in states:  # BOS at position 0 is a real token; padding is 0.
        masks["decoder"] = tf.not_equal(tf.cast(target_input_ids, tf.int32), PAD_ID)
    sums, counts = {}, {}
    for stack, values in states.items():
        mask = tf.cast(masks[stack], tf.float32)
        reference = tf.math.l2_normalize(tf.cast(values[0], tf.float32), axis=-1)
        per_layer = []
        for state in values:
            if state.shape[-1] != values[0].shape[-1]:
                per_layer.append(tf.constant(np.nan, tf.float32))
                continue
            state = tf.math.l2_normalize(tf.cast(state, tf.float32), axis=-1)
            per_layer.append(tf.reduce_sum(tf.reduce_sum(reference * state, axis=-1) * mask))
        sums[stack] = tf.stack(per_layer)
        counts[stack] = tf.reduce_sum(mask)
    return sums, counts


class CosineProbe:
    """Mean cosine similarity between the embedding output and each layer's state at the same
    position, over the non-padding tokens of a data set (Emelin et al. 2019, appendix A.3,
    Fig. 6-7: how much of the lexical representation the hidden states still carry).

    ``y_0`` is the embedding output (scaled token embedding plus positions, the layer-0 input
    and the lexical shortcuts' source), ``y_l`` layer l's raw output; the decoder runs with
    teacher forcing.  Inference mode (no dropout).

    Example::

        probe = CosineProbe(model)
        for batch in dataset:
            probe.update(batch)
        probe.result()  # {"encoder": [1.0, c_1, .., c_N], "decoder": [1.0, .., c_M]}

    ``probe.tokens``: the positions averaged over per stack.  Layers whose width differs from
    the embedding's (a bidirectional RNMT+ encoder) give NaN; the decoder appears only for a
    Transformer decoder.

    Args:
      model: a built model (``encode`` with ``layer_outputs``).
      compile: run each batch in a ``tf.function`` (one trace, dynamic shapes).
    """

    def __init__(self, model, compile: bool = True):
        self.model = model
        self.sums: Dict[str, np.ndarray] = {}
        self.tokens: Dict[str, float] = collections.defaultdict(float)
        fn = lambda s, t: cosine_sums(model, s, t)  # noqa: E731
        self._fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None], tf.int32)] * 2
                               ) if compile else fn

    def update(self, batch: Mapping[str, tf.Tensor]) -> None:
        source_ids = tf.cast(batch["source_ids"], tf.int32)
        target_ids = tf.cast(batch["target_input_ids"], tf.int32)
        sums, counts = self._fn(source_ids, target_ids)
        for stack in sums:
            self.sums[stack] = self.sums.get(stack, 0.0) + sums[stack].numpy().astype(np.float64)
            self.tokens[stack] += float(counts[stack])

    def result(self) -> Dict[str, List[float]]:
        return {stack: [float(x) for x in sums / max(self.tokens[stack], 1.0)]
                for stack, sums in self.sums.items()}


# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Model directories
# --------------------------------------------------------------------------------------------


def _data_paths(config, source: Optional[str], target: Optional[str]):
    if bool(source) != bool(target):
        raise ValueError("--source and --target must be given together")
    if source:
        return source, target
    for split in ("test", "dev"):
        s, t = getattr(config.data, f"{split}_source"), getattr(config.data, f"{split}_target")
        if s and t and os.path.exists(s) and os.path.exists(t):
            return s, t
    raise ValueError("no --source/--target given and the model config has no test or dev set "
                     "on disk")


def probe_model(model_dir: str, source: Optional[str] = None, target: Optional[str] = None,
                checkpoint: Optional[str] = None, max_sentences: int = 1000,
                batch_size: int = 32, overrides: Sequence[str] = ()) -> Dict:
    """The per-layer mean cosine similarities of one model directory (module docstring).

    Args:
      model_dir: ``config.yaml``, vocabulary and checkpoints.
      source, target: aligned text files (default: the config's test set, else its dev set).
      checkpoint: checkpoint prefix (default: the latest).
      max_sentences: use the first N pairs (0: all).
      batch_size: sentences per batch.
      overrides: config overrides ``KEY=VALUE``.

    Returns:
      ``{"encoder": [..], "decoder": [..], "tokens": {...}, "checkpoint": path,
      "source": path, "target": path, "sentences": n}``.
    """
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.data.pipeline import make_eval_dataset
    from deep_nmt_tf.data.tokenizers import build_tokenizer
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.run_dir import RunDir

    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    source, target = _data_paths(config, source, target)
    tokenizer = build_tokenizer(config, run_dir.vocab_path(config))
    model = build_model(config)
    path = CheckpointStore(run_dir).restore_model(model, checkpoint)  # default: the latest
    dataset = make_eval_dataset(config, tokenizer, source, target, batch_size,
                                max_sentences=max_sentences)
    probe = CosineProbe(model)
    sentences = 0
    for batch in dataset:
        probe.update(batch)
        sentences += int(batch["source_ids"].shape[0])
    result = probe.result()
    result.update(tokens=dict(probe.tokens), checkpoint=path, source=source, target=target,
                  sentences=sentences)
    return result


def probe_models(model_dirs: Sequence[str], labels: Optional[Sequence[str]] = None,
                 **kwargs) -> Dict[str, Dict]:
    """:func:`probe_model` of every model directory: ``{label: result}`` in the given order.

    ``labels`` default to the directory names and must be distinct; ``kwargs`` are
    :func:`probe_model`'s (``checkpoint`` only with a single model).
    """
    model_dirs = list(model_dirs)
    labels = list(labels) if labels else [os.path.basename(os.path.normpath(d))
                                          for d in model_dirs]
    if len(labels) != len(model_dirs):
        raise ValueError(f"{len(labels)} labels for {len(model_dirs)} model directories")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {labels}")
    if kwargs.get("checkpoint") and len(model_dirs) > 1:
        raise ValueError("--checkpoint needs a single model directory")
    return {label: probe_model(d, **kwargs) for label, d in zip(labels, model_dirs)}


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def format_table(results: Mapping[str, Dict]) -> str:
    """A text table: one row per layer, one column per (model, stack)."""
    columns = [(label, stack) for label, r in results.items()
               for stack in ("encoder", "decoder") if stack in r]
    depth = max(len(results[label][stack]) for label, stack in columns)
    names = [f"{label} {stack}" for label, stack in columns]
    widths = [max(len(n), 7) for n in names]
    lines = ["layer  " + "  ".join(n.rjust(w) for n, w in zip(names, widths))]
    for layer in range(depth):
        cells = []
        for (label, stack), w in zip(columns, widths):
            values = results[label][stack]
            value = values[layer] if layer < len(values) else None
            cells.append(("" if value is None else
                          "nan" if math.isnan(value) else f"{value:.4f}").rjust(w))
        name = "emb" if layer == 0 else str(layer)
        lines.append(name.ljust(5) + "  " + "  ".join(cells))
    return "\n".join(lines)


def plot_probe(results: Mapping[str, Dict], path: str, dpi: int = 120) -> str:
    """Encoder and decoder panels: cosine similarity against layer, one curve per model."""
    from deep_nmt_tf.analysis.figures import pyplot

    plt = pyplot()
    stacks = [s for s in ("encoder", "decoder") if any(s in r for r in results.values())]
    fig, axes = plt.subplots(1, len(stacks), figsize=(5.2 * len(stacks), 4), squeeze=False)
    for ax, stack in zip(axes[0], stacks):
        for label, r in results.items():
            if stack in r:
                ax.plot(range(len(r[stack])), r[stack], marker="o", label=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer (0 = embedding output)")
        ax.set_ylabel("mean cosine similarity to the embeddings")
        ax.set_title(stack)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Lexical content per layer (Emelin et al. 2019, Fig. 6-7)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def save_results(results: Mapping[str, Dict], output_dir: str) -> List[str]:
    """Writes ``cosine_similarity.json`` and ``cosine_similarity.png`` into ``output_dir``
    (created if needed); returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    json_path = os.path.join(output_dir, "cosine_similarity.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    png_path = plot_probe(results, os.path.join(output_dir, "cosine_similarity.png"))
    return [json_path, png_path]
