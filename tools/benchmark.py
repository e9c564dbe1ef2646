r"""Throughput and memory benchmarks (results go to BENCHMARKS.md with the command).

Training (``--mode=train``): source+target tokens/s of full training steps of the real
:class:`~deep_nmt_tf.training.Trainer` step (forward, backward, all-reduce, Adam), after
warm-up, at the shapes of the peer harness in ``shared/bench/peers`` (batch 64 sentences,
source and target length 32, vocabulary 8000), and the process's peak resident memory.  Each
configuration runs in its own process so peak memory is its own::

    deep-nmt-benchmark --mode=train --config=small,base,deep
    deep-nmt-benchmark --mode=train --config=deep,deep_dlcl --repeats=5
    deep-nmt-benchmark --mode=train --config=configs/dlcl_pre_30l.yaml \
        --override=model.decoder.transformer.num_layers=6

``--config`` takes preset names (below) or YAML config files, comma-separated; each prints one
JSON line, and the last line is a JSON list of all of them.  Training honours
``training.precision`` (``--override=training.precision=mixed_bfloat16``); each line carries
``train_flops_per_step`` (the peer harness's count: 6 FLOPs per weight per token it sees, plus
the attention products), from which BENCHMARKS.md derives the MFU.  The batches have fixed
static shapes, as a run with ``training.static_shapes`` has per bucket; ``--unknown_shapes``
gives the step the ``[None, None]`` batches of a run without it.

Decoding (``--mode=decode``, :func:`benchmark_decode`): generated tokens/s of greedy and beam
search with random weights, at the shapes and conventions of the peer benchmarks
(``shared/bench/peers``, ``benchcommon.py``): a Transformer of the ``--config`` size (``small``,
``base``: d_model 512, ffn 2048, 8 heads, 6 + 6 post-norm layers, or ``deep``), shared
source/target/softmax embedding, vocabulary 8000; batch 32, source length 32 (31 random tokens
and ``</s>``), exactly 32 generated tokens per hypothesis (``</s>`` is banned until then:
``min_length = max_length = 32``), greedy and beam 4.  Generated tokens per second = ``batch *
32`` / wall time of one search call (encoder included; median of the timed repeats after one
untimed warm-up call that also compiles).  Two paths are timed: ``translator``, the in-process
:class:`~deep_nmt_tf.export.translator.TranslationModule`'s compiled search on prepared ids (what
``Translator.translate`` runs per batch), and ``saved_model``, the exported SavedModel
(``translate_ids`` signature, which also prepares the source in the graph) reloaded with
``tf.saved_model.load``.  XLA is on for decoding with ``--jit_compile``;
``--precision=bfloat16`` (or ``float16``) rounds the weights and runs the search in that
precision, as ``deep-nmt-translate --precision`` does::

    deep-nmt-benchmark --mode=decode --config=base --jit_compile [--precision=bfloat16]

Ops per decoder step (``--mode=step_ops``, :func:`step_ops`): the graph ops of one greedy and
one beam-4 step of the plain-graph search, per decoder layer, for the search's own bookkeeping
and by category (:mod:`deep_nmt_tf.export.graph_ops`), in ``--precision``; ``--config`` takes
presets or YAML files, as for training::

    deep-nmt-benchmark --mode=step_ops --config=configs/transformer_base.yaml [--precision=bfloat16]

From Python::

    from deep_nmt_tf.tools.benchmark import benchmark_decode
    result = benchmark_decode()            # ~3-5 minutes on 2 CPU cores
    result["results"]["translator"]["beam4"]["tokens_per_second"]

Presets (the peers' sizes; every preset is post-norm 6+6 unless said):
  small: d 256, ffn 1024, 4 heads;  base: d 512, ffn 2048, 8 heads;
  deep: base with a 30-layer encoder, pre-norm encoder and decoder (the peers' deep);
  deep_post: base with a 30-layer post-norm encoder;
  deep_dlcl: deep with DLCL (pre-norm, encoder and decoder);
  base_lexical_shortcuts / base_feature_fusion: base with Emelin et al.'s shortcuts.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, Optional, Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import PRECISION_FLAG, define_flags

FLAGS = flags.FLAGS

def _stacks(*settings, stacks=("encoder", "decoder")):
    """``num_heads=8`` -> overrides of that Transformer key in the encoder and the decoder."""
    return [f"model.{stack}.transformer.{s}" for stack in stacks for s in settings]


PRESETS = {
    "small": ["model.d_model=256"] + _stacks("ffn_dim=1024", "num_heads=4"),
    "base": [],
    "deep": _stacks("num_layers=30", "norm=pre", stacks=("encoder",)) + _stacks("norm=pre"),
    "deep_post": _stacks("num_layers=30", stacks=("encoder",)),
    "deep_dlcl": (_stacks("num_layers=30", stacks=("encoder",)) +
                  _stacks("norm=pre", "dlcl.enabled=true")),
    "base_lexical_shortcuts": _stacks("lexical_shortcuts.enabled=true"),
    "base_feature_fusion": _stacks("lexical_shortcuts.enabled=true",
                                   "lexical_shortcuts.variant=feature_fusion"),
}
# The shared peer harness's model: base sizes, 6+6, post-norm, tied embeddings, dropout 0.1,
# vocabulary 8000; batch 64 x (32 + 32) tokens.
_CONSTANT_LR = ["training.schedule.type=constant", "training.schedule.constant.learning_rate=1e-4"]
BASE_OVERRIDES = (["model.vocab_size=8000", "model.d_model=512", "data.corpus=synthetic",
                   "training.label_smoothing=0.1", "training.adam_beta2=0.98"] + _CONSTANT_LR +
                  _stacks("ffn_dim=2048", "num_heads=8", "num_layers=6", "norm=post"))
BATCH, SRC_LEN, TGT_LEN, VOCAB = 64, 32, 32, 8000
DEFAULT_CONFIGS = ("small", "base", "deep")

define_flags([
    (flags.DEFINE_enum, "mode", "train", ["train", "decode", "step_ops"], "What to measure."),
    # A string, not a list flag: deep-nmt-train's --config (a string) may share it in-process.
    (flags.DEFINE_string, "config", None, "Presets or YAML files, comma-separated (default: "
                                          f"{','.join(DEFAULT_CONFIGS)})."),
    (flags.DEFINE_multi_string, "override", [],
     "Config overrides KEY=VALUE applied to each training config (--mode=train only)."),
    (flags.DEFINE_integer, "steps", 5, "Timed training steps per repeat."),
    (flags.DEFINE_integer, "repeats", 3, "Timed repeats (the median is reported)."),
    (flags.DEFINE_integer, "warmup", 2, "Untimed warm-up steps (tracing and first runs)."),
    (flags.DEFINE_bool, "jit_compile", False,
     "Compile with XLA: the training step, or the search with --mode=decode."),
    (flags.DEFINE_integer, "threads", 0, "intra/inter-op threads (0: TensorFlow's default)."),
    (flags.DEFINE_string, "output", None, "Also append the JSON results to this file."),
    (flags.DEFINE_bool, "unknown_shapes", False,
     "Training: give the step batches of unknown static shape ([None, None]), as a real run's "
     "length-bucketed input does, instead of the fixed [64, 32] batches."),
    (flags.DEFINE_bool, "child", False, "Internal: run one configuration in this process."),
    PRECISION_FLAG,
])


def _configs():
    """The ``--config`` names (presets or files)."""
    names = [n.strip() for n in (FLAGS.config or ",".join(DEFAULT_CONFIGS)).split(",")]
    return [n for n in names if n]


def _config_overrides(name):
    if name in PRESETS:
        return None, BASE_OVERRIDES + PRESETS[name]
    if os.path.exists(name):
        return name, ["model.vocab_size=8000", "data.corpus=synthetic"] + _CONSTANT_LR
    raise app.UsageError(f"--config: {name!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a file")


def train_flops_per_step(config, batch=BATCH, src_len=SRC_LEN, tgt_len=TGT_LEN):
    """Model FLOPs of one training step of a Transformer config, as the peer harness counts
    them (``shared/bench/peers/benchcommon.py``): 6 per weight per token it sees (encoder
    weights per source token, decoder weights and the output projection per target token) plus
    the attention score and value products (x3 for forward and backward).  None for other
    architectures."""
    m = config.model
    if (m.encoder.type, m.decoder.type) != ("transformer", "transformer"):
        return None
    enc, dec = m.encoder.get(), m.decoder.get()
    d = m.d_model
    attention = 4 * d * d + 4 * d

    def stack(options, attentions):  # attentions + feed-forward + their LayerNorms
        layer = attentions * attention + 2 * d * options.ffn_dim + options.ffn_dim + d
        return options.num_layers * (layer + (1 + attentions) * 2 * d)

    src, tgt = batch * src_len, batch * tgt_len
    dense = 6 * (stack(enc, 1) * src + stack(dec, 2) * tgt + m.vocab_size * d * tgt)
    scores = 3 * 2 * 2 * d * batch * (enc.num_layers * src_len * src_len +
                                      dec.num_layers * (tgt_len * tgt_len + tgt_len * src_len))
    return float(dense + scores)


def _train_child(name):
    import dataclasses

    import numpy as np
    import tensorflow as tf

    if FLAGS.threads:
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
        tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.training.trainer import Trainer

    path, overrides = _config_overrides(name)
    overrides = overrides + list(FLAGS.override) + [
        f"training.jit_compile={'true' if FLAGS.jit_compile else 'false'}",
        "training.eval_every=0", "training.gradient_accumulation_steps=1"]
    config = load_config(path, overrides)
    rng = np.random.default_rng(1)

    def batch():
        src = rng.integers(4, VOCAB, (BATCH, SRC_LEN), dtype=np.int32)
        tgt = rng.integers(4, VOCAB, (BATCH, TGT_LEN + 1), dtype=np.int32)
        tgt[:, 0] = 1
        return {"source_ids": src, "target_input_ids": tgt[:, :-1],
                "target_output_ids": tgt[:, 1:]}

    batches = [batch() for _ in range(4)]

    class BenchTrainer(Trainer):
        """The real trainer on fixed random batches (no corpus, no vocabulary)."""

        def prepare(self, cfg):
            return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                       vocab_size=VOCAB))

        def build_train_dataset(self, input_context):
            if FLAGS.unknown_shapes:  # the same batches, with the element spec of a real run
                spec = {k: tf.TensorSpec([None, None], tf.int32) for k in batches[0]}
                return tf.data.Dataset.from_generator(lambda: iter(batches),
                                                      output_signature=spec).repeat()
            return tf.data.Dataset.from_tensor_slices(
                {k: np.stack([b[k] for b in batches]) for k in batches[0]}).repeat()

        def build_eval_dataset(self):
            return None

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as model_dir:
        trainer = BenchTrainer(config, model_dir)
        params = int(sum(np.prod(v.shape) for v in trainer.model.trainable_variables))
        iterator = trainer.make_train_iterator()
        for _ in range(FLAGS.warmup):
            float(trainer.train_step(iterator)["loss_sum"])
        times = []
        for _ in range(FLAGS.repeats):
            start = time.perf_counter()
            for _ in range(FLAGS.steps):
                float(trainer.train_step(iterator)["loss_sum"])  # synchronise every step
            times.append(time.perf_counter() - start)
    tokens = FLAGS.steps * BATCH * (SRC_LEN + TGT_LEN)
    rates = [tokens / t for t in times]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": "train", "config": name, "overrides": list(FLAGS.override),
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_repeats": [round(r, 1) for r in rates],
        "step_s": round(statistics.median(times) / FLAGS.steps, 4),
        "peak_rss_mib": round(peak_kb / 1024, 1),
        "peak_rss_mib_before_model": round(rss_before / 1024, 1),
        "parameters": params, "jit_compile": FLAGS.jit_compile,
        "unknown_shapes": FLAGS.unknown_shapes,
        "precision": config.training.precision,
        "train_flops_per_step": train_flops_per_step(config),
        "batch": [BATCH, SRC_LEN, TGT_LEN], "vocab": VOCAB,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _run_children(names):
    results = []
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--mode={FLAGS.mode}",
               f"--config={name}", f"--steps={FLAGS.steps}", f"--repeats={FLAGS.repeats}",
               f"--warmup={FLAGS.warmup}", f"--jit_compile={FLAGS.jit_compile}",
               f"--threads={FLAGS.threads}", f"--unknown_shapes={FLAGS.unknown_shapes}"
               ] + [f"--override={o}" for o in FLAGS.override]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"benchmark of {name!r} failed (exit {proc.returncode})")
        result = json.loads(lines[-1])
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

MODES = {"greedy": 1, "beam4": 4}


def _config(name: str, vocab_size: int, beam_size: int, steps: int):
    """A training preset (the peers' shapes) without dropout, with decoding parameters that
    generate exactly ``steps`` tokens."""
    from deep_nmt_tf.config import load_config

    decoding = [f"decoding.beam_size={beam_size}", "decoding.n_best=1",
                "decoding.length_penalty=0.6", "decoding.max_length_a=0.0",
                f"decoding.max_length_b={steps}", "decoding.batch_size=32",
                "decoding.max_input_length=256"]
    return load_config(None, BASE_OVERRIDES + PRESETS[name] + decoding + [
        f"model.vocab_size={vocab_size}"] + _stacks("input_dropout=0.0", "residual_dropout=0.0"))


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
      config: ``small``, ``base`` or ``deep`` (peer benchmark sizes).
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
    from deep_nmt_tf.export.translator import TranslationModule
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
            module = TranslationModule(model, tokenizer, cfg.decoding, jit_compile=jit_compile,
                                       min_length=steps)
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


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _append_json(results):
    """Appends one JSON line per result to ``--output`` (if given), each naming the machine
    (``"machine"``: CPU name, family and model, cores, TensorFlow version), since figures from
    different machines do not compare."""
    if FLAGS.output:
        from deep_nmt_tf.hardware import describe_machine

        machine = describe_machine()
        with open(FLAGS.output, "a", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({**r, "machine": r.get("machine", machine)}) + "\n")


def step_ops(name: str, precision: str = "float32"):
    """Ops per greedy and per beam-4 decoder step of a preset or YAML config (random weights,
    vocabulary 8000): :func:`deep_nmt_tf.export.graph_ops.count_step_ops`."""
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.export.graph_ops import count_step_ops
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.models.seq2seq import INFERENCE_POLICIES

    path, overrides = _config_overrides(name)
    model = build_model(load_config(path, overrides), dtype=INFERENCE_POLICIES[precision])
    return [count_step_ops(model, beam_size=beam) for beam in (1, 4)]


def _check_mode_flags():
    """Refuses a flag the chosen ``--mode`` would silently ignore."""
    if FLAGS.mode in ("decode", "step_ops") and FLAGS.override:
        raise app.UsageError(f"--override applies to --mode=train only (--mode={FLAGS.mode} "
                             "measures the presets' or the files' shapes)")
    if FLAGS.mode == "train" and FLAGS.precision != "float32":
        raise app.UsageError(f"--precision={FLAGS.precision} applies to --mode=decode only; "
                             "train in reduced precision with "
                             "--override=training.precision=mixed_bfloat16 (or mixed_float16)")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _check_mode_flags()
    if FLAGS.mode == "step_ops":
        from deep_nmt_tf.export.graph_ops import format_step_ops

        results = []
        for name in _configs():
            counts = step_ops(name, FLAGS.precision)
            print(f"{name}:\n{format_step_ops(counts)}", flush=True)
            results.append({"config": name, "precision": FLAGS.precision,
                            "step_ops": [c.to_dict() for c in counts]})
            print(json.dumps(results[-1]), flush=True)
        _append_json(results)
        return
    if FLAGS.mode == "decode":
        results = []
        for name in _configs():
            result = benchmark_decode(config=name, modes=("greedy", "beam4"),
                                      paths=("translator", "saved_model"),
                                      repeats=FLAGS.repeats, jit_compile=FLAGS.jit_compile,
                                      threads=FLAGS.threads or None,
                                      precision=FLAGS.precision)
            # The peer-format lines on stdout too (shared/bench/side_by_side.sh keeps them).
            print(format_results(result), flush=True)
            print(json.dumps(result), flush=True)
            results.append(result)
        _append_json(results)
        return
    if FLAGS.child:
        print(json.dumps(_train_child(_configs()[0])), flush=True)
        return
    results = _run_children(_configs())
    print(json.dumps(results))
    _append_json(results)


def run():
    """Console-script entry point."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
