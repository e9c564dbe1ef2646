"""Training throughput and memory: source+target tokens/s of full training steps of the real
trainer (forward, backward, all-reduce, Adam), after warm-up, at the shapes of the peer harness
(batch 64 sentences, source and target length 32, vocabulary 8000), and the process's peak
resident memory.

:func:`benchmark_train` measures one configuration in this process; :func:`benchmark_configs`
runs each configuration in its own process (``python -m deep_nmt_tf.benchmark.training``), so
that each peak memory is its own.  Training honours ``training.precision``; each result carries
``train_flops_per_step`` (:func:`~deep_nmt_tf.benchmark.presets.train_flops_per_step`), from
which BENCHMARKS.md derives the MFU.  The batches have fixed static shapes, as a run with
``training.static_shapes`` has per bucket; ``unknown_shapes`` gives the step the
``[None, None]`` batches of a run without it.

The trainer is built by the runner (:class:`deep_nmt_tf.training.Runner`) with a trainer class
whose data are fixed random batches; the timed call is the trainer's ``train_step``, the same
update the custom loop runs.  ``route="fit"`` times ``compile``/``fit``'s step instead
(``model.train_on_batch`` of the model and optimizer :mod:`deep_nmt_tf.fit.compiling` builds,
on the current Keras backend, on the same batches); ``skip_non_finite=False`` compiles it with
the bare Adam instead of :class:`~deep_nmt_tf.task.skipping.SkipNonFiniteUpdates`, to measure
what skipping costs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Sequence

from deep_nmt_tf.benchmark.presets import (BATCH, SRC_LEN, TGT_LEN, VOCAB, config_overrides,
                                           train_flops_per_step)

__all__ = ["benchmark_train", "benchmark_configs"]


def _trainer_class(unknown_shapes: bool):
    """The real trainer on fixed random batches (no corpus, no vocabulary)."""
    import numpy as np
    import tensorflow as tf

    from deep_nmt_tf.training import Trainer

    rng = np.random.default_rng(1)

    def batch():
        inputs, labels = _random_batch(rng)
        return {**inputs, "target_output_ids": labels}

    batches = [batch() for _ in range(4)]

    class BenchTrainer(Trainer):
        def prepare(self, cfg):
            return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                       vocab_size=VOCAB))

        def build_train_dataset(self, input_context):
            if unknown_shapes:  # the same batches, with the element spec of a real run
                spec = {k: tf.TensorSpec([None, None], tf.int32) for k in batches[0]}
                return tf.data.Dataset.from_generator(lambda: iter(batches),
                                                      output_signature=spec).repeat()
            return tf.data.Dataset.from_tensor_slices(
                {k: np.stack([b[k] for b in batches]) for k in batches[0]}).repeat()

        def build_eval_dataset(self):
            return None

    return BenchTrainer


def _random_batch(rng):
    """``({"source_ids", "target_input_ids"}, target_output_ids)``: random ids at the peer
    harness's shapes, targets starting with ``<s>``."""
    src = rng.integers(4, VOCAB, (BATCH, SRC_LEN), dtype="int32")
    tgt = rng.integers(4, VOCAB, (BATCH, TGT_LEN + 1), dtype="int32")
    tgt[:, 0] = 1
    return {"source_ids": src, "target_input_ids": tgt[:, :-1]}, tgt[:, 1:]


def _time_fit(config, steps: int, repeats: int, warmup: int, skip_non_finite: bool):
    """``(parameters, [seconds per repeat], optimizer class name)`` of fit's step."""
    import dataclasses

    import numpy as np

    from deep_nmt_tf.fit import compiling

    config = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                     vocab_size=VOCAB))
    model = compiling.build_fit_model(config)
    compiling.compile_model(model, config)
    if not skip_non_finite:
        model.compile(optimizer=model.optimizer.inner_optimizer, loss=model.loss,
                      jit_compile=model.jit_compile)
    rng = np.random.default_rng(1)
    batches = [_random_batch(rng) for _ in range(4)]
    for i in range(warmup):
        model.train_on_batch(*batches[i % 4])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            float(model.train_on_batch(*batches[i % 4]))  # (returns the loss: synchronised)
        times.append(time.perf_counter() - start)
    return int(model.count_params()), times, type(model.optimizer).__name__


def benchmark_train(name: str, overrides: Sequence[str] = (), steps: int = 5, repeats: int = 3,
                    warmup: int = 2, jit_compile: bool = False, threads: int = 0,
                    unknown_shapes: bool = False, route: str = "loop",
                    skip_non_finite: bool = True, diagnostics: bool = False
                    ) -> Dict[str, object]:
    """Times training steps of one configuration in this process (module docstring).

    Args:
      name: a preset (:data:`~deep_nmt_tf.benchmark.presets.PRESETS`) or a YAML config file.
      overrides: config overrides applied to it.
      steps: timed steps per repeat; repeats: timed repeats (the median is reported);
        warmup: untimed steps first (tracing and first runs).
      jit_compile: compile the step with XLA.
      threads: intra/inter-op threads (0: TensorFlow's default; set before TensorFlow runs).
      unknown_shapes: ``[None, None]`` batches (module docstring).
      route: ``loop`` (the custom loop's trainer) or ``fit`` (module docstring).
      skip_non_finite: ``fit``: with :class:`~deep_nmt_tf.task.skipping.SkipNonFiniteUpdates`
        (False: the bare Adam).
      diagnostics: ``loop``: every step also computes Bapna et al.'s grad-norm ratio (the
        step a run with ``training.grad_norm_ratio_every`` takes at those updates, and with
        ``training.static_shapes`` at every update); the model must return its encoder
        layer outputs.

    Returns:
      ``tokens_per_s`` (median), ``tokens_per_s_repeats``, ``step_s``, ``peak_rss_mib`` (and
      before the model), ``parameters``, ``precision``, ``train_flops_per_step``, the shapes and
      the load average.

    Raises:
      ValueError: ``name`` is neither a preset nor a file.
    """
    if threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    from deep_nmt_tf.config import load_config

    path, preset = config_overrides(name)
    config = load_config(path, preset + list(overrides) + [
        f"training.jit_compile={'true' if jit_compile else 'false'}",
        "training.eval_every=0", "training.gradient_accumulation_steps=1"])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra = {}
    if route == "fit":
        import keras

        params, times, optimizer = _time_fit(config, steps, repeats, warmup, skip_non_finite)
        extra = {"route": "fit", "backend": keras.backend.backend(), "optimizer": optimizer}
    else:
        params, times = _time_loop(config, steps, repeats, warmup, unknown_shapes, diagnostics)
        extra = {"diagnostics": diagnostics}
    tokens = steps * BATCH * (SRC_LEN + TGT_LEN)
    rates = [tokens / t for t in times]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": "train", "config": name, "overrides": list(overrides), **extra,
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_repeats": [round(r, 1) for r in rates],
        "step_s": round(statistics.median(times) / steps, 4),
        "peak_rss_mib": round(peak_kb / 1024, 1),
        "peak_rss_mib_before_model": round(rss_before / 1024, 1),
        "parameters": params, "jit_compile": jit_compile,
        "unknown_shapes": unknown_shapes,
        "precision": config.training.precision,
        "train_flops_per_step": train_flops_per_step(config),
        "batch": [BATCH, SRC_LEN, TGT_LEN], "vocab": VOCAB,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _time_loop(config, steps: int, repeats: int, warmup: int, unknown_shapes: bool,
               diagnostics: bool = False):
    """``(parameters, [seconds per repeat])`` of the custom loop's ``train_step`` (with
    ``diagnostics``: with the grad-norm ratio on every step)."""
    import numpy as np

    from deep_nmt_tf.training import Runner

    with tempfile.TemporaryDirectory() as model_dir:
        runner = Runner(config, model_dir, trainer=_trainer_class(unknown_shapes))
        trainer = runner.trainer
        params = int(sum(np.prod(v.shape) for v in trainer.model.trainable_variables))
        iterator = runner.make_train_iterator()
        for _ in range(warmup):
            float(trainer.train_step(iterator, diagnostics)["loss_sum"])
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                # Synchronised every step.
                float(trainer.train_step(iterator, diagnostics)["loss_sum"])
            times.append(time.perf_counter() - start)
    return params, times


def benchmark_configs(names: Sequence[str], on_result: Callable[[Dict], None] = lambda r: None,
                      **options) -> List[Dict[str, object]]:
    """:func:`benchmark_train` of each configuration in a process of its own (its own peak
    memory); ``on_result`` is called with each result as it comes; ``options`` are
    :func:`benchmark_train`'s.

    Raises:
      RuntimeError: a configuration's process failed (its stderr's end in the message).
    """
    for name in names:
        config_overrides(name)  # Refused here, before any process starts.
    results = []
    for name in names:
        args = json.dumps(dict(options, name=name))
        proc = subprocess.run([sys.executable, "-m", "deep_nmt_tf.benchmark.training", args],
                              capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            raise RuntimeError(f"benchmark of {name!r} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        result = json.loads(lines[-1])
        on_result(result)
        results.append(result)
    return results


if __name__ == "__main__":  # One configuration (benchmark_configs' child): JSON in, JSON out.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(json.dumps(benchmark_train(**json.loads(sys.argv[1]))), flush=True)
