"""Helpers shared by the command-line tools (``deep_nmt_tf.tools``, absl binaries).

absl's ``FLAGS`` is one registry per process, and several tools may be imported into the same
process (tests, notebooks, a tool reusing another's functions); defining a flag twice is an
error.  :func:`define_flags` defines a tool's flags, each unless a tool imported earlier already
defined a flag of that name (the earlier definition is then shared).  Every float flag it
defines refuses NaN and infinities (``--length_penalty=nan`` is a flag error, like a value
below the flag's ``lower_bound``).  :func:`check_output_path` lets a tool refuse an output file
it could not write before it does any work.

Every tool starts through :func:`run` (its ``run()`` console-script entry point), which keeps
the output to what the tool has to say.  Unless ``--verbose`` (or ``-v``) is given,
:func:`quiet_tensorflow` hides

* the C++ messages TensorFlow prints while it is imported (twice: the oneDNN notice, the CUDA
  probe ``Could not find cuda drivers``, ``cpu_feature_guard``, the ``absl::InitializeLog``
  notice): they are written before TensorFlow's log level applies, so the first ``import
  tensorflow`` runs with the process's standard error going to a temporary file, and what it
  wrote comes back afterwards without those lines (an import hook, so a tool still imports
  TensorFlow only when it needs it);
* its later C++ messages, the CUDA probe's ``failed call to cuInit`` on machines without a GPU
  among them: ``TF_CPP_MIN_LOG_LEVEL=3`` (a value already set in the environment is kept);
* its Python INFO messages (SavedModel signature input names, checkpoint sharding times,
  assets written), and JAX's (``Unable to initialize backend 'tpu'``): the ``tensorflow``
  logger is raised to WARNING, and INFO records of TensorFlow's and JAX's modules are dropped.

Errors still surface as the tools' own messages and Python exceptions.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import math
import os
import re
import shlex
import signal
import sys
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

from absl import app, flags
from absl import logging as absl_logging

from deep_nmt_tf import eviction, hardware

__all__ = ["define_flags", "check_output_path", "quiet_tensorflow", "run", "PRECISION_FLAG",
           "JIT_COMPILE_FLAG", "MEMORY_CHECK_FLAG", "COMPILATION_CACHE_FLAG",
           "enable_compilation_cache", "xla_cache_dir", "prune_compilation_cache",
           "search_cache_dir", "parse_flags_with_compilation_cache", "inference_settings",
           "resume_command", "exit_interrupted"]

#: ``(flags.DEFINE_xxx, name, default, *arguments)``, e.g.
#: ``(flags.DEFINE_enum, "mode", "train", ["train", "decode"], "What to measure.")``.
FlagDefinition = Tuple[Callable, ...]

_VERBOSE_HELP = ("Show TensorFlow's C++ start-up messages and its INFO logs (hidden by "
                 "default); -v is short for --verbose (absl's own -v=N still sets its "
                 "verbosity).")

#: ``--precision`` of the inference tools (translate, evaluate, export, benchmark's decoding);
#: unset (None): :func:`inference_settings` chooses (the benchmark: float32).
PRECISION_FLAG: FlagDefinition = (
    flags.DEFINE_enum, "precision", None, ["float32", "bfloat16", "float16"],
    "Inference precision: the dtype of the weights and activations (the float32 checkpoint is "
    "rounded when loaded; softmax, LayerNorm statistics and scores stay float32).  Default: "
    "the fastest on this machine (bfloat16 on a CPU with amx_bf16 or avx512_bf16 whose "
    "bfloat16 matmul is measured faster than float32's, else float32; deep-nmt-benchmark: "
    "float32).")

#: ``--jit_compile`` of the inference tools (translate, evaluate, export); unset (None):
#: :func:`inference_settings` chooses.
JIT_COMPILE_FLAG: FlagDefinition = (
    flags.DEFINE_bool, "jit_compile", None,
    "Compile the search with XLA.  Default: the fastest on this machine for the precision "
    "(on, except for bfloat16 on a machine without GPU or TPU).")

#: ``--memory_check`` of the training tools (train, fit): :mod:`deep_nmt_tf.sizing`.
MEMORY_CHECK_FLAG: FlagDefinition = (
    flags.DEFINE_bool, "memory_check", True,
    "Before building the model, estimate its parameters and training memory from the config "
    "and refuse one that cannot fit in the memory available (--nomemory_check: train anyway).")

#: Where XLA keeps compiled searches between runs (``enable_compilation_cache``).
DEFAULT_COMPILATION_CACHE = os.path.join(hardware.cache_home(), "xla")

#: ``--compilation_cache`` of the tools that compile searches (translate, evaluate).
COMPILATION_CACHE_FLAG: FlagDefinition = (
    flags.DEFINE_string, "compilation_cache", DEFAULT_COMPILATION_CACHE,
    "Directory of XLA's persistent compilation cache (cpu-<key>/, one per CPU feature set) and "
    "of traced searches (searches/): a search traced and compiled once for a model and an "
    "input shape is read back by later runs on the same kind of CPU instead of being traced "
    "and compiled again ('' = off).")


def xla_cache_dir(directory: str) -> str:
    """Where XLA's entries for this machine's CPU live: ``DIRECTORY/cpu-<key>``
    (:func:`deep_nmt_tf.hardware.cpu_feature_key`)."""
    return os.path.join(directory, f"cpu-{hardware.cpu_feature_key()}")


def enable_compilation_cache(directory: str) -> bool:
    """Turns on TensorFlow's persistent XLA compilation cache in ``directory``, in the
    sub-directory of this machine's CPU (:func:`xla_cache_dir`).

    Call it before TensorFlow is imported (it needs no TensorFlow import): set later, inside an
    absl ``app.run`` main, the variable was found to be ignored (BENCHMARKS.md); the tools do it
    in :func:`parse_flags_with_compilation_cache`.  TensorFlow keys entries by the compiled graph
    and the device type but not by the CPU's instruction set, and a directory moves between
    machines (in a run directory, a shared home): so XLA reads only the entries compiled for
    this CPU's feature set, never another CPU's (which it would load with "Machine type used for
    XLA:CPU compilation doesn't match").  Returns False (and changes nothing) when ``directory``
    is empty or ``TF_XLA_FLAGS`` already names a cache.
    """
    current = os.environ.get("TF_XLA_FLAGS", "")
    if not directory or "tf_xla_persistent_cache_directory" in current:
        return False
    keyed = xla_cache_dir(directory)
    os.makedirs(keyed, exist_ok=True)
    prune_compilation_cache(directory)
    os.environ["TF_XLA_FLAGS"] = f"{current} --tf_xla_persistent_cache_directory={keyed}"
    return True


#: The most bytes of XLA entries :func:`prune_compilation_cache` leaves (about 1-2 MB each).
COMPILATION_CACHE_MAX_BYTES = 512 * 2**20


def prune_compilation_cache(directory: str, max_bytes: int = COMPILATION_CACHE_MAX_BYTES) -> int:
    """Removes the oldest XLA entries under ``directory`` (TensorFlow's ``xla_compile_cache__*``
    files, by modification time, in every CPU's sub-directory and at the top, where entries of
    an unknown CPU were written before the sub-directories) until the rest fit in ``max_bytes``;
    TensorFlow never evicts them itself.  A removed entry is simply compiled again when next
    needed.  Returns how many were removed."""
    entries = []
    for root, _, names in os.walk(directory):
        for name in names:
            if not name.startswith("xla_compile_cache__"):
                continue
            path = os.path.join(root, name)
            stat = eviction.stat_or_none(path)
            if stat is not None:
                entries.append((path, stat.st_mtime, stat.st_size, (path,)))
    return len(eviction.remove_oldest(entries, budget=max_bytes))


def search_cache_dir(compilation_cache: str) -> Optional[str]:
    """Where the tools keep traced searches (``COMPILATION_CACHE/searches``; None when
    ``--compilation_cache=''``): :class:`deep_nmt_tf.export.search_cache.SearchCache`."""
    return os.path.join(compilation_cache, "searches") if compilation_cache else None


def parse_flags_with_compilation_cache(argv: Sequence[str]):
    """absl ``flags_parser`` of the tools that compile searches (``app.run(main,
    flags_parser=...)``): parses the flags as absl does, then, unless ``--nojit_compile``, turns
    on the persistent XLA cache of ``--compilation_cache`` before TensorFlow is imported."""
    args = app.parse_flags_with_usage(argv)
    if flags.FLAGS.jit_compile is not False:  # None: the tool may choose XLA.
        enable_compilation_cache(flags.FLAGS.compilation_cache)
    return args


def inference_settings(precision: Optional[str], jit_compile: Optional[bool]
                       ) -> Tuple[str, bool, str]:
    """``--precision`` and ``--jit_compile`` of the inference tools: those given, the others
    chosen for this machine by :func:`deep_nmt_tf.hardware.fastest_inference_settings`, which
    is logged once (INFO) when it chose anything.  Returns ``(precision, jit_compile,
    reason)``."""
    settings = hardware.fastest_inference_settings(precision, jit_compile)
    if precision is None or jit_compile is None:
        absl_logging.info("Inference settings: %s (--precision and --jit_compile override)",
                          settings.reason)
    return settings.precision, settings.jit_compile, settings.reason


def load_config_file(path: str, overrides: Sequence[str] = ()):
    """The config of ``--config`` (:func:`deep_nmt_tf.config.load_config`).  A run directory's
    ``config.yaml`` (``run.json`` beside it) records the data paths inside the run directory
    relative to it (``vocab.txt``): such a file is read by its run directory
    (:meth:`deep_nmt_tf.run_dir.RunDir.saved_config`), so that ``--config=MODEL_DIR/config.yaml``
    works from any working directory (a resume, a kept checkpoint's run directory, a run used as
    a template)."""
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.run_dir import CONFIG_FILENAME, METADATA_FILENAME, RunDir

    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == CONFIG_FILENAME and os.path.isfile(
            os.path.join(directory, METADATA_FILENAME)):
        return RunDir(directory).saved_config(overrides)
    return load_config(path, overrides)


def resume_command(drop: Sequence[str] = ()) -> str:
    """The running tool's command line, quoted for a shell, without the arguments in ``drop``
    (``python tools/x.py`` and ``python -m`` runs get the interpreter in front)."""
    argv = [a for a in sys.argv if a not in drop]
    if argv and argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    return " ".join(shlex.quote(a) for a in argv)


def exit_interrupted(tool: str, error, drop: Sequence[str] = ()) -> None:
    """Ends a tool whose training stopped on a signal (a ``TrainingInterrupted``, which has
    saved a checkpoint): its message and the command that resumes on stderr, no traceback, exit
    status 128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C)."""
    print(f"{tool}: {error}\n{tool}: resume with: {resume_command(drop)}", file=sys.stderr)
    sys.exit(128 + int(getattr(signal, getattr(error, "signal_name", ""), signal.SIGTERM)))


def _kind(flag) -> str:
    return f"{type(flag).__name__} with {type(flag.parser).__name__}"


def define_flags(definitions: Sequence[FlagDefinition], flag_values=flags.FLAGS) -> None:
    """Calls ``define(name, default, *arguments)`` for each definition whose name is not yet
    in ``flag_values`` (absl's global ``FLAGS`` by default).

    Raises ``absl.flags.Error`` when a flag of that name exists with another type (e.g. a list
    flag where this tool needs a string): the two tools cannot share it.
    """
    for define, name, default, *arguments in definitions:
        if name not in flag_values:
            define(name, default, *arguments, flag_values=flag_values)
            if define is flags.DEFINE_float:
                flags.register_validator(name, _finite, message="must be a finite number",
                                         flag_values=flag_values)
            continue
        wanted = flags.FlagValues()
        define(name, default, *arguments, flag_values=wanted)
        if _kind(wanted[name]) != _kind(flag_values[name]):
            raise flags.Error(f"flag --{name} is already defined with another type "
                              f"({_kind(flag_values[name])}); this tool needs "
                              f"{_kind(wanted[name])}")


def _finite(value) -> bool:
    return value is None or math.isfinite(value)


def check_output_path(flag: str, path: str) -> None:
    """Raises ``ValueError`` (naming ``--flag=path``) when ``path`` cannot be written: it is a
    directory, its directory does not exist, or there is no permission.  Nothing is created or
    truncated.  ``-`` (stdout) and empty paths pass."""
    if not path or path == "-":
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        problem = "it is a directory"
    elif not os.path.isdir(directory):
        problem = f"the directory {directory} does not exist"
    elif not os.access(path if os.path.exists(path) else directory, os.W_OK):
        problem = "permission denied"
    else:
        return
    raise ValueError(f"--{flag}={path}: cannot write it: {problem}")


define_flags([(flags.DEFINE_bool, "verbose", False, _VERBOSE_HELP)])


# C++ log lines of INFO/WARNING level (absl's format: I0000 00:00:1795442666.200810 20148
# port.cc:153] ...), absl's notice about them, cpu_feature_guard's second line, and the CUDA
# probe's error on machines without a GPU.
_CHATTER = re.compile(r"^(?:[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] |"
                      r"WARNING: All log messages before absl::InitializeLog\(\) |"
                      r"To enable the following instructions: |"
                      r"E\d{4} .*failed call to cuInit)")


@contextlib.contextmanager
def _stderr_without(pattern):
    """Standard error (the file descriptor, C++ writes included) goes to a temporary file; its
    lines that do not match ``pattern`` are written back at the end."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines(True) if not pattern.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


class _QuietLoader(importlib.abc.Loader):
    """A module loader whose ``exec_module`` runs under :func:`_stderr_without`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        with _stderr_without(_CHATTER):
            self._loader.exec_module(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, with a loader that filters its start-up messages."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _NoLibraryInfo(logging.Filter):
    """Drops the INFO records of TensorFlow's and JAX's modules (they log through absl's logger
    or the root logger, as the tools do)."""

    _PACKAGES = tuple(f"{os.sep}{name}{os.sep}" for name in ("tensorflow", "jax", "jaxlib"))

    def filter(self, record):
        return record.levelno >= logging.WARNING or not any(
            package in record.pathname for package in self._PACKAGES)


def quiet_tensorflow(verbose: bool = False) -> None:
    """Hides TensorFlow's start-up chatter (module docstring) unless ``verbose``; call it before
    TensorFlow is imported (it prints most of it while it is imported)."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    handler = absl_logging.get_absl_handler()  # The tools' handler (app.run installs it).
    if not any(isinstance(f, _NoLibraryInfo) for f in handler.filters):
        handler.addFilter(_NoLibraryInfo())
    if "tensorflow" not in sys.modules and not any(
            isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def _is_number(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _verbose_argv(argv: Sequence[str]) -> Tuple[List[str], bool]:
    """``-v`` becomes ``--verbose`` (unless a number follows: absl's ``-v N``); whether the
    command line asks for verbose output (the last of ``--[no]verbose[=...]`` wins)."""
    out, verbose = [], False
    for i, arg in enumerate(argv):
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg == "-v" and not (i + 1 < len(argv) and _is_number(argv[i + 1])):
            arg = "--verbose"
        if arg in ("--verbose", "--verbose=true", "--verbose=1", "--verbose=True"):
            verbose = True
        elif arg in ("--noverbose", "--verbose=false", "--verbose=0", "--verbose=False"):
            verbose = False
        out.append(arg)
    return out, verbose


def run(main: Callable[[Sequence[str]], None], argv: Optional[Sequence[str]] = None,
        flags_parser: Optional[Callable] = None, fast_exit: bool = False) -> None:
    """Runs a tool's ``main`` with absl (``app.run``, with ``flags_parser`` when given, e.g.
    :func:`parse_flags_with_compilation_cache`) after :func:`quiet_tensorflow` (unless
    ``--verbose``/``-v``).

    ``fast_exit``: after a successful ``main``, flush the output streams and the logs and end
    the process with ``os._exit(0)``, skipping the interpreter's teardown of TensorFlow (about
    0.8-1.2 s after a translation on the reference machine, more than the translation of a
    sentence; BENCHMARKS.md).  Only for console-script entry points whose ``main`` has closed
    its files; a failing ``main`` exits as usual.
    """
    argv, verbose = _verbose_argv(list(sys.argv if argv is None else argv))
    quiet_tensorflow(verbose)
    try:
        if flags_parser is None:
            app.run(main, argv=argv)
        else:
            app.run(main, argv=argv, flags_parser=flags_parser)
    except SystemExit as e:
        if not fast_exit or e.code not in (0, None):
            raise
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # A closed pipe: nothing more to deliver.
                pass
        absl_logging.flush()
        logging.shutdown()
        os._exit(0)
