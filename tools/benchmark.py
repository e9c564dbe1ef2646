r"""Throughput and memory benchmarks (results go to BENCHMARKS.md with the command): the flags
of the benchmark library (:mod:`deep_nmt_tf.benchmark`), parsed here and nowhere else.

Training (``--mode=train``, :func:`deep_nmt_tf.benchmark.training.benchmark_configs`):
source+target tokens/s of full training steps of the real trainer (forward, backward,
all-reduce, Adam), after warm-up, at the shapes of the peer harness in ``shared/bench/peers``
(batch 64 sentences, source and target length 32, vocabulary 8000), and the process's peak
resident memory.  Each configuration runs in its own process so peak memory is its own::

    deep-nmt-benchmark --mode=train --config=small,base,deep
    deep-nmt-benchmark --mode=train --config=deep,deep_dlcl --repeats=5
    deep-nmt-benchmark --mode=train --config=configs/dlcl_pre_30l.yaml \
        --override=model.decoder.transformer.num_layers=6

``--route=fit`` times ``compile``/``fit``'s step instead (``train_on_batch``, on the current Keras
backend: ``KERAS_BACKEND=jax``), with ``--noskip_non_finite`` the bare Adam in place of the
optimizer that skips non-finite updates::

    deep-nmt-benchmark --mode=train --route=fit --config=base [--noskip_non_finite]

``--config`` takes preset names (:mod:`deep_nmt_tf.benchmark.presets`) or YAML config files,
comma-separated; each prints one JSON line, and the last line is a JSON list of all of them.
Training honours ``training.precision`` (``--override=training.precision=mixed_bfloat16``); each
line carries ``train_flops_per_step`` (the peer harness's count), from which BENCHMARKS.md
derives the MFU; ``--unknown_shapes`` gives the step the ``[None, None]`` batches of a run
without ``training.static_shapes``; ``--diagnostics`` computes the grad-norm ratio on every
step (its cost: a ``training.static_shapes`` run with ``training.grad_norm_ratio_every`` takes
that step at every update).

Decoding (``--mode=decode``, :func:`deep_nmt_tf.benchmark.decoding.benchmark_decode`): generated
tokens/s of greedy and beam search with random weights at the peer benchmarks' shapes (batch
32, source 32, exactly 32 steps, 8,000 words), in process and through an exported SavedModel;
XLA with ``--jit_compile``; ``--precision=bfloat16`` (or ``float16``) rounds the weights and
runs the search in that precision; ``--config`` takes presets or YAML files (a file's model at
those shapes)::

    deep-nmt-benchmark --mode=decode --config=base --jit_compile [--precision=bfloat16]
    deep-nmt-benchmark --mode=decode --config=configs/multi30k/deep_pre_dec1.yaml

Ops per decoder step (``--mode=step_ops``, :func:`deep_nmt_tf.benchmark.decoding.step_ops`):
the graph ops of one greedy and one beam-4 step of the plain-graph search, per decoder layer,
for the search's own bookkeeping and by category (:mod:`deep_nmt_tf.export.graph_ops`), in
``--precision``; ``--config`` takes presets or YAML files, as for training::

    deep-nmt-benchmark --mode=step_ops --config=configs/transformer_base.yaml [--precision=bfloat16]

A real file (``--mode=decode_file``, :func:`deep_nmt_tf.benchmark.decoding.benchmark_file`): a
trained run translates ``--input`` in process and through its exported SavedModel, in the
length-sorted batches of the run's ``decoding`` section (``--override=decoding.beam_size=4``,
``decoding.batch_size=...``), with the precision and XLA setting the translation tools choose
for this machine unless ``--precision``/``--jit_compile`` are given; target tokens/s over the
whole file (median of ``--repeats`` passes after one that compiles) and BLEU against
``--reference``::

    deep-nmt-benchmark --mode=decode_file --model_dir=runs/multi30k --input=test2016.en \
        --reference=test2016.de [--checkpoint=...] [--repeats=3]

The training input pipeline alone (``--mode=pipeline``,
:func:`deep_nmt_tf.benchmark.pipeline.benchmark_pipeline`): a run directory's training
``tf.data`` pipeline (its config, corpora and vocabulary, with ``--override``), source+target
tokens per wall second and per CPU second over ``--steps`` batches (median of ``--repeats``,
after ``--warmup`` batches)::

    deep-nmt-benchmark --mode=pipeline --model_dir=runs/multi30k/runs/baseline-seed1 \
        --steps=300 --repeats=2 [--override=data.autotune=true]

``--output=FILE`` also appends each result as a JSON line naming the machine.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.benchmark.presets import DEFAULT_CONFIGS
from deep_nmt_tf.cli import PRECISION_FLAG, define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_enum, "mode", "train", ["train", "decode", "step_ops", "decode_file",
                                             "pipeline"],
     "What to measure."),
    (flags.DEFINE_enum, "route", "loop", ["loop", "fit"],
     "--mode=train: the custom loop's training step, or compile/fit's (on the current Keras "
     "backend)."),
    (flags.DEFINE_bool, "skip_non_finite", True,
     "--mode=train --route=fit: the optimizer skips non-finite updates (false: the bare "
     "Adam, to measure what skipping costs)."),
    (flags.DEFINE_string, "model_dir", None, "--mode=decode_file or pipeline: the run "
                                             "directory."),
    (flags.DEFINE_string, "checkpoint", None, "--mode=decode_file: the checkpoint (default: "
                                              "the run's latest)."),
    (flags.DEFINE_string, "input", None, "--mode=decode_file: the source text file."),
    (flags.DEFINE_string, "reference", None, "--mode=decode_file: its reference (BLEU)."),
    # A string, not a list flag: deep-nmt-train's --config (a string) may share it in-process.
    (flags.DEFINE_string, "config", None, "Presets or YAML files, comma-separated (default: "
                                          f"{','.join(DEFAULT_CONFIGS)})."),
    (flags.DEFINE_multi_string, "override", [],
     "Config overrides KEY=VALUE applied to each training config (--mode=train) or to the "
     "run's config (--mode=decode_file, pipeline)."),
    (flags.DEFINE_integer, "steps", 5, "Timed training steps per repeat (--mode=pipeline: "
                                       "batches)."),
    (flags.DEFINE_integer, "repeats", 3, "Timed repeats (the median is reported)."),
    (flags.DEFINE_integer, "warmup", 2, "Untimed warm-up steps (tracing and first runs; "
                                        "--mode=pipeline: batches)."),
    (flags.DEFINE_bool, "jit_compile", False,
     "Compile with XLA: the training step, or the search with --mode=decode (--mode="
     "decode_file: unless given, the translation tools' choice for this machine)."),
    (flags.DEFINE_integer, "threads", 0, "intra/inter-op threads (0: TensorFlow's default)."),
    (flags.DEFINE_string, "output", None, "Also append the JSON results to this file."),
    (flags.DEFINE_bool, "unknown_shapes", False,
     "Training: give the step batches of unknown static shape ([None, None]), as a real run's "
     "length-bucketed input does, instead of the fixed [64, 32] batches."),
    (flags.DEFINE_bool, "diagnostics", False,
     "Training: compute the grad-norm ratio (Bapna et al.'s r_t) on every timed step."),
    PRECISION_FLAG,
])


def _configs():
    """The ``--config`` names (presets or files)."""
    names = [n.strip() for n in (FLAGS.config or ",".join(DEFAULT_CONFIGS)).split(",")]
    return [n for n in names if n]


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


_FILE_FLAGS = ("model_dir", "checkpoint", "input", "reference")


def _check_mode_flags():
    """Refuses a flag the chosen ``--mode`` would silently ignore."""
    if FLAGS.mode == "pipeline":
        if not FLAGS.model_dir:
            raise app.UsageError("--mode=pipeline needs --model_dir (a run directory)")
        given = [f"--{name}" for name in ("config", "checkpoint", "input", "reference",
                                          "precision", "jit_compile", "route", "diagnostics",
                                          "skip_non_finite", "threads", "unknown_shapes")
                 if FLAGS[name].present]
        if given:
            raise app.UsageError(f"{', '.join(given)}: not used with --mode=pipeline")
        return
    if FLAGS.mode == "decode_file":
        if not FLAGS.model_dir or not FLAGS.input:
            raise app.UsageError("--mode=decode_file needs --model_dir and --input")
        if FLAGS["config"].present:
            raise app.UsageError("--config is not used with --mode=decode_file (the run's "
                                 "config is; change it with --override)")
        return
    given = [f"--{name}" for name in _FILE_FLAGS if FLAGS[name].present]
    if given:
        also = " (--model_dir also with --mode=pipeline)" if FLAGS.model_dir else ""
        raise app.UsageError(f"{', '.join(given)}: only used with --mode=decode_file{also}")
    if FLAGS.mode in ("decode", "step_ops") and FLAGS.override:
        raise app.UsageError(f"--override applies to --mode=train only (--mode={FLAGS.mode} "
                             "measures the presets' or the files' shapes)")
    if FLAGS.mode != "train" and (FLAGS["route"].present or FLAGS["skip_non_finite"].present):
        raise app.UsageError("--route and --skip_non_finite apply to --mode=train only")
    if FLAGS.route == "fit" and FLAGS.unknown_shapes:
        raise app.UsageError("--unknown_shapes applies to --route=loop (fit pads each batch "
                             "to static shapes)")
    if FLAGS.diagnostics and (FLAGS.mode != "train" or FLAGS.route == "fit"):
        raise app.UsageError("--diagnostics applies to --mode=train --route=loop (the custom "
                             "loop's grad-norm ratio)")
    if FLAGS.mode == "train" and FLAGS.precision not in (None, "float32"):
        raise app.UsageError(f"--precision={FLAGS.precision} applies to --mode=decode only; "
                             "train in reduced precision with "
                             "--override=training.precision=mixed_bfloat16 (or mixed_float16)")


def _run_dir_mode():
    """--mode=pipeline or decode_file: one result of a run directory, printed and recorded."""
    from deep_nmt_tf.benchmark import decoding, pipeline
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.data.text_io import DataError

    try:  # (decode_file: the settings chosen, and why, are in the printed line and the JSON)
        if FLAGS.mode == "pipeline":
            result = pipeline.benchmark_pipeline(FLAGS.model_dir, FLAGS.override,
                                                 batches=FLAGS.steps, repeats=FLAGS.repeats,
                                                 warmup=FLAGS.warmup)
            line = pipeline.format_pipeline_result(result)
        else:
            jit = FLAGS.jit_compile if FLAGS["jit_compile"].present else None
            result = decoding.benchmark_file(FLAGS.model_dir, FLAGS.input, FLAGS.reference,
                                             checkpoint=FLAGS.checkpoint,
                                             overrides=FLAGS.override,
                                             precision=FLAGS.precision, jit_compile=jit,
                                             repeats=FLAGS.repeats)
            line = decoding.format_file_results(result)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"benchmark: error: {e}") from None
    print(line, flush=True)
    print(json.dumps(result), flush=True)
    _append_json([result])


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _check_mode_flags()
    if FLAGS.mode == "step_ops":
        from deep_nmt_tf.benchmark.decoding import step_ops
        from deep_nmt_tf.export.graph_ops import format_step_ops

        results = []
        for name in _configs():
            counts = step_ops(name, FLAGS.precision or "float32")
            print(f"{name}:\n{format_step_ops(counts)}", flush=True)
            results.append({"config": name, "precision": FLAGS.precision or "float32",
                            "step_ops": [c.to_dict() for c in counts]})
            print(json.dumps(results[-1]), flush=True)
        _append_json(results)
        return
    if FLAGS.mode in ("pipeline", "decode_file"):
        _run_dir_mode()
        return
    if FLAGS.mode == "decode":
        from deep_nmt_tf.benchmark.decoding import benchmark_decode, format_results

        results = []
        for name in _configs():
            result = benchmark_decode(config=name, modes=("greedy", "beam4"),
                                      paths=("translator", "saved_model"),
                                      repeats=FLAGS.repeats, jit_compile=FLAGS.jit_compile,
                                      threads=FLAGS.threads or None,
                                      precision=FLAGS.precision or "float32")
            # The peer-format lines on stdout too (shared/bench/side_by_side.sh keeps them).
            print(format_results(result), flush=True)
            print(json.dumps(result), flush=True)
            results.append(result)
        _append_json(results)
        return
    from deep_nmt_tf.benchmark.training import benchmark_configs

    try:
        results = benchmark_configs(
            _configs(), on_result=lambda r: print(json.dumps(r), flush=True),
            overrides=list(FLAGS.override), steps=FLAGS.steps, repeats=FLAGS.repeats,
            warmup=FLAGS.warmup, jit_compile=FLAGS.jit_compile, threads=FLAGS.threads,
            unknown_shapes=FLAGS.unknown_shapes, route=FLAGS.route,
            skip_non_finite=FLAGS.skip_non_finite, diagnostics=FLAGS.diagnostics)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    print(json.dumps(results))
    _append_json(results)


def run():
    """Console-script entry point."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
