"""TensorFlow-side translation and SavedModel export (TF Serving).

* :mod:`deep_nmt_tf.export.translator`: :class:`TranslationModule` (tokenizer + model + compiled
  search as ``tf.function`` s) and :class:`Translator` (model directories, length-sorted
  batching, n-best lists);
* :mod:`deep_nmt_tf.export.saved_model`: ``export_saved_model`` / ``export_model_dir`` write
  ``EXPORT_DIR/<version>/`` with ``serving_default``, ``translate_with_options`` and
  ``translate_ids`` signatures;
* :mod:`deep_nmt_tf.export.search_cache`: traced searches kept on disk, run by a later process
  without building the model or tracing (``Translator.from_model_dir(search_cache=...)``).

The decoding-speed benchmark is a tool: ``deep-nmt-benchmark --mode=decode``
(``deep_nmt_tf.tools.benchmark.benchmark_decode``).

Scoring (sacreBLEU, checkpoint windows) is TensorFlow-free: :mod:`deep_nmt_tf.decoding.scoring`.
Run directories (config, vocabulary, checkpoint listing) are :mod:`deep_nmt_tf.run_dir`; which
checkpoint is meant, and averaging, :class:`deep_nmt_tf.checkpoints.CheckpointStore`.  Nothing
here imports ``deep_nmt_tf.training``.
"""

from deep_nmt_tf.export.saved_model import (SIGNATURES, export_model_dir, export_saved_model,
                                            load_saved_model, next_version)
from deep_nmt_tf.export.translator import Hypothesis, TranslationModule, Translator

__all__ = [
    "SIGNATURES",
    "export_model_dir",
    "export_saved_model",
    "load_saved_model",
    "next_version",
    "Hypothesis",
    "TranslationModule",
    "Translator",
]
