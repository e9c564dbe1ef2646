"""Diagnostics of the deep-network methods that the trainer computes and logs (TensorFlow).

* Bapna et al. (2018)'s **grad-norm ratio** ``r_t = ||dL/dh_1|| / ||dL/dh_N||`` (``h_1``: the
  first encoder layer's output, ``h_N``: the top layer's raw output, i.e.
  ``model.encode(...)["layer_outputs"][1]`` and ``[-1]``).  The trainer computes it inside its
  training step every ``training.grad_norm_ratio_every`` steps (same tape, same batch, same
  update; see :mod:`deep_nmt_tf.training.trainer`); :func:`grad_norm_ratio` here is the direct
  computation on one batch (tests, notebooks).
* The **learned mixing matrices** (``model.diagnostic_weights()``: transparent attention
  ``[N+1, M]`` (Bapna et al. Fig. 4), DLCL ``[L+1, L+1]`` per stack (Wang et al. Fig. 5)) as
  TensorBoard heatmap images (:func:`write_weight_images`); each entry is also logged as a
  scalar by the trainer (:meth:`~deep_nmt_tf.training.Trainer.model_diagnostics`).
* The **mean lexical-shortcut gates** per layer (Emelin et al. section 4 and appendix) on a fixed
  batch (:func:`shortcut_gate_scalars`).

Reading the logs back and drawing the papers' figures, and the layer probe of Emelin et al.
(Fig. 6-7) on a trained model, are analysis, not training: :mod:`deep_nmt_tf.analysis`.

TensorBoard tags written here: ``weights/transparent_attention``, ``weights/encoder_dlcl``,
``weights/decoder_dlcl`` (images: rows = sources (embedding first) / DLCL rows, columns =
decoder layers / DLCL inputs; viridis colours between the matrix's min and max, named in the
image description; white = masked DLCL entries) and ``gates/{encoder,decoder}/layer_{i}/
{self,cross}/{key,value}`` (scalars).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import tensorflow as tf

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
    from deep_nmt_tf.task.losses import cross_entropy_sums

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
