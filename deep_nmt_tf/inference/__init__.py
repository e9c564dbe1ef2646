"""Translation in process (TensorFlow): a run directory loaded, sentences batched on the host.

* :mod:`.translator`: :func:`load_run` (config, vocabulary, tokenizer, checkpoint of a run
  directory: what inference and export start from), :class:`Translator` (length-sorted
  batches, n-best lists, results in chunks, progress), :class:`Hypothesis`,
  :func:`length_batches` (the batching by length, for any host that batches);
* :mod:`.searches`: the translator's compiled searches, one export module
  (:class:`deep_nmt_tf.export.module.TranslationModule`) per set of search options, and the
  search cache of earlier processes.

The search options are :class:`deep_nmt_tf.decoding.SearchOptions`; the source preparation and
the compiled search are the export module's (:mod:`deep_nmt_tf.export.module`), so what is
translated here is what a SavedModel serves.
"""

from deep_nmt_tf.inference.translator import (Hypothesis, LoadedRun, Translator,
                                              build_tokenizer, length_batches, load_run)

__all__ = ["Hypothesis", "LoadedRun", "Translator", "build_tokenizer", "length_batches",
           "load_run"]
