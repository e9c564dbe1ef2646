"""Benchmarks (``deep-nmt-benchmark``): a workflow over the library, with explicit arguments.

* :mod:`.presets`: the peer harness's model presets and shapes, the FLOPs of a training step;
* :mod:`.training`: :func:`~deep_nmt_tf.benchmark.training.benchmark_train` (tokens/s and peak
  memory of the real trainer's steps) and :func:`~deep_nmt_tf.benchmark.training.
  benchmark_configs` (each configuration in a process of its own);
* :mod:`.decoding`: :func:`~deep_nmt_tf.benchmark.decoding.benchmark_decode` (generated
  tokens/s of greedy and beam search, in process and through a SavedModel);
* :mod:`.pipeline`: :func:`~deep_nmt_tf.benchmark.pipeline.benchmark_pipeline` (a run's
  training ``tf.data`` pipeline alone: tokens per wall and per CPU second).

``tools/benchmark.py`` only parses the flags for these functions and prints their results.
Nothing in the core package imports this one (a test checks).
"""

from deep_nmt_tf.benchmark.presets import (BASE_OVERRIDES, DEFAULT_CONFIGS, PRESETS,
                                           config_overrides, train_flops_per_step)

__all__ = ["BASE_OVERRIDES", "DEFAULT_CONFIGS", "PRESETS", "config_overrides",
           "train_flops_per_step"]
