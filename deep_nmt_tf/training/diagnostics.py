"""Diagnostics of the deep-network methods: what the papers plot, computed and logged in TF.

* Bapna et al. (2018)'s **grad-norm ratio** ``r_t = ||dL/dh_1|| / ||dL/dh_N||`` (``h_1``: the
  first encoder layer's output, ``h_N``: the top layer's raw output, i.e.
  ``model.encode(...)["layer_outputs"][1]`` and ``[-1]``).  The trainer computes it inside its
  training step every ``training.grad_norm_ratio_every`` steps (same tape, same batch, same
  update; see :mod:`deep_nmt_tf.training.trainer`); :func:`grad_norm_ratio` here is the direct
  computation on one batch (tests, notebooks, :mod:`tools.probe_layers`).
* The **learned mixing matrices** (``model.diagnostic_weights()``: transparent attention
  ``[N+1, M]`` (Bapna et al. Fig. 4), DLCL ``[L+1, L+1]`` per stack (Wang et al. Fig. 5)) as
  TensorBoard heatmap images (:func:`write_weight_images`); each entry is also logged as a
  scalar by the trainer (:meth:`~deep_nmt_tf.training.Trainer.model_diagnostics`).
* The **mean lexical-shortcut gates** per layer (Emelin et al. section 4 and appendix) on a fixed
  batch (:func:`shortcut_gate_scalars`).
* The **layer probe** of Emelin et al. Fig. 6-7: mean cosine similarity between the embedding
  output and every layer's states, encoder and decoder (:func:`layer_states`,
  :class:`CosineProbe`).
* :func:`read_run` reads a run directory's TensorBoard event files back (scalars and images)
  (``tf.data.TFRecordDataset`` + ``Event`` protos; the ``tensorboard`` package is not needed);
  ``tools/plot_diagnostics.py`` draws the papers' figures from it.

TensorBoard tags written here: ``weights/transparent_attention``, ``weights/encoder_dlcl``,
``weights/decoder_dlcl`` (images: rows = sources (embedding first) / DLCL rows, columns =
decoder layers / DLCL inputs; viridis colours between the matrix's min and max, named in the
image description; white = masked DLCL entries) and ``gates/{encoder,decoder}/layer_{i}/
{self,cross}/{key,value}`` (scalars).
"""

from __future__ import annotations

import collections
import glob
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from deep_nmt_tf.constants import PAD_ID

__all__ = [
    "IMAGE_PREFIX",
    "GATE_PREFIX",
    "RATIO_KEYS",
    "grad_norm_ratio",
    "weight_matrices",
    "weight_mask",
    "heatmap_rgb",
    "write_images",
    "write_weight_images",
    "has_shortcut_gates",
    "shortcut_gate_scalars",
    "layer_states",
    "cosine_sums",
    "CosineProbe",
    "RunData",
    "read_run",
    "event_files",
]

IMAGE_PREFIX = "weights"
GATE_PREFIX = "gates"
#: Scalars of the grad-norm-ratio diagnostic (the trainer's TensorBoard tags and log keys).
RATIO_KEYS = ("grad_norm_ratio", "grad_norm_h1", "grad_norm_hN")

# --------------------------------------------------------------------------------------------
# Grad-norm ratio (Bapna et al. 2018, section 2.3)
# --------------------------------------------------------------------------------------------


def grad_norm_ratio(model, batch: Mapping[str, tf.Tensor], label_smoothing: float = 0.1,
                    training: bool = True) -> Dict[str, float]:
    """``r_t`` of one batch, computed directly with a ``GradientTape``.

    The loss is the one the trainer differentiates (the label-smoothed per-token loss); the
    ratio does not depend on its normalisation.  ``grad_norm_h1`` / ``grad_norm_hN`` are the
    norms of the gradients of the per-token loss (the trainer's normalisation with
    ``training.loss_normalization: token``).

    Args:
      model: a model with ``encode`` (returning ``layer_outputs``) and ``decode``.
      batch: ``source_ids``, ``target_input_ids``, ``target_output_ids`` (``[B, *]`` int).
      label_smoothing: as ``training.label_smoothing``.
      training: run the model in training mode (dropout; the trainer's setting).

    Returns:
      ``{"grad_norm_ratio", "grad_norm_h1", "grad_norm_hN"}`` as floats.
    """
    from deep_nmt_tf.training.losses import cross_entropy_sums

    with tf.GradientTape() as tape:
        encoded = model.encode(batch["source_ids"], training=training)
        outputs = encoded["layer_outputs"]
        if len(outputs) < 2:
            raise ValueError("the grad-norm ratio needs at least one encoder layer")
        h1, hn = outputs[1], outputs[-1]
        logits = model.decode(encoded, batch["target_input_ids"], training=training)
        sums = cross_entropy_sums(logits, batch["target_output_ids"], label_smoothing)
    g1, gn = tape.gradient(sums.loss, [h1, hn])
    tokens = max(float(sums.num_tokens), 1.0)
    n1, nn = float(tf.norm(tf.cast(g1, tf.float32))), float(tf.norm(tf.cast(gn, tf.float32)))
    return {"grad_norm_ratio": n1 / max(nn, 1e-30), "grad_norm_h1": n1 / tokens,
            "grad_norm_hN": nn / tokens}


# --------------------------------------------------------------------------------------------
# Mixing-weight images
# --------------------------------------------------------------------------------------------

# Matplotlib's viridis at 9 evenly spaced points (interpolated linearly in between), so the
# training path needs no plotting library.
_VIRIDIS = np.array([
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]], np.float64)
_MASKED_RGB = (255, 255, 255)


def weight_matrices(model) -> Dict[str, np.ndarray]:
    """``model.diagnostic_weights()`` as float32 numpy arrays (empty dict if the model has none).
    """
    if not hasattr(model, "diagnostic_weights"):
        return {}
    out = {}
    for name, value in model.diagnostic_weights().items():
        value = value.numpy() if hasattr(value, "numpy") else value
        out[name] = np.asarray(value, np.float32)
    return out


def weight_mask(name: str, matrix: np.ndarray) -> np.ndarray:
    """Boolean mask of the meaningful entries: the lower triangle (with the diagonal) of a DLCL
    matrix (row l combines ``y_0 .. y_l``), everything for other matrices."""
    matrix = np.asarray(matrix)
    if name.endswith("dlcl") and matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1]:
        return np.tril(np.ones(matrix.shape, bool))
    return np.ones(matrix.shape, bool)


def heatmap_rgb(matrix, mask: Optional[np.ndarray] = None, cell_size: Optional[int] = None,
                vmin: Optional[float] = None, vmax: Optional[float] = None) -> np.ndarray:
    """A ``[H, W]`` matrix as a ``[H * c, W * c, 3]`` uint8 viridis heatmap (row 0 on top).

    Args:
      matrix: 2-D values.
      mask: True where an entry is shown; others are white.
      cell_size: pixels per entry (default: about 256 pixels for the longer side, 4 to 32).
      vmin, vmax: colour range (default: min and max of the shown entries).
    """
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"heatmap_rgb needs a 2-D matrix, got shape {matrix.shape}")
    mask = np.ones(matrix.shape, bool) if mask is None else np.asarray(mask, bool)
    shown = matrix[mask & np.isfinite(matrix)]
    lo = float(shown.min()) if vmin is None and shown.size else (vmin or 0.0)
    hi = float(shown.max()) if vmax is None and shown.size else (vmax if vmax is not None else 1.0)
    scaled = (matrix - lo) / (hi - lo) if hi > lo else np.full(matrix.shape, 0.5)
    scaled = np.clip(np.nan_to_num(scaled, nan=0.0), 0.0, 1.0) * (len(_VIRIDIS) - 1)
    low = np.floor(scaled).astype(int)
    high = np.minimum(low + 1, len(_VIRIDIS) - 1)
    frac = (scaled - low)[..., None]
    rgb = (1.0 - frac) * _VIRIDIS[low] + frac * _VIRIDIS[high]
    rgb[~mask] = _MASKED_RGB
    if cell_size is None:
        cell_size = int(np.clip(256 // max(matrix.shape), 4, 32))
    rgb = np.repeat(np.repeat(rgb, cell_size, axis=0), cell_size, axis=1)
    return np.round(rgb).astype(np.uint8)


def _image_metadata(description: str = ""):
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = "images"  # TensorBoard's image plugin, format version 0.
    meta.summary_description = description
    return meta


def write_images(writer, step: int, images: Mapping[str, np.ndarray],
                 descriptions: Optional[Mapping[str, str]] = None) -> None:
    """Writes ``[H, W, 3]`` uint8 images as TensorBoard image summaries and flushes.

    Writes what ``tf.summary.image`` writes (the image plugin's ``[width, height, png]``
    string tensor) with ``tf.summary.write``, which needs no ``tensorboard`` package (TF 2.21
    without it has no ``tf.summary.image``).
    """
    descriptions = descriptions or {}
    with writer.as_default(step=step):
        for tag, image in images.items():
            image = np.asarray(image, np.uint8)
            png = tf.io.encode_png(image)
            tensor = tf.stack([tf.as_string(image.shape[1]), tf.as_string(image.shape[0]), png])
            tf.summary.write(tag, tensor, metadata=_image_metadata(descriptions.get(tag, "")))
    writer.flush()


def write_weight_images(writer, step: int, model) -> List[str]:
    """Writes ``model``'s mixing matrices as heatmaps under ``weights/<name>``; returns the tags.

    The description of each image holds the colour range and the layout, e.g.
    ``"[21, 6] transparent_attention: rows = sources (0 = embedding), columns = decoder
    layers; viridis from 0.0412 to 0.0568"``.
    """
    layouts = {
        "transparent_attention": "rows = sources (0 = embedding output, i = encoder layer i), "
                                 "columns = decoder layers (attention modules)",
        "encoder_dlcl": "row l = input of layer l+1 (last row: stack output), column k = y_k "
                        "(0 = embedding output); white = masked",
        "decoder_dlcl": "row l = input of layer l+1 (last row: stack output), column k = y_k "
                        "(0 = embedding output); white = masked",
    }
    encoder = getattr(model, "encoder", None)
    if not getattr(encoder, "transparent_includes_embedding", True):
        layouts["transparent_attention"] = ("rows = encoder layers 1..N (the embedding is not a "
                                            "source), columns = attention modules")
    images, descriptions = {}, {}
    for name, matrix in weight_matrices(model).items():
        if matrix.ndim != 2:
            continue
        mask = weight_mask(name, matrix)
        shown = matrix[mask]
        tag = f"{IMAGE_PREFIX}/{name}"
        images[tag] = heatmap_rgb(matrix, mask)
        descriptions[tag] = (f"{list(matrix.shape)} {name}: {layouts.get(name, '')}; viridis "
                             f"from {shown.min():.4g} to {shown.max():.4g}")
    if images:
        write_images(writer, step, images, descriptions)
    return sorted(images)


# --------------------------------------------------------------------------------------------
# Lexical-shortcut gates
# --------------------------------------------------------------------------------------------


def has_shortcut_gates(model) -> bool:
    """Whether ``model`` has lexical-shortcut gates to report."""
    if not hasattr(model, "lexical_shortcut_gates"):
        return False
    lexical = getattr(getattr(model, "model_config", None), "lexical_shortcuts", None)
    return True if lexical is None else bool(lexical.enabled)


def shortcut_gate_scalars(model, batch: Mapping[str, tf.Tensor], gates_fn=None
                          ) -> Dict[str, float]:
    """Mean key/value gate per layer on ``batch`` (inference mode), as ``gates/...`` floats.

    ``gates_fn`` (optional): a compiled ``model.lexical_shortcut_gates``, called with
    ``(source_ids, target_input_ids)``.  Empty (and no forward pass) when the model has no
    lexical shortcuts.
    """
    if not has_shortcut_gates(model):
        return {}
    source_ids = tf.cast(batch["source_ids"], tf.int32)
    target_ids = tf.cast(batch["target_input_ids"], tf.int32)
    if gates_fn is None:
        gates = model.lexical_shortcut_gates(
            {"source_ids": source_ids, "target_input_ids": target_ids}, training=False)
    else:
        gates = gates_fn(source_ids, target_ids)
    return {f"{GATE_PREFIX}/{k}": float(v) for k, v in gates.items()}


# --------------------------------------------------------------------------------------------
# Layer probe (Emelin et al. 2019, Fig. 6-7)
# --------------------------------------------------------------------------------------------


def _decoder_layer_outputs(model, encoded, target_input_ids):
    """The decoder's ``[y_0 .. y_M]`` under teacher forcing (inference mode), or None.

    Runs the Transformer decoder's layers exactly as its ``call`` does (same memories, biases
    and shortcut sources), keeping every layer's raw output.
    """
    decoder = getattr(model, "decoder", None)
    if decoder is None or not hasattr(decoder, "run_layers") or not hasattr(decoder, "layers_"):
        return None
    from deep_nmt_tf.layers.attention import causal_bias, padding_bias

    memories = decoder._memories(model.decoder_memories(encoded, training=False))
    memory_embeddings = None
    if getattr(decoder, "cross_shortcuts", None) is not None:
        memory_embeddings = encoded["layer_outputs"][0]
    memory_bias = padding_bias(encoded["mask"])
    self_bias = causal_bias(tf.shape(target_input_ids)[1])

    def run_layer(i, layer, x, shortcut):
        return layer(x, memories[i], self_bias=self_bias, memory_bias=memory_bias,
                     training=False, shortcut=shortcut, memory_shortcut=memory_embeddings)

    _, outputs = decoder.run_layers(decoder.embed(target_input_ids, training=False), run_layer)
    return outputs


def layer_states(model, source_ids, target_input_ids=None) -> Dict[str, List[tf.Tensor]]:
    """Every layer's states, inference mode: ``{"encoder": [y_0 .. y_N], "decoder": [y_0 ..
    y_M]}`` (``y_0``: the embedding output, scaled embedding plus positions; ``y_l``: layer l's
    raw output).  ``"decoder"`` is present when ``target_input_ids`` is given and the decoder is
    a Transformer stack."""
    source_ids = tf.cast(source_ids, tf.int32)
    encoded = model.encode(source_ids, training=False)
    out = {"encoder": list(encoded["layer_outputs"])}
    if target_input_ids is not None:
        decoder = _decoder_layer_outputs(model, encoded, tf.cast(target_input_ids, tf.int32))
        if decoder is not None:
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
# Reading a run directory back
# --------------------------------------------------------------------------------------------


class RunData:
    """The summaries of one run directory.

    Attributes:
      scalars: ``{(subdir, tag): (steps, values)}`` numpy arrays sorted by step (the last value
        written at a step wins, e.g. after a resume).
      images: ``{(subdir, tag): (step, png_bytes, description)}``, the latest image per tag.
    """

    def __init__(self, path: str):
        self.path = path
        self.scalars: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray]] = {}
        self.images: Dict[Tuple[str, str], Tuple[int, bytes, str]] = {}

    def scalar(self, tag: str, subdirs: Sequence[str] = ("train", "eval")
               ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(steps, values)`` of ``tag`` from the first sub-directory that has it."""
        for sub in subdirs:
            if (sub, tag) in self.scalars:
                return self.scalars[(sub, tag)]
        return None

    def tags(self, prefix: str = "", subdir: Optional[str] = None) -> List[str]:
        return sorted({t for s, t in self.scalars
                       if t.startswith(prefix) and (subdir is None or s == subdir)})


def event_files(run_dir: str, subdir: str) -> List[str]:
    """The TensorBoard event files of ``run_dir/subdir`` (oldest first)."""
    return sorted(glob.glob(os.path.join(run_dir, subdir, "events.out.tfevents.*")))


def _tensor_value(value):
    if value.HasField("tensor"):
        return tf.make_ndarray(value.tensor)
    if value.HasField("simple_value"):
        return np.float32(value.simple_value)
    return None


def read_run(run_dir: str, subdirs: Sequence[str] = ("train", "eval")) -> RunData:
    """Reads the scalar and image summaries of a run directory (``MODEL_DIR/{train,eval}``).

    Reads the event records with ``tf.data.TFRecordDataset`` (what
    ``tf.compat.v1.train.summary_iterator`` does, without its deprecation warning); no
    ``tensorboard`` package needed.  A
    truncated last record (a run still writing) is tolerated.
    """
    from tensorflow.core.util import event_pb2

    data = RunData(run_dir)
    for sub in subdirs:
        points: Dict[str, Dict[int, float]] = collections.defaultdict(dict)
        kinds: Dict[str, str] = {}
        descriptions: Dict[str, str] = {}
        for path in event_files(run_dir, sub):
            try:
                for record in tf.data.TFRecordDataset(path):
                    event = event_pb2.Event.FromString(record.numpy())
                    for value in event.summary.value:
                        plugin = value.metadata.plugin_data.plugin_name
                        if plugin:
                            kinds[value.tag] = plugin
                        if value.metadata.summary_description:
                            descriptions[value.tag] = value.metadata.summary_description
                        kind = kinds.get(value.tag, "scalars")
                        array = _tensor_value(value)
                        if array is None:
                            continue
                        if kind == "images" or (array.dtype == object and array.size >= 3):
                            data.images[(sub, value.tag)] = (
                                int(event.step), bytes(array[2]), descriptions.get(value.tag, ""))
                        elif array.size == 1 and array.dtype != object:
                            points[value.tag][int(event.step)] = float(array.reshape(()))
            except tf.errors.DataLossError:
                pass
        for tag, by_step in points.items():
            steps = np.array(sorted(by_step), np.int64)
            data.scalars[(sub, tag)] = (steps, np.array([by_step[s] for s in steps], np.float64))
    return data
