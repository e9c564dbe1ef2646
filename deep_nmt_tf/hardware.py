"""Which machine a result came from: the CPU by name, family and model, the core count and the
TensorFlow version, recorded with each run of ``deep-nmt-experiment`` and each result of
``deep-nmt-benchmark --output``.

A cloud CPU's model name is often just "AMD EPYC", the same for generations that differ 1.6x in
speed on this package's models (docs/RESULTS.md): the family and model numbers tell them apart,
and wall times compare only between runs on the same machine.
"""

import os
import platform
from typing import Dict

__all__ = ["cpu_name", "describe_machine", "record_hardware"]


def cpu_name(cpuinfo: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` text, with its family and model numbers
    appended where they are given (``"AMD EPYC (cpu family 26, model 2)"``); ``""`` when the
    text names no CPU."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    name = fields.get("model name", "")
    ids = [f"{k} {fields[k]}" for k in ("cpu family", "model") if fields.get(k)]
    return f"{name} ({', '.join(ids)})" if name and ids else name


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
