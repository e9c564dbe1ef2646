"""Training with Keras' own ``compile``/``fit``, on any backend (no TensorFlow needed).

The custom ``tf.distribute`` loop (:mod:`deep_nmt_tf.training`) stays the main route; this
package is for notebooks and for machines with only JAX (or PyTorch), e.g. a GPU machine
without TensorFlow:

* the loss, the schedules, Adam and the weight-decay rule are the custom loop's, from the shared
  :class:`deep_nmt_tf.task.TranslationTask` (:mod:`deep_nmt_tf.task`);
* :mod:`.compiling`: :func:`compile_model` (the task's loss, schedule, Adam, clipping,
  accumulation, weight decay), :func:`check_fit_config` (what fit refuses, naming the key),
  :func:`setup_distribution` (``keras.distribution.DataParallel``);
* :mod:`.callbacks`: checkpoints in the run directory (``ckpt-N.weights.h5``, read by every
  tool) and progress;
* :mod:`.run`: :func:`train`, a whole run from a directory prepared by
  ``deep-nmt-preprocess`` (``deep-nmt-fit``).

Data: :class:`deep_nmt_tf.data.batching.TokenBatches` (the ``tf.data`` pipeline's token
batching as a ``keras.utils.PyDataset``) over :class:`deep_nmt_tf.data.token_ids.TokenIds`.

Example (a notebook; ``examples/quickstart.ipynb``)::

    from deep_nmt_tf import fit
    model = fit.build_fit_model(config)
    fit.compile_model(model, config)
    model.fit(TokenBatches.from_config(config, TokenIds.load(path), num_batches=100),
              epochs=3, shuffle=False)
"""

from deep_nmt_tf.fit.compiling import (UNSUPPORTED, build_fit_model, check_fit_config,
                                       compile_model, setup_distribution)

__all__ = [
    "UNSUPPORTED",
    "build_fit_model",
    "check_fit_config",
    "compile_model",
    "setup_distribution",
]
