"""Which machine a result came from: the CPU by name, family and model, the core count and the
TensorFlow version, recorded with each run of ``deep-nmt-experiment`` and each result of
``deep-nmt-benchmark --output``; and which CPU compiled code is for (:func:`cpu_feature_key`).

A cloud CPU's model name is often just "AMD EPYC", the same for generations that differ 1.6x in
speed on this package's models (docs/RESULTS.md): the family and model numbers tell them apart,
and wall times compare only between runs on the same machine.

Compiled code is bound to the CPU it was compiled for: XLA:CPU compiles for the host's
instruction-set extensions and tuning (AVX-512, AMX, Zen's ``prefer-no-gather``), and an entry
of its persistent cache loaded on another CPU is refused with "Machine type used for XLA:CPU
compilation doesn't match" (or runs code the CPU may not have).  Caches directories move with
run directories and home directories between machines, so every cached compiled artifact is
keyed by :func:`cpu_feature_key`: XLA's persistent cache lives in a sub-directory per key
(:func:`deep_nmt_tf.cli.enable_compilation_cache`) and the traced-search cache has it in each
entry's key (:func:`deep_nmt_tf.export.search_cache.search_key`).
"""

import functools
import hashlib
import os
import platform
from typing import Dict, Optional

__all__ = ["cpu_name", "cpu_feature_key", "describe_machine", "record_hardware"]

#: The ``/proc/cpuinfo`` fields (of the first processor) that decide what code a CPU runs:
#: x86 (vendor, family, model, flags) and ARM (implementer, architecture, variant, part,
#: features).
_CPU_IDENTITY = ("vendor_id", "cpu family", "model", "flags", "CPU implementer",
                 "CPU architecture", "CPU variant", "CPU part", "Features")


def cpu_name(cpuinfo: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` text, with its family and model numbers
    appended where they are given (``"AMD EPYC (cpu family 26, model 2)"``); ``""`` when the
    text names no CPU."""
    fields = _first_processor(cpuinfo)
    name = fields.get("model name", "")
    ids = [f"{k} {fields[k]}" for k in ("cpu family", "model") if fields.get(k)]
    return f"{name} ({', '.join(ids)})" if name and ids else name


def _first_processor(cpuinfo: str) -> Dict[str, str]:
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip() and fields:
            break  # The first processor's block ends.
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def cpu_feature_key(cpuinfo: Optional[str] = None) -> str:
    """A 16-hex-digit key of the CPU's instruction set and tuning: vendor, family, model and the
    sorted feature flags of ``/proc/cpuinfo`` (``cpuinfo`` text; default this machine's), with
    the architecture (``platform.machine()``).  Two machines with the same key run each other's
    compiled code; the model number is in it because compilers tune per model (XLA's
    ``prefer-no-gather`` on AMD Zen).  Without ``/proc/cpuinfo`` (not Linux) the platform's
    processor description stands in."""
    if cpuinfo is None:
        return _this_cpu_key()
    fields = _first_processor(cpuinfo)
    identity = [f"machine={platform.machine()}"]
    for key in _CPU_IDENTITY:
        if key in fields:
            value = fields[key]
            if key in ("flags", "Features"):
                value = " ".join(sorted(set(value.split())))
            identity.append(f"{key}={value}")
    if len(identity) == 1:
        identity.append(f"processor={platform.processor()} {platform.system()}")
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _this_cpu_key() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return cpu_feature_key(f.read())
    except OSError:
        return cpu_feature_key("")


def describe_machine() -> str:
    """``"<CPU> (cpu family F, model M), <n> cores, TensorFlow <version>"``: this machine."""
    import tensorflow as tf

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = cpu_name(f.read())
    except OSError:
        pass
    cpu = cpu or platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, TensorFlow {tf.__version__}"


def record_hardware(training: Dict, hardware: str) -> None:
    """Adds ``hardware`` to the machines a run has trained on, in ``training["hardware"]``: a
    resumed run may continue on another machine, and its wall time then mixes both, so the
    record names both, joined by ``"; then "``."""
    seen = [h for h in training.get("hardware", "").split("; then ") if h]
    if not seen or seen[-1] != hardware:
        seen.append(hardware)
    training["hardware"] = "; then ".join(seen)
