r"""Throughput and memory benchmarks (results go to BENCHMARKS.md with the command).

Training (``--mode=train``): source+target tokens/s of full training steps of the real
:class:`~deep_nmt_tf.training.Trainer` step (forward, backward, all-reduce, Adam), after
warm-up, at the shapes of the peer harness in ``shared/bench/peers`` (batch 64 sentences,
source and target length 32, vocabulary 8000), and the process's peak resident memory.  Each
configuration runs in its own process so peak memory is its own::

    python tools/benchmark.py --mode=train --config=small,base,deep
    python tools/benchmark.py --mode=train --config=deep,deep_dlcl --repeats=5
    python tools/benchmark.py --mode=train --config=configs/dlcl_pre_30l.yaml \
        --override=model.decoder.transformer.num_layers=6

``--config`` takes preset names (below) or YAML config files, comma-separated; each prints one
JSON line, and the last line is a JSON list of all of them.

Decoding (``--mode=decode``): generated tokens/s for greedy and beam 4 (batch 32, source 32,
exactly 32 generated tokens), in-process and through the exported SavedModel, random weights;
see :mod:`deep_nmt_tf.export.benchmark`.  XLA is on for decoding unless ``--nojit_compile``::

    python tools/benchmark.py --mode=decode --config=base --jit_compile

Presets (the peers' sizes; every preset is post-norm 6+6 unless said):
  small: d 256, ffn 1024, 4 heads;  base: d 512, ffn 2048, 8 heads;
  deep: base with a 30-layer pre-norm encoder;  deep_post: 30-layer post-norm encoder;
  deep_dlcl: deep with DLCL (pre-norm, encoder and decoder);
  base_lexical_shortcuts / base_feature_fusion: base with Emelin et al.'s shortcuts.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

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

flags.DEFINE_enum("mode", "train", ["train", "decode"], "What to measure.")
flags.DEFINE_list("config", ["small", "base", "deep"], "Presets or YAML files.")
flags.DEFINE_multi_string("override", [], "Config overrides KEY=VALUE applied to each config.")
flags.DEFINE_integer("steps", 5, "Timed training steps per repeat.")
flags.DEFINE_integer("repeats", 3, "Timed repeats (the median is reported).")
flags.DEFINE_integer("warmup", 2, "Untimed warm-up steps (tracing and first runs).")
flags.DEFINE_bool("jit_compile", False, "Compile the training step with XLA.")
flags.DEFINE_integer("threads", 0, "intra/inter-op threads (0: TensorFlow's default).")
flags.DEFINE_string("output", None, "Also append the JSON results to this file.")
flags.DEFINE_bool("child", False, "Internal: run one configuration in this process.")


def _config_overrides(name):
    if name in PRESETS:
        return None, BASE_OVERRIDES + PRESETS[name]
    if os.path.exists(name):
        return name, ["model.vocab_size=8000", "data.corpus=synthetic"] + _CONSTANT_LR
    raise app.UsageError(f"--config: {name!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a file")


def _train_child(name):
    import dataclasses
    import statistics

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
        "batch": [BATCH, SRC_LEN, TGT_LEN], "vocab": VOCAB,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _run_children(names):
    results = []
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--mode={FLAGS.mode}",
               f"--config={name}", f"--steps={FLAGS.steps}", f"--repeats={FLAGS.repeats}",
               f"--warmup={FLAGS.warmup}", f"--jit_compile={FLAGS.jit_compile}",
               f"--threads={FLAGS.threads}"] + [f"--override={o}" for o in FLAGS.override]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"benchmark of {name!r} failed (exit {proc.returncode})")
        result = json.loads(lines[-1])
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if FLAGS.mode == "decode":
        from deep_nmt_tf.export.benchmark import benchmark_decode, format_results

        results = []
        for name in FLAGS.config:
            result = benchmark_decode(config=name, modes=("greedy", "beam4"),
                                      paths=("translator", "saved_model"),
                                      repeats=FLAGS.repeats, jit_compile=FLAGS.jit_compile,
                                      threads=FLAGS.threads or None)
            sys.stderr.write(format_results(result) + "\n")
            print(json.dumps(result), flush=True)
            results.append(result)
        if FLAGS.output:
            with open(FLAGS.output, "a", encoding="utf-8") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
        return
    if FLAGS.child:
        print(json.dumps(_train_child(FLAGS.config[0])), flush=True)
        return
    results = _run_children(FLAGS.config)
    print(json.dumps(results))
    if FLAGS.output:
        with open(FLAGS.output, "a", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
