r"""Translates text files (or stdin) with a trained model.

    deep-nmt-translate --model_dir=runs/demo --input=test.src --output=test.hyp \
        [--checkpoint=runs/demo/ckpt-1500] [--beam_size=4] [--length_penalty=0.6] \
        [--n_best=1] [--batch_size=32] [--override=decoding.max_length_a=2]

    echo "Ta broku glimo vasu." | deep-nmt-translate --model_dir=runs/demo

One output line per input line, in input order (batches are sorted by length internally).
With ``--n_best`` > 1 the output uses the Moses n-best format, ``i ||| translation ||| score``
(``i`` the 0-based line number, hypotheses best first); an ``--n_best`` above the beam size is
an error.  A progress bar goes to stderr when reading a file.  Defaults of the search come
from the model's ``config.yaml`` (``decoding``).  Without ``--precision``/``--jit_compile`` the
fastest setting for this machine is used (:func:`deep_nmt_tf.hardware.fastest_inference_settings`,
logged at INFO: bfloat16 without XLA on a CPU with ``amx_bf16`` or ``avx512_bf16`` whose
bfloat16 matmul is measured faster than float32's, else float32).

``--output`` is checked before the model is loaded (an impossible path fails at once) and opened
when decoding starts; the translations are written as they are produced, a chunk of
``16 * batch_size`` lines at a time, so an interrupted run keeps what it translated.
"""

from __future__ import annotations

import sys
from typing import Iterable, List, Optional, Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import (COMPILATION_CACHE_FLAG, JIT_COMPILE_FLAG, PRECISION_FLAG,
                             check_output_path, define_flags,
                             parse_flags_with_compilation_cache)

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_string, "model_dir", None, "Model directory (config.yaml, checkpoints)."),
    (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix (default: the latest)."),
    (flags.DEFINE_string, "input", "-", "Source text file, one sentence per line "
                                        "('-': stdin)."),
    (flags.DEFINE_string, "output", "-", "Output file ('-': stdout)."),
    (flags.DEFINE_integer, "beam_size", None, "Beam size (default decoding.beam_size).", 1),
    (flags.DEFINE_float, "length_penalty", None,
     "GNMT length penalty alpha (default decoding.length_penalty).", 0.0),
    (flags.DEFINE_integer, "n_best", 1, "Hypotheses per sentence (> 1: Moses n-best "
                                        "format; at most the beam size).", 1),
    (flags.DEFINE_integer, "batch_size", None, "Sentences per batch (default "
                                               "decoding.batch_size).", 1),
    (flags.DEFINE_multi_string, "override", [],
     "Config override KEY=VALUE, e.g. decoding.max_length_a=2 (repeatable)."),
    JIT_COMPILE_FLAG,
    PRECISION_FLAG,
    COMPILATION_CACHE_FLAG,
    (flags.DEFINE_bool, "progress", None, "Show a progress bar (default: when --input is "
                                          "a file)."),
])


def read_lines(path: str) -> List[str]:
    """Lines of a UTF-8 file (``-``: stdin) without line terminators.

    Raises:
      DataError: invalid UTF-8 (naming the file and line) or a missing file.
    """
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.data.text_io import read_lines as read_file_lines

    if path != "-":
        return list(read_file_lines(path))
    lines = []
    for number, raw in enumerate(sys.stdin.buffer.read().split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"<stdin>:{number}: invalid UTF-8 ({e.reason})") from None
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def format_output(results, n_best: int, offset: int = 0) -> Iterable[str]:
    """Output lines: the best translation per sentence, or Moses n-best lines (numbered from
    ``offset``)."""
    for i, hyps in enumerate(results, start=offset):
        if n_best <= 1:
            yield _one_line(hyps[0].text)
        else:
            for hyp in hyps[:n_best]:
                yield f"{i} ||| {_one_line(hyp.text)} ||| {hyp.score:.6f}"


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def open_output(path: str):
    """``path`` opened for writing (``-``: stdout), before any work.

    Raises:
      DataError: it cannot be written (missing directory, a directory, no permission).
    """
    from deep_nmt_tf.data.text_io import DataError

    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise DataError(f"--output={path}: cannot write it: {e.strerror}") from None


def translate_file(translator, input_path: str, output_path: str,
                   beam_size: Optional[int] = None, length_penalty: Optional[float] = None,
                   n_best: Optional[int] = None, batch_size: Optional[int] = None,
                   progress: Optional[bool] = None) -> int:
    """Translates ``input_path`` into ``output_path`` (``-`` = stdin/stdout), writing each chunk
    of translations as soon as it is decoded.

    Returns:
      The number of sentences translated.

    Raises:
      DataError: unreadable input or unwritable output (checked before decoding).
      ValueError: invalid search options (checked before decoding).
    """
    from deep_nmt_tf.progress import ProgressBar

    options = dict(beam_size=beam_size, length_penalty=length_penalty, n_best=n_best or 1,
                   batch_size=batch_size)
    translator.search_options(**options)
    lines = read_lines(input_path)
    if progress is None:
        progress = input_path != "-"
    out = open_output(output_path)
    try:
        done = 0
        for chunk in translator.translate_chunks(
                lines, progress=ProgressBar() if progress and lines else None, **options):
            out.writelines(line + "\n" for line in format_output(chunk, n_best or 1,
                                                                  offset=done))
            out.flush()
            done += len(chunk)
    finally:
        if out is not sys.stdout:
            out.close()
    return len(lines)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required")
    from deep_nmt_tf.config import ConfigError, SearchOptionsError, check_search_options
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.inference import Translator

    if FLAGS.beam_size is not None:  # The flags alone, before the model is loaded.
        try:
            check_search_options(FLAGS.beam_size, FLAGS.n_best, FLAGS.length_penalty or 0.0)
        except SearchOptionsError as e:
            raise app.UsageError(f"--{e.key}={e.value} exceeds --{e.limit_key}={e.limit}"
                                 if e.limit_key else f"--{e.key}: {e.reason}") from None
    try:
        check_output_path("output", FLAGS.output)  # Before loading the model.
        precision, jit_compile, _ = cli.inference_settings(FLAGS.precision, FLAGS.jit_compile)
        translator = Translator.from_model_dir(FLAGS.model_dir, checkpoint=FLAGS.checkpoint,
                                               overrides=FLAGS.override,
                                               jit_compile=jit_compile,
                                               search_cache=cli.search_cache_dir(
                                                   FLAGS.compilation_cache),
                                               precision=precision)
        translate_file(translator, FLAGS.input, FLAGS.output, beam_size=FLAGS.beam_size,
                       length_penalty=FLAGS.length_penalty, n_best=FLAGS.n_best,
                       batch_size=FLAGS.batch_size, progress=FLAGS.progress)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"translate: error: {e}") from None


def run() -> None:
    """Console-script entry point (``deep-nmt-translate``)."""
    # Quiet unless --verbose; ends without the interpreter's TensorFlow teardown.
    cli.run(main, flags_parser=parse_flags_with_compilation_cache, fast_exit=True)


if __name__ == "__main__":
    run()
