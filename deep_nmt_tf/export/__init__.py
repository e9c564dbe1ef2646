"""SavedModel export (TF Serving): the export module and what writes it.

* :mod:`deep_nmt_tf.export.module`: :class:`TranslationModule`, pre-process -> search ->
  post-process as ``tf.function`` s (tokenizer + model + compiled search; Model Garden's
  export-module shape); its :func:`~deep_nmt_tf.export.module.prepare_source` is the one source
  preparation, which in-process translation batches with too;
* :mod:`deep_nmt_tf.export.saved_model`: ``export_saved_model`` / ``export_model_dir`` write
  ``EXPORT_DIR/<version>/`` with ``serving_default``, ``translate_with_options`` and
  ``translate_ids`` signatures;
* :mod:`deep_nmt_tf.export.search_cache`: traced searches kept on disk, run by a later process
  without building the model or tracing (``Translator.from_model_dir(search_cache=...)``);
* :mod:`deep_nmt_tf.export.ctranslate2` (``deep-nmt-export --format=ctranslate2``) and
  :mod:`deep_nmt_tf.export.ctranslate2_translator`: a plain Transformer converted to a
  CTranslate2 model directory, and text translation with it (the optional ``ctranslate2``
  package; not imported here).

Translation in process (a run directory, host-side batching, n-best lists) is
:mod:`deep_nmt_tf.inference`; the search options, :class:`deep_nmt_tf.decoding.SearchOptions`;
the decoding-speed benchmark, :mod:`deep_nmt_tf.benchmark` (``deep-nmt-benchmark
--mode=decode``).

Scoring (sacreBLEU, checkpoint windows) is TensorFlow-free: :mod:`deep_nmt_tf.decoding.scoring`.
Run directories (config, vocabulary, checkpoint listing) are :mod:`deep_nmt_tf.run_dir`; which
checkpoint is meant, and averaging, :class:`deep_nmt_tf.checkpoints.CheckpointStore`.  Nothing
here imports ``deep_nmt_tf.training``.
"""

from deep_nmt_tf.export.module import TranslationModule, default_jit_compile, prepare_source
from deep_nmt_tf.export.saved_model import (SIGNATURES, export_model_dir, export_saved_model,
                                            load_saved_model, next_version)

__all__ = [
    "SIGNATURES",
    "export_model_dir",
    "export_saved_model",
    "load_saved_model",
    "next_version",
    "TranslationModule",
    "default_jit_compile",
    "prepare_source",
]
