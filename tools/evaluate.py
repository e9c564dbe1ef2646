r"""Scores a model on a test set: sacreBLEU BLEU (cased and lowercased) and chrF, and the
papers' tokenized BLEU.

One checkpoint (default: the latest)::

    deep-nmt-evaluate --model_dir=runs/demo --source=test.src --reference=test.tgt \
        [--checkpoint=runs/demo/ckpt-1500] [--beam_size=4] [--length_penalty=0.6] \
        [--output=test.hyp]

An existing translation file (no model needed)::

    deep-nmt-evaluate --hypotheses=test.hyp --reference=test.tgt

A window of checkpoints chosen by dev BLEU (Chen et al. 2018 report the mean and standard
deviation of test BLEU over 21 checkpoints around the best dev checkpoint)::

    deep-nmt-evaluate --model_dir=runs/demo --checkpoint_window=21 \
        [--dev_source=dev.src --dev_reference=dev.tgt]

Every checkpoint of the run (each ``ckpt-N`` with its ``.index``) is scored on dev and test
(the trainer keeps ``training.keep_checkpoints`` of them: set it to at least the window
size).  Without ``--source``/``--reference`` (``--dev_*``) the config's ``data.test_*``
(``data.dev_*``) files are used.

Output: the scores with their sacreBLEU signatures, e.g.::

    BLEU = 31.42 (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0)
    BLEU lowercased = 32.17 (nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0)
    chrF2 = 58.10 (nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0)
    tokenized BLEU = 33.05 (nrefs:1|case:mixed|eff:no|tok:intl|smooth:exp|version:2.6.0)

``tokenized BLEU`` is sacreBLEU with ``tokenize='intl'`` (see
``deep_nmt_tf.decoding.scoring``); ``--json=FILE`` also writes everything as JSON.  Without
``--precision``/``--jit_compile`` the model decodes in the fastest setting for this machine
(:func:`deep_nmt_tf.hardware.fastest_inference_settings`, logged at INFO).

Empty source, reference or hypothesis files are an error (there is nothing to score).
``--output`` and ``--json`` are checked before any decoding, and ``--output`` receives the
translations as they are produced.  A flag the chosen mode would ignore is refused (exit 1,
naming the flag): model flags with ``--hypotheses``, ``--output`` or ``--checkpoint`` with
``--checkpoint_window``, ``--dev_*`` without it.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, List, Optional, Sequence, TextIO

from absl import app, flags, logging

from deep_nmt_tf import cli
from deep_nmt_tf.cli import (COMPILATION_CACHE_FLAG, JIT_COMPILE_FLAG, PRECISION_FLAG,
                             check_output_path, define_flags,
                             parse_flags_with_compilation_cache)

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "model_dir", None, "Model directory (config.yaml, checkpoints)."),
    (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix (default: the latest)."),
    (flags.DEFINE_string, "source", None, "Test source file (default data.test_source)."),
    (flags.DEFINE_string, "reference", None, "Test reference (default data.test_target)."),
    (flags.DEFINE_string, "hypotheses", None,
     "Score this translation file against --reference instead of decoding."),
    (flags.DEFINE_string, "dev_source", None, "Dev source for --checkpoint_window "
                                              "(default data.dev_source)."),
    (flags.DEFINE_string, "dev_reference", None, "Dev reference for --checkpoint_window "
                                                 "(default data.dev_target)."),
    (flags.DEFINE_integer, "checkpoint_window", 0,
     "If > 0: score every checkpoint and report mean/std test BLEU over this many "
     "checkpoints around the best dev BLEU (Chen et al. 2018 use 21)."),
    (flags.DEFINE_integer, "beam_size", None, "Beam size (default decoding.beam_size).", 1),
    (flags.DEFINE_float, "length_penalty", None, "Length penalty alpha (default "
                                                 "decoding.length_penalty).", 0.0),
    (flags.DEFINE_integer, "batch_size", None, "Sentences per batch.", 1),
    (flags.DEFINE_multi_string, "override", [], "Config override KEY=VALUE (repeatable)."),
    (flags.DEFINE_string, "tokenized_bleu_tokenize", "intl",
     "sacreBLEU tokeniser of the tokenized BLEU ('intl', '13a', 'none' ...)."),
    (flags.DEFINE_string, "output", None, "Write the test translations here."),
    (flags.DEFINE_string, "json", None, "Write all scores as JSON here."),
    JIT_COMPILE_FLAG,
    PRECISION_FLAG,
    COMPILATION_CACHE_FLAG,
])


def _read(path: str) -> List[str]:
    """The lines of a file to score or translate; an empty file is an error."""
    from deep_nmt_tf.data.text_io import DataError, read_lines

    lines = list(read_lines(path))
    if not lines:
        raise DataError(f"{path} is empty: nothing to evaluate")
    return lines


def score_files(hypotheses_path: str, reference_path: str,
                tokenized_bleu_tokenize: str = "intl") -> Dict[str, object]:
    """Scores a translation file against a reference file (one segment per line)."""
    from deep_nmt_tf.decoding.scoring import corpus_scores

    return corpus_scores(_read(hypotheses_path), _read(reference_path),
                         tokenized_bleu_tokenize)


def evaluate_translator(translator, source_path: str, reference_path: str,
                        beam_size: Optional[int] = None, length_penalty: Optional[float] = None,
                        batch_size: Optional[int] = None,
                        tokenized_bleu_tokenize: str = "intl",
                        output: Optional[TextIO] = None) -> Dict[str, object]:
    """Translates ``source_path`` and scores it against ``reference_path``.

    Args:
      output: a text file that receives the translations (one per line) as they are produced.

    Returns:
      :func:`deep_nmt_tf.decoding.scoring.corpus_scores` plus ``hypotheses`` (list of str).

    Raises:
      DataError: an empty or unreadable file; ValueError: different line counts.
    """
    from deep_nmt_tf.decoding.scoring import corpus_scores

    sources, references = _read(source_path), _read(reference_path)
    if len(sources) != len(references):
        raise ValueError(f"{source_path} has {len(sources)} lines but {reference_path} has "
                         f"{len(references)}")
    hypotheses: List[str] = []
    for chunk in translator.translate_chunks(sources, beam_size=beam_size,
                                             length_penalty=length_penalty,
                                             batch_size=batch_size):
        texts = [hyps[0].text for hyps in chunk]
        hypotheses.extend(texts)
        if output is not None:
            output.writelines(text.replace("\n", " ") + "\n" for text in texts)
            output.flush()
    # A model trained on lowercased text cannot produce case: score it case-insensitively.
    scores = corpus_scores(hypotheses, references, tokenized_bleu_tokenize,
                           lowercase=translator.config.data.lowercase)
    scores["hypotheses"] = hypotheses
    return scores


def format_scores(scores: Dict[str, object]) -> str:
    return "\n".join([
        f"BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']})",
        f"BLEU lowercased = {scores['bleu_lc']:.2f} ({scores['bleu_lc_signature']})",
        f"chrF2 = {scores['chrf']:.2f} ({scores['chrf_signature']})",
        f"tokenized BLEU = {scores['tok_bleu']:.2f} ({scores['tok_bleu_signature']})",
        f"  {scores['bleu_line']}",
    ])


def evaluate_window(translator, checkpoints: Sequence[str], window: int, dev: Sequence[str],
                    test: Sequence[str], **kwargs) -> Dict[str, object]:
    """Scores every checkpoint on dev and test; mean/std test BLEU over the window.

    Args:
      translator: a :class:`~deep_nmt_tf.inference.Translator` (weights are replaced).
      checkpoints: checkpoint prefixes in training order.
      window: window size.
      dev, test: ``(source, reference)`` paths.
      kwargs: passed to :func:`evaluate_translator`.
    """
    from deep_nmt_tf.decoding.scoring import checkpoint_window, mean_std

    rows = []
    for path in checkpoints:
        translator.restore(path)
        d = evaluate_translator(translator, dev[0], dev[1], **kwargs)
        t = evaluate_translator(translator, test[0], test[1], **kwargs)
        rows.append({"checkpoint": path, "dev_bleu": d["bleu"], "test_bleu": t["bleu"],
                     "test_chrf": t["chrf"], "test_tok_bleu": t["tok_bleu"]})
        logging.info("%s: dev BLEU %.2f, test BLEU %.2f", path, d["bleu"], t["bleu"])
    start, stop, best = checkpoint_window([r["dev_bleu"] for r in rows], window)
    chosen = rows[start:stop]
    out: Dict[str, object] = {"checkpoints": rows, "window_start": start,
                              "window_stop": stop, "best_dev": rows[best]["checkpoint"],
                              "window_size": stop - start, "requested_window": window,
                              "bleu_signature": t["bleu_signature"]}
    for key in ("test_bleu", "test_chrf", "test_tok_bleu"):
        mean, std = mean_std([r[key] for r in chosen])
        out[f"{key}_mean"], out[f"{key}_std"] = mean, std
    return out


# Flags that only a model evaluation reads (an existing --hypotheses file ignores them).
_MODEL_FLAGS = ("model_dir", "checkpoint", "source", "checkpoint_window", "dev_source",
                "dev_reference", "beam_size", "length_penalty", "batch_size", "override",
                "output")


def _check_mode_flags() -> None:
    """Refuses flags the chosen mode would silently ignore, before any work."""
    if FLAGS.hypotheses:
        if not FLAGS.reference:
            raise app.UsageError("--hypotheses needs --reference")
        given = [f"--{name}" for name in _MODEL_FLAGS if FLAGS[name].present]
        if given:
            raise app.UsageError(f"{', '.join(given)}: not used with --hypotheses (it scores an "
                                 "existing translation file; drop --hypotheses to evaluate a "
                                 "model)")
        return
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required (or --hypotheses and --reference)")
    if FLAGS.checkpoint_window > 0:
        for name, why in (("output", "it scores every checkpoint; write one checkpoint's "
                                     "translations with --checkpoint=... --output=..."),
                          ("checkpoint", "the window is chosen among all checkpoints by dev "
                                         "BLEU")):
            if FLAGS[name].present:
                raise app.UsageError(f"--{name} is not used with --checkpoint_window ({why})")
    else:
        for name in ("dev_source", "dev_reference"):
            if FLAGS[name].present:
                raise app.UsageError(f"--{name} is only read with --checkpoint_window=N")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    _check_mode_flags()
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.data.text_io import DataError

    try:
        check_output_path("output", FLAGS.output)  # Before any decoding.
        check_output_path("json", FLAGS.json)
        if FLAGS.hypotheses:
            result = score_files(FLAGS.hypotheses, FLAGS.reference,
                                 FLAGS.tokenized_bleu_tokenize)
            print(format_scores(result))
            if FLAGS.json:
                with open(FLAGS.json, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=2)
        else:
            _evaluate_model()
    except (ConfigError, DataError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"evaluate: error: {e}") from None
    sys.stdout.flush()


def _evaluate_model() -> None:
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.inference import Translator

    precision, jit_compile, _ = cli.inference_settings(FLAGS.precision, FLAGS.jit_compile)
    translator = Translator.from_model_dir(FLAGS.model_dir, checkpoint=FLAGS.checkpoint,
                                           overrides=FLAGS.override,
                                           jit_compile=jit_compile,
                                           search_cache=cli.search_cache_dir(
                                               FLAGS.compilation_cache),
                                           precision=precision)
    data = translator.config.data
    source = FLAGS.source or data.test_source
    reference = FLAGS.reference or data.test_target
    if not source or not reference:
        raise app.UsageError("give --source and --reference (the config has no data.test_*)")
    kwargs = dict(beam_size=FLAGS.beam_size, length_penalty=FLAGS.length_penalty,
                  batch_size=FLAGS.batch_size,
                  tokenized_bleu_tokenize=FLAGS.tokenized_bleu_tokenize)
    if FLAGS.checkpoint_window > 0:
        dev_source = FLAGS.dev_source or data.dev_source
        dev_reference = FLAGS.dev_reference or data.dev_target
        if not dev_source or not dev_reference:
            raise app.UsageError("--checkpoint_window needs --dev_source/--dev_reference (the "
                                 "config has no data.dev_*)")
        checkpoints = CheckpointStore(FLAGS.model_dir).list()  # ckpt-N and .weights.h5
        if len(checkpoints) < FLAGS.checkpoint_window:
            logging.warning("only %d checkpoints in %s for a window of %d (raise "
                            "training.keep_checkpoints)", len(checkpoints), FLAGS.model_dir,
                            FLAGS.checkpoint_window)
        result = evaluate_window(translator, checkpoints, FLAGS.checkpoint_window,
                                 (dev_source, dev_reference), (source, reference), **kwargs)
        for row in result["checkpoints"]:
            print(f"{row['checkpoint']}\tdev BLEU {row['dev_bleu']:.2f}\ttest BLEU "
                  f"{row['test_bleu']:.2f}")
        print(f"best dev: {result['best_dev']}; window of {result['window_size']} checkpoints "
              f"[{result['window_start']}, {result['window_stop']})")
        print(f"test BLEU = {result['test_bleu_mean']:.2f} +- {result['test_bleu_std']:.2f} "
              f"({result['bleu_signature']})")
        print(f"test chrF2 = {result['test_chrf_mean']:.2f} +- {result['test_chrf_std']:.2f}")
        print(f"test tokenized BLEU = {result['test_tok_bleu_mean']:.2f} +- "
              f"{result['test_tok_bleu_std']:.2f}")
    else:
        if FLAGS.output:
            with open(FLAGS.output, "w", encoding="utf-8", newline="\n") as f:
                result = evaluate_translator(translator, source, reference, output=f,
                                             **kwargs)
        else:
            result = evaluate_translator(translator, source, reference, **kwargs)
        result.pop("hypotheses")
        result["checkpoint"] = translator.checkpoint_path
        print(f"checkpoint: {translator.checkpoint_path}")
        print(format_scores(result))
    if FLAGS.json:
        with open(FLAGS.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


def run() -> None:
    """Console-script entry point (``deep-nmt-evaluate``)."""
    # Quiet unless --verbose; ends without the interpreter's TensorFlow teardown.
    cli.run(main, flags_parser=parse_flags_with_compilation_cache, fast_exit=True)


if __name__ == "__main__":
    run()
