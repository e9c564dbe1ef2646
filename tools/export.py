r"""Exports a trained model as a SavedModel for TensorFlow Serving, or converts it to CTranslate2.

    deep-nmt-export --model_dir=runs/demo [--export_dir=export/demo] [--version=N] \
        [--checkpoint=runs/demo/ckpt-1500] [--override=decoding.beam_size=8] \
        [--nojit_compile] [--overwrite]
    deep-nmt-export --model_dir=runs/demo --format=ctranslate2 [--export_dir=ct2/demo] \
        [--checkpoint=...] [--overwrite]

``--format=ctranslate2`` writes a CTranslate2 model directory (``--export_dir`` itself, default
``MODEL_DIR/ctranslate2``; no versions) for a plain Transformer, and refuses the features
CTranslate2 cannot represent, naming them; it needs ``pip install ctranslate2``
(``deep_nmt_tf/export/ctranslate2.py``, ``docs/SERVING.md``).

Writes ``EXPORT_DIR/<version>/`` (default ``EXPORT_DIR``: ``MODEL_DIR/exports``; default
version: one more than the largest existing one, or 1) with the signatures ``serving_default``
(strings in, translations and scores out), ``translate_with_options`` (plus ``beam_size`` and
``length_penalty`` inputs) and ``translate_ids`` (token ids in and out); see
``deep_nmt_tf/export/saved_model.py`` and ``docs/SERVING.md``.  Decoding parameters are the
config's ``decoding`` section (after ``--override``).  Without ``--precision``/``--jit_compile``
the export takes the fastest setting for this machine
(:func:`deep_nmt_tf.hardware.fastest_inference_settings`, logged at INFO: bfloat16 without XLA
on a CPU with ``amx_bf16`` or ``avx512_bf16`` whose bfloat16 matmul is measured faster than
float32's, else float32) and records it in
``<version>/assets.extra/deep_nmt.json`` (``precision``, ``jit_compile``,
``inference_settings``): export on the kind of machine that will serve.  With XLA the search is
compiled by XLA when first called; TF Serving then needs ``--xla_cpu_compilation_enabled=true``.
"""

from __future__ import annotations

from typing import Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import JIT_COMPILE_FLAG, PRECISION_FLAG, define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "model_dir", None, "Model directory (config.yaml, checkpoints)."),
    (flags.DEFINE_string, "export_dir", None,
     "Base export directory (versions inside; default MODEL_DIR/exports)."),
    (flags.DEFINE_integer, "version", None, "Version number (default: next free)."),
    (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix (default: the latest)."),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. decoding.beam_size=8 (repeatable)."),
    JIT_COMPILE_FLAG,
    PRECISION_FLAG,
    (flags.DEFINE_bool, "overwrite", False, "Replace an existing version directory."),
    (flags.DEFINE_enum, "format", "saved_model", ["saved_model", "ctranslate2"],
     "saved_model: a SavedModel for TF Serving; ctranslate2: a CTranslate2 model directory "
     "(--export_dir, default MODEL_DIR/ctranslate2; needs pip install ctranslate2)."),
])


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required")
    if FLAGS.format == "ctranslate2":
        print(_export_ctranslate2())
        return
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.export.saved_model import export_model_dir

    try:
        precision, jit_compile, reason = cli.inference_settings(FLAGS.precision,
                                                                FLAGS.jit_compile)
        path = export_model_dir(FLAGS.model_dir, FLAGS.export_dir, checkpoint=FLAGS.checkpoint,
                                version=FLAGS.version, overrides=FLAGS.override,
                                jit_compile=jit_compile, overwrite=FLAGS.overwrite,
                                precision=precision, metadata={"inference_settings": reason})
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as e:
        raise SystemExit(f"export: error: {e}") from None
    print(path)


def _export_ctranslate2() -> str:
    """``--format=ctranslate2``: the SavedModel-only flags are refused, not ignored."""
    for name in ("version", "precision", "jit_compile"):
        if FLAGS[name].present:
            raise app.UsageError(
                f"--{name} applies to the SavedModel; a CTranslate2 model has no versions and "
                "is converted in float32 (choose int8/float16 when loading it: "
                "ctranslate2.Translator(path, compute_type='int8'))")
    from deep_nmt_tf.export.ctranslate2 import export_model_dir

    try:
        return export_model_dir(FLAGS.model_dir, FLAGS.export_dir, checkpoint=FLAGS.checkpoint,
                                overrides=FLAGS.override, overwrite=FLAGS.overwrite)
    except (ImportError, FileNotFoundError, FileExistsError, ValueError) as e:  # ConfigError too
        raise SystemExit(f"export: error: {e}") from None


def run() -> None:
    """Console-script entry point (``deep-nmt-export``)."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
