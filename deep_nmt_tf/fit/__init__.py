"""Training with Keras' own ``compile``/``fit``, on any backend (no TensorFlow needed).

The custom ``tf.distribute`` loop (:mod:`deep_nmt_tf.training`) stays the main route; this
package is for notebooks and for machines with only JAX (or PyTorch), e.g. a GPU machine
without TensorFlow:

* :mod:`.losses`: the label-smoothed cross-entropy in ``keras.ops`` (the custom loop's sums,
  and :class:`LabelSmoothedCrossEntropy` for ``compile``);
* :mod:`.schedules`, :mod:`.rnmt_schedule`: the learning-rate schedules and their registry
  (``deep_nmt_tf.training.schedules`` re-exports them);
* :mod:`.compiling`: :func:`compile_model` (loss, schedule, Adam, clipping, accumulation,
  weight decay from a config), :func:`check_fit_config` (what fit refuses, naming the key),
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

from deep_nmt_tf.fit.compiling import (UNSUPPORTED, build_fit_model, build_fit_optimizer,
                                       check_fit_config, compile_model, setup_distribution)
from deep_nmt_tf.fit.losses import (LabelSmoothedCrossEntropy, LossSums, cross_entropy_sums,
                                    loss_denominator)
from deep_nmt_tf.fit.schedules import (SCHEDULE_BUILDERS, UpdateCountSchedule, build_schedule,
                                       register_schedule)

__all__ = [
    "UNSUPPORTED",
    "build_fit_model",
    "build_fit_optimizer",
    "check_fit_config",
    "compile_model",
    "setup_distribution",
    "LabelSmoothedCrossEntropy",
    "LossSums",
    "cross_entropy_sums",
    "loss_denominator",
    "SCHEDULE_BUILDERS",
    "UpdateCountSchedule",
    "build_schedule",
    "register_schedule",
]
