"""SavedModel export for TensorFlow Serving: raw text in, translations out.

``export_saved_model`` writes ``EXPORT_DIR/<version>/`` (the layout TF Serving watches: a
directory of integer versions, the highest one served) with three signatures:

``serving_default``
    inputs ``text``: ``[B]`` string (UTF-8 source sentences);
    outputs ``translations`` ``[B]`` string, ``scores`` ``[B]`` float32 (length-penalised
    log-probability), ``nbest_translations`` ``[B, N]`` string, ``nbest_scores`` ``[B, N]``
    float32 (``N = decoding.n_best``).  Beam size, length penalty and length limits are the
    config's ``decoding`` section at export time.
``translate_with_options``
    inputs ``text`` ``[B]`` string, ``beam_size`` int32 scalar (1 to 64), ``length_penalty``
    float32 scalar (finite, >= 0); outputs ``translations`` ``[B]``, ``scores`` ``[B]``.  An
    option out of range (a NaN or infinite length penalty included) fails the request with
    ``InvalidArgumentError`` naming it; nothing is clamped.
``translate_ids``
    input ``source_ids`` ``[B, S]`` int32 (token ids, right-padded with 0; ``<s>``/``</s>``
    are ignored, ids outside the vocabulary read as ``[UNK]``); outputs ``ids`` ``[B, N, L]``
    int32 (without ``</s>``, padded with 0), ``lengths`` ``[B, N]``, ``scores`` ``[B, N]``,
    ``log_probs`` ``[B, N]``.

Tokenisation and detokenisation are tensorflow-text ops inside the graph (WordPiece or
SentencePiece, the run's ``data.tokenizer``; a SentencePiece model is held in the SavedModel
itself), so a client only
needs ``import tensorflow, tensorflow_text`` (the ops must be registered before loading):

    import tensorflow as tf, tensorflow_text  # noqa: F401
    m = tf.saved_model.load("export/1")
    m.signatures["serving_default"](text=tf.constant(["Hello."]))["translations"]

Beside the SavedModel, ``assets.extra/`` holds the config (``config.yaml``) and the export's
facts (``deep_nmt.json``: the inference ``precision`` and ``jit_compile``, and from
``deep-nmt-export`` the reason they were chosen).

Empty, whitespace-only and over-long inputs (truncated to ``decoding.max_input_length``
tokens) give a possibly empty translation, never an error.  With ``jit_compile`` (the default
except for bfloat16 on a CPU-only machine) the search is an XLA cluster: TF Serving must run with
``--xla_cpu_compilation_enabled=true`` (``docs/SERVING.md``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Optional, Sequence

import tensorflow as tf
from absl import logging

from deep_nmt_tf.config import save_config
from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.export.module import TranslationModule
from deep_nmt_tf.run_dir import RunDir

__all__ = ["SIGNATURES", "METADATA_FILE", "next_version", "export_saved_model",
           "export_model_dir", "load_saved_model"]

SIGNATURES = ("serving_default", "translate_with_options", "translate_ids")
#: The export's own facts, in ``<version>/assets.extra/``: ``precision``, ``jit_compile``.
METADATA_FILE = "deep_nmt.json"


def next_version(export_dir: str) -> int:
    """1 + the largest integer version under ``export_dir`` (1 if there is none)."""
    if not tf.io.gfile.isdir(export_dir):
        return 1
    versions = [int(n) for n in tf.io.gfile.listdir(export_dir)
                if re.fullmatch(r"\d+", n.rstrip("/"))]
    return max(versions, default=0) + 1


def export_saved_model(module: TranslationModule, export_dir: str,
                       version: Optional[int] = None, overwrite: bool = False,
                       config=None, metadata: Optional[Dict[str, Any]] = None) -> str:
    """Writes ``module`` as ``EXPORT_DIR/<version>/`` (module docstring).

    The SavedModel is written to a temporary sibling directory and renamed into place, so a
    TF Serving instance watching ``export_dir`` never sees a half-written version.

    Args:
      module: a :class:`~deep_nmt_tf.export.module.TranslationModule` (with restored
        weights).
      export_dir: the base directory.
      version: integer version (default :func:`next_version`).
      overwrite: replace an existing version directory.
      config: the model's config, saved as ``assets.extra/config.yaml`` for reference.
      metadata: more entries of ``assets.extra/deep_nmt.json``, which always holds the
        inference ``precision`` (the model's compute dtype) and ``jit_compile``.

    Returns:
      The version directory.
    """
    if version is None:
        version = next_version(export_dir)
    version = int(version)
    if version < 0:
        raise ValueError(f"version must be a non-negative integer, got {version}")
    target = os.path.join(export_dir, str(version))
    if tf.io.gfile.exists(target):
        if not overwrite:
            raise FileExistsError(f"{target} exists (pass overwrite=True / --overwrite, or "
                                  "another --version)")
    tf.io.gfile.makedirs(export_dir)
    signatures = {
        "serving_default": module.translate_text,
        "translate_with_options": module.translate_text_with_options,
        "translate_ids": module.translate_ids,
    }
    tmp = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=export_dir)
    try:
        tf.saved_model.save(module, tmp, signatures=signatures)
        if config is not None:
            save_config(config, os.path.join(tmp, "assets.extra", "config.yaml"))
        info = {"precision": str(module.model.dtype_policy.compute_dtype),
                "jit_compile": bool(module.jit_compile), **(metadata or {})}
        tf.io.gfile.makedirs(os.path.join(tmp, "assets.extra"))
        with open(os.path.join(tmp, "assets.extra", METADATA_FILE), "w",
                  encoding="utf-8") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        if tf.io.gfile.exists(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logging.info("Exported SavedModel to %s (signatures: %s)", target, ", ".join(signatures))
    return target


def export_model_dir(model_dir: str, export_dir: Optional[str] = None,
                     checkpoint: Optional[str] = None,
                     version: Optional[int] = None, overrides: Sequence[str] = (),
                     jit_compile: Optional[bool] = None, overwrite: bool = False,
                     precision: str = "float32",
                     metadata: Optional[Dict[str, Any]] = None) -> str:
    """Loads a model directory (config, vocabulary, checkpoint) and exports it.

    Args:
      model_dir: trainer (or average_checkpoints) output directory.
      export_dir: base export directory; the SavedModel goes to ``export_dir/<version>``
        (default: the run directory's ``exports/``).
      checkpoint: a checkpoint, or a run directory (its latest); default the latest of
        ``model_dir`` (either kind: ``ckpt-N`` or ``fit``'s ``.weights.h5``).
      version: integer version (default: next free).
      overrides: config overrides, e.g. ``decoding.beam_size=8`` (baked into
        ``serving_default``).
      jit_compile: compile the search with XLA (faster in float32; TF Serving then needs
        ``--xla_cpu_compilation_enabled=true``).  None: XLA unless ``precision`` is bfloat16 and
        this machine has no GPU or TPU
        (:func:`~deep_nmt_tf.export.module.default_jit_compile`).
      overwrite: replace an existing version.
      precision: ``float32``, ``bfloat16`` or ``float16`` weights and activations
        (:func:`deep_nmt_tf.inference.load_run`); the signatures still take and return strings
        and float32 scores.
      metadata: more entries of ``assets.extra/deep_nmt.json`` (:func:`export_saved_model`;
        ``deep-nmt-export`` adds ``inference_settings``, why the precision and XLA setting
        were chosen).

    Returns:
      The version directory.
    """
    from deep_nmt_tf.inference.translator import load_run

    if export_dir is None:
        export_dir = RunDir(model_dir).export_dir
    run = load_run(model_dir, checkpoint, overrides, precision)
    d = run.config.decoding
    module = TranslationModule(run.build_model(), run.tokenizer, SearchOptions.from_config(d),
                               d.max_input_length, jit_compile=jit_compile)
    return export_saved_model(module, export_dir, version=version, overwrite=overwrite,
                              config=run.config, metadata=metadata)


def load_saved_model(path: str):
    """``tf.saved_model.load`` after registering the tensorflow-text ops."""
    import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

    return tf.saved_model.load(path)
