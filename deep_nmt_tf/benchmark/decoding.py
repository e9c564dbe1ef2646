"""Decoding speed: generated tokens/s of greedy and beam search with random weights, at the
shapes and conventions of the peer benchmarks (``shared/bench/peers``, ``benchcommon.py``): a
Transformer of a preset's size (``small``, ``base``: d_model 512, ffn 2048, 8 heads, 6 + 6
post-norm layers, or ``deep``), shared source/target/softmax embedding, vocabulary 8000; batch
32, source length 32 (31 random tokens and ``</s>``), exactly 32 generated tokens per hypothesis
(``</s>`` is banned until then: ``min_length = max_length = 32``), greedy and beam 4.  Generated
tokens per second = ``batch * 32`` / wall time of one search call (encoder included; median of
the timed repeats after one untimed warm-up call that also compiles).  Two paths are timed:
``translator``, the export module's compiled search on prepared ids
(:class:`~deep_nmt_tf.export.module.TranslationModule`, what ``Translator.translate`` runs per
batch), and ``saved_model``, the exported SavedModel (``translate_ids`` signature, which also
prepares the source in the graph) reloaded with ``tf.saved_model.load``.  ``precision``
``bfloat16`` (or ``float16``) rounds the weights and runs the search in that precision, as
``deep-nmt-translate --precision`` does.

Example::

    from deep_nmt_tf.benchmark.decoding import benchmark_decode
    result = benchmark_decode()            # ~3-5 minutes on 2 CPU cores
    result["results"]["translator"]["beam4"]["tokens_per_second"]

A real file (:func:`benchmark_file`, ``deep-nmt-benchmark --mode=decode_file``): a trained run
translates a text file as a user would, in process (:class:`~deep_nmt_tf.inference.Translator`)
and through its exported SavedModel (``serving_default``, text in and out, the host batching by
length as the translator does: :func:`~deep_nmt_tf.inference.length_batches`), with the
run's ``decoding`` section and the precision and XLA setting the tools choose
(:func:`deep_nmt_tf.hardware.fastest_inference_settings`).  Target tokens/s = the
translations' tokens (the run's tokenizer) / wall time of the whole file (median of the timed
passes, after one untimed pass that traces and compiles: its time is reported too), and BLEU
against a reference.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Dict, Optional, Sequence

from deep_nmt_tf.benchmark.presets import config_overrides, stacks

__all__ = ["MODES", "benchmark_decode", "format_results", "step_ops", "benchmark_file",
           "format_file_results"]

MODES = {"greedy": 1, "beam4": 4}


def _config(name: str, vocab_size: int, beam_size: int, steps: int):
    """A training preset (the peers' shapes) without dropout, or a YAML config's model, with
    decoding parameters that generate exactly ``steps`` tokens."""
    from deep_nmt_tf.config import load_config

    decoding = [f"decoding.beam_size={beam_size}", "decoding.n_best=1",
                "decoding.length_penalty=0.6", "decoding.max_length_a=0.0",
                f"decoding.max_length_b={steps}", "decoding.batch_size=32",
                "decoding.max_input_length=256"]
    path, overrides = config_overrides(name)
    # (A file's dropouts stay as written: they do not act in the search.)
    no_dropout = [] if path else stacks("input_dropout=0.0", "residual_dropout=0.0")
    return load_config(path, overrides + decoding + [f"model.vocab_size={vocab_size}"] +
                       no_dropout)


def _synthetic_vocab(size: int):
    from deep_nmt_tf.constants import RESERVED_TOKENS

    return list(RESERVED_TOKENS) + [f"w{i}" for i in range(len(RESERVED_TOKENS), size)]


def _time(fn, repeats: int):
    fn()  # Warm-up (tracing and XLA compilation).
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _summary(times, work):
    return {"tokens_per_second": work / statistics.median(times),
            "seconds": [round(t, 4) for t in times], "tokens": work}


def benchmark_decode(config: str = "base", modes: Sequence[str] = ("greedy", "beam4"),
                     paths: Sequence[str] = ("translator", "saved_model"),
                     batch_size: int = 32, source_length: int = 32, steps: int = 32,
                     vocab_size: int = 8000, repeats: int = 3, jit_compile: bool = True,
                     threads: Optional[int] = None, seed: int = 0,
                     work_dir: Optional[str] = None,
                     precision: str = "float32") -> Dict[str, object]:
    """Times greedy and beam search (see "Decoding" in the module docstring).

    Args:
      config: a preset (``small``, ``base``, ``deep``...: the peer benchmark sizes) or a YAML
        config file (its model, random weights, ``vocab_size`` words).
      modes: subset of ``greedy``, ``beam4``.
      paths: subset of ``translator`` (in-process) and ``saved_model`` (exported, reloaded).
      batch_size, source_length, steps, vocab_size: benchmark shapes (peers: 32, 32, 32, 8000).
      repeats: timed calls per measurement (the median is reported).
      jit_compile: compile the search with XLA (the translator's and exporter's default).
      threads: TensorFlow intra-op threads (set before TensorFlow starts; None: default).
      seed: weights and source seed.
      work_dir: where the SavedModels are written (default: a temporary directory, removed).
      precision: ``float32``, ``bfloat16`` or ``float16`` weights and activations (the random
        float32 weights rounded, as ``--precision`` of the translation tools does).

    Returns:
      dict: ``results[path][mode]`` -> ``{"tokens_per_second", "seconds", "tokens"}``, plus
      ``config``, the shapes, ``jit_compile``, ``threads``, library versions and the checks
      ``outputs_equal`` (SavedModel ids == in-process ids, per mode) and ``all_lengths_ok``.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from deep_nmt_tf.constants import EOS_ID
    from deep_nmt_tf.data.vocab import Tokenizer
    from deep_nmt_tf.export.saved_model import export_saved_model
    from deep_nmt_tf.decoding.options import SearchOptions
    from deep_nmt_tf.export.module import TranslationModule
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TensorFlow already started; keep its settings.
            pass
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed + 2)
    source = rng.integers(4, vocab_size, (batch_size, source_length)).astype(np.int32)
    source[:, -1] = EOS_ID
    tokenizer = Tokenizer(_synthetic_vocab(vocab_size))
    model = build_model(_config(config, vocab_size, 1, steps))
    if precision != "float32":  # the same weights, rounded
        half = build_model(_config(config, vocab_size, 1, steps),
                           dtype=INFERENCE_POLICIES[precision])
        for target, value in zip(half.variables, model.variables):
            target.assign(tf.cast(value, target.dtype))
        model = half
    work = batch_size * steps
    results: Dict[str, Dict[str, object]] = {p: {} for p in paths}
    outputs_equal: Dict[str, bool] = {}
    lengths_ok = True
    tmp = work_dir or tempfile.mkdtemp(prefix="deep_nmt_bench_")
    try:
        for mode in modes:
            cfg = _config(config, vocab_size, MODES[mode], steps)
            module = TranslationModule(model, tokenizer,
                                       SearchOptions.from_config(cfg.decoding, min_length=steps),
                                       cfg.decoding.max_input_length, jit_compile=jit_compile)
            source_ids = module.prepare_source(tf.RaggedTensor.from_tensor(source[:, :-1]))
            assert source_ids.shape == (batch_size, source_length), source_ids.shape
            local = module.search_ids(source_ids)
            lengths_ok &= bool((local["lengths"].numpy() == steps).all())
            if "translator" in paths:
                times = _time(lambda: module.search_ids(source_ids)["ids"].numpy(), repeats)
                results["translator"][mode] = _summary(times, work)
            if "saved_model" in paths:
                path = export_saved_model(module, os.path.join(tmp, mode), version=1)
                loaded = tf.saved_model.load(path)
                serve = loaded.signatures["translate_ids"]
                ids = tf.constant(source[:, :-1])
                out = serve(source_ids=ids)
                outputs_equal[mode] = bool(np.array_equal(out["ids"].numpy(),
                                                          local["ids"].numpy()))
                lengths_ok &= bool((out["lengths"].numpy() == steps).all())
                times = _time(lambda: serve(source_ids=ids)["ids"].numpy(), repeats)
                results["saved_model"][mode] = _summary(times, work)
                del loaded, serve
    finally:
        if work_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        "config": config, "batch_size": batch_size, "source_length": source_length,
        "steps": steps, "vocab_size": vocab_size, "jit_compile": jit_compile,
        "precision": precision,
        "threads": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                    "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                    "cpus": os.cpu_count()},
        "params": int(model.count_params()), "tensorflow": tf.__version__,
        "keras": keras.__version__, "python": platform.python_version(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "results": results, "outputs_equal": outputs_equal, "all_lengths_ok": lengths_ok,
    }


def format_results(result: Dict[str, object]) -> str:
    """Lines ``deep_nmt_tf <config> <path>_<mode>_tok_per_s <value> tok/s`` (peer format)."""
    lines = []
    suffix = "" if result.get("precision", "float32") == "float32" else f"_{result['precision']}"
    for path, by_mode in result["results"].items():
        for mode, r in by_mode.items():
            lines.append(f"deep_nmt_tf {result['config']} {path}_{mode}{suffix}_tok_per_s "
                         f"{r['tokens_per_second']:.6g} tok/s")
    return "\n".join(lines)


def step_ops(name: str, precision: str = "float32"):
    """Ops per greedy and per beam-4 decoder step of a preset or YAML config (random weights):
    :func:`deep_nmt_tf.export.graph_ops.count_step_ops`, one :class:`StepOps` per beam (1, 4)."""
    from deep_nmt_tf.benchmark.presets import config_overrides
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.export.graph_ops import count_step_ops
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

    path, overrides = config_overrides(name)
    model = build_model(load_config(path, overrides), dtype=INFERENCE_POLICIES[precision])
    return [count_step_ops(model, beam_size=beam) for beam in (1, 4)]


def _read_text(path: str):
    from deep_nmt_tf.data.text_io import read_lines

    return list(read_lines(path))


def _saved_model_translate(loaded, sentences: Sequence[str], batch_size: int):
    """``serving_default`` over ``sentences`` in length-sorted batches (lengths: the SavedModel's
    own tokenizer), results in input order."""
    import tensorflow as tf

    from deep_nmt_tf.inference import length_batches

    serve = loaded.signatures["serving_default"]
    lengths = loaded.tokenize(tf.constant(list(sentences), tf.string)).row_lengths().numpy()
    out = [""] * len(sentences)
    for batch in length_batches(lengths.tolist(), batch_size):
        texts = serve(text=tf.constant([sentences[i] for i in batch]))["translations"].numpy()
        for row, i in enumerate(batch):
            out[i] = texts[row].decode("utf-8")
    return out


def benchmark_file(model_dir: str, input_path: str, reference_path: Optional[str] = None,
                   checkpoint: Optional[str] = None, overrides: Sequence[str] = (),
                   precision: Optional[str] = None, jit_compile: Optional[bool] = None,
                   paths: Sequence[str] = ("translator", "saved_model"), repeats: int = 3,
                   work_dir: Optional[str] = None) -> Dict[str, object]:
    """Translates a text file with a trained run (module docstring, "A real file").

    Args:
      model_dir: a run directory; ``checkpoint``: one of its checkpoints (default the latest).
      input_path: source text, one sentence per line; ``reference_path``: its reference
        translation (BLEU; optional).
      overrides: config overrides (``decoding.beam_size=4``, ``decoding.batch_size=64`` ...).
      precision, jit_compile: None: :func:`deep_nmt_tf.hardware.fastest_inference_settings`.
      paths: subset of ``translator`` (in process) and ``saved_model``.
      repeats: timed passes over the file per path (the median is reported).
      work_dir: where the SavedModel is written (default: a temporary directory, removed).

    Returns:
      dict: ``results[path]`` -> ``{"tokens_per_second", "sentences_per_second", "seconds",
      "first_pass_seconds", "tokens", "bleu"}`` (``bleu`` with a reference: sacreBLEU, and
      its ``bleu_signature``), plus the settings (``precision``, ``jit_compile``,
      ``inference_settings``: why), ``beam_size``, ``batch_size``, ``sentences``,
      ``outputs_equal`` (the SavedModel's translations == the translator's) and the machine.
    """
    import tensorflow as tf

    from deep_nmt_tf.decoding.scoring import corpus_scores
    from deep_nmt_tf.export.saved_model import export_model_dir, load_saved_model
    from deep_nmt_tf.hardware import describe_machine, fastest_inference_settings
    from deep_nmt_tf.inference import Translator

    settings = fastest_inference_settings(precision, jit_compile)
    sentences = _read_text(input_path)
    references = _read_text(reference_path) if reference_path else None
    if references is not None and len(references) != len(sentences):
        raise ValueError(f"{reference_path}: {len(references)} lines, {input_path}: "
                         f"{len(sentences)}")
    translator = Translator.from_model_dir(model_dir, checkpoint, overrides,
                                           jit_compile=settings.jit_compile,
                                           precision=settings.precision)
    decoding = translator.config.decoding
    runs = {"translator": lambda: [h[0].text for h in translator.translate(sentences)]}
    tmp = work_dir or tempfile.mkdtemp(prefix="deep_nmt_bench_file_")
    results: Dict[str, Dict[str, object]] = {}
    outputs: Dict[str, list] = {}
    try:
        if "saved_model" in paths:
            path = export_model_dir(model_dir, tmp, checkpoint, version=1, overrides=overrides,
                                    jit_compile=settings.jit_compile, overwrite=True,
                                    precision=settings.precision)
            loaded = load_saved_model(path)
            runs["saved_model"] = lambda: _saved_model_translate(loaded, sentences,
                                                                 decoding.batch_size)
        for name in paths:
            start = time.perf_counter()
            outputs[name] = runs[name]()
            first = time.perf_counter() - start
            times = _time_passes(runs[name], repeats)
            tokens = int(sum(translator.tokenizer.tokenize(
                tf.constant(outputs[name] or [""])).row_lengths().numpy()))
            result = _summary(times, tokens)
            result.update(first_pass_seconds=round(first, 4),
                          sentences_per_second=len(sentences) / statistics.median(times))
            if references is not None:
                # A model trained on lowercased text is scored case-insensitively (evaluate).
                scores = corpus_scores(outputs[name], references,
                                       lowercase=translator.config.data.lowercase)
                result.update(bleu=scores["bleu"], bleu_signature=scores["bleu_signature"])
            results[name] = result
    finally:
        if work_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    equal = (outputs["saved_model"] == outputs["translator"]
             if {"saved_model", "translator"} <= set(outputs) else None)
    return {"model_dir": model_dir, "input": input_path, "reference": reference_path,
            "checkpoint": translator.checkpoint_path, "sentences": len(sentences),
            "precision": settings.precision, "jit_compile": settings.jit_compile,
            "inference_settings": settings.reason, "beam_size": decoding.beam_size,
            "batch_size": decoding.batch_size, "repeats": repeats, "results": results,
            "outputs_equal": equal, "machine": describe_machine(),
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def _time_passes(fn, repeats: int):
    times = []
    for _ in range(max(1, int(repeats))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def format_file_results(result: Dict[str, object]) -> str:
    """One line per path: tokens/s, sentences/s, BLEU, the settings."""
    lines = []
    for path, r in result["results"].items():
        bleu = f", BLEU {r['bleu']:.2f}" if "bleu" in r else ""
        lines.append(f"deep_nmt_tf file {path}: {r['tokens_per_second']:.1f} target tok/s, "
                     f"{r['sentences_per_second']:.1f} sentences/s{bleu} ({result['sentences']} "
                     f"sentences, beam {result['beam_size']}, batch {result['batch_size']}, "
                     f"{result['inference_settings']}; first pass {r['first_pass_seconds']} s)")
    return "\n".join(lines)
