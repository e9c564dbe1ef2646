"""Helpers shared by the command-line tools (``deep_nmt_tf.tools``, absl binaries).

absl's ``FLAGS`` is one registry per process, and several tools may be imported into the same
process (tests, notebooks, a tool reusing another's functions); defining a flag twice is an
error.  :func:`define_flags` defines a tool's flags, each unless a tool imported earlier already
defined a flag of that name (the earlier definition is then shared).  Every float flag it
defines refuses NaN and infinities (``--length_penalty=nan`` is a flag error, like a value
below the flag's ``lower_bound``).  :func:`check_output_path` lets a tool refuse an output file
it could not write before it does any work.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence, Tuple

from absl import flags

__all__ = ["define_flags", "check_output_path", "PRECISION_FLAG", "COMPILATION_CACHE_FLAG",
           "enable_compilation_cache", "parse_flags_with_compilation_cache"]

#: ``(flags.DEFINE_xxx, name, default, *arguments)``, e.g.
#: ``(flags.DEFINE_enum, "mode", "train", ["train", "decode"], "What to measure.")``.
FlagDefinition = Tuple[Callable, ...]

#: ``--precision`` of the inference tools (translate, evaluate, export, benchmark's decoding).
PRECISION_FLAG: FlagDefinition = (
    flags.DEFINE_enum, "precision", "float32", ["float32", "bfloat16", "float16"],
    "Inference precision: the dtype of the weights and activations (the float32 checkpoint is "
    "rounded when loaded; softmax, LayerNorm statistics and scores stay float32).")

#: Where XLA keeps compiled searches between runs (``enable_compilation_cache``).
DEFAULT_COMPILATION_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "deep_nmt_tf", "xla")

#: ``--compilation_cache`` of the tools that compile searches (translate, evaluate).
COMPILATION_CACHE_FLAG: FlagDefinition = (
    flags.DEFINE_string, "compilation_cache", DEFAULT_COMPILATION_CACHE,
    "Directory of XLA's persistent compilation cache: a search compiled once for a model and "
    "an input shape is read back by later runs instead of being compiled again ('' = off).")


def enable_compilation_cache(directory: str) -> bool:
    """Turns on TensorFlow's persistent XLA compilation cache in ``directory``.

    Call it before TensorFlow is imported (it needs no TensorFlow import): set later, inside an
    absl ``app.run`` main, the variable was found to be ignored (BENCHMARKS.md); the tools do it
    in :func:`parse_flags_with_compilation_cache`.  Entries are keyed by the compiled graph and the
    device, so a changed model or TensorFlow version simply misses.  Returns False (and changes
    nothing) when ``directory`` is empty or ``TF_XLA_FLAGS`` already names a cache.
    """
    current = os.environ.get("TF_XLA_FLAGS", "")
    if not directory or "tf_xla_persistent_cache_directory" in current:
        return False
    os.makedirs(directory, exist_ok=True)
    os.environ["TF_XLA_FLAGS"] = f"{current} --tf_xla_persistent_cache_directory={directory}"
    return True


def parse_flags_with_compilation_cache(argv: Sequence[str]):
    """absl ``flags_parser`` of the tools that compile searches (``app.run(main,
    flags_parser=...)``): parses the flags as absl does, then, with ``--jit_compile``, turns
    on the persistent XLA cache of ``--compilation_cache`` before TensorFlow is imported."""
    from absl import app

    args = app.parse_flags_with_usage(argv)
    if flags.FLAGS.jit_compile:
        enable_compilation_cache(flags.FLAGS.compilation_cache)
    return args


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
