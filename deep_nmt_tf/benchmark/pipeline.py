"""Input-pipeline throughput: the training ``tf.data`` pipeline of a run directory alone.

:func:`benchmark_pipeline` builds the run's training pipeline (its config, corpora and
vocabulary, with ``overrides``), reads ``warmup`` batches, then times ``batches`` more per
repeat: source+target tokens (padding excluded) per wall second and per CPU second of the
process (every thread: tokenisation, shuffling, bucketing), the first batch's latency and the
peak resident memory.  Tokens per CPU second is the figure that matters on a machine where
the pipeline shares the cores with the training step.  Compare settings with ``--override``,
e.g. ``data.autotune=true`` against the default::

    deep-nmt-benchmark --mode=pipeline --model_dir=runs/multi30k/runs/baseline-seed1 \
        --steps=300 --repeats=2 [--override=data.autotune=true]
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Dict, Sequence

__all__ = ["benchmark_pipeline", "format_pipeline_result"]


def _count_tokens(batch) -> int:
    return int((batch["source_ids"].numpy() != 0).sum()
               + (batch["target_output_ids"].numpy() != 0).sum())


def benchmark_pipeline(model_dir: str, overrides: Sequence[str] = (), batches: int = 300,
                       repeats: int = 2, warmup: int = 20) -> Dict:
    """Times the training pipeline of the run in ``model_dir`` (module docstring).

    Each repeat builds the pipeline afresh (the same batches each time: it is deterministic).

    Returns:
      ``tokens_per_s`` and ``tokens_per_cpu_s`` (medians over the repeats, with the
      ``*_repeats`` lists), ``first_batch_s`` (the first repeat's), ``batches``, ``tokens``
      (per repeat), ``autotune`` (``data.autotune``), ``peak_rss_mib``.

    Raises:
      FileNotFoundError: no ``config.yaml`` in ``model_dir``.
      ValueError: ``batches`` or ``repeats`` below 1.
    """
    if batches < 1 or repeats < 1:
        raise ValueError(f"batches and repeats must be >= 1, got {batches} and {repeats}")
    from deep_nmt_tf.data import make_train_dataset
    from deep_nmt_tf.data.tokenizers import build_tokenizer
    from deep_nmt_tf.run_dir import RunDir

    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    tokenizer = build_tokenizer(config, run_dir.vocab_path(config))
    wall, cpu, first, tokens = [], [], None, 0
    for _ in range(repeats):
        start = time.perf_counter()
        iterator = iter(make_train_dataset(config, tokenizer))
        next(iterator)
        first = first if first is not None else time.perf_counter() - start
        for _ in range(warmup):
            next(iterator)
        tokens = 0
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(batches):
            tokens += _count_tokens(next(iterator))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        del iterator
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    per_s = [tokens / w for w in wall]
    per_cpu_s = [tokens / c for c in cpu]
    return {
        "model_dir": model_dir, "overrides": list(overrides),
        "autotune": bool(config.data.autotune), "batches": batches, "tokens": tokens,
        "tokens_per_s": round(statistics.median(per_s)),
        "tokens_per_s_repeats": [round(x) for x in per_s],
        "tokens_per_cpu_s": round(statistics.median(per_cpu_s)),
        "tokens_per_cpu_s_repeats": [round(x) for x in per_cpu_s],
        "first_batch_s": round(first, 2), "peak_rss_mib": round(peak_kb / 1024, 1),
    }


def format_pipeline_result(result: Dict) -> str:
    """One line: the medians, the setting and the memory."""
    return (f"pipeline (autotune {'on' if result['autotune'] else 'off'}): "
            f"{result['tokens_per_s']:,} tokens/s, {result['tokens_per_cpu_s']:,} tokens per "
            f"CPU second ({result['batches']} batches, {result['tokens']:,} tokens a repeat), "
            f"first batch {result['first_batch_s']} s, peak RSS {result['peak_rss_mib']} MiB")
