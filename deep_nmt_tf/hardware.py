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

What decodes fastest depends on the CPU too (:func:`fastest_inference_settings`, the choice of
``deep-nmt-translate``, ``deep-nmt-evaluate`` and ``deep-nmt-export`` when ``--precision`` or
``--jit_compile`` is not given; BENCHMARKS.md "Decoding" and "The fastest path by default"):

* a CPU with native bfloat16 instructions (``amx_bf16`` or ``avx512_bf16`` in
  ``/proc/cpuinfo``) whose bfloat16 matmuls are in fact faster: bfloat16 without XLA.
  TensorFlow's oneDNN kernels use those instructions; XLA's CPU backend computes bfloat16
  matmuls at about half their rate (AVX512-BF16, BENCHMARKS.md; issue 31 reports 3-4x on AMX).
  The flag alone does not make them fast: on an Intel Xeon (family 6, model 207) that lists
  ``avx512_bf16`` but not AMX (a virtual machine's CPU), oneDNN's bfloat16 matmul runs at
  0.5-0.7x its float32 rate and bfloat16 decoding is the slower setting (BENCHMARKS.md,
  "bfloat16 slower than float32"), so on such a CPU the rate of both is measured once
  (:func:`bfloat16_matmul_speedup`, cached per CPU in :func:`cache_home`) and bfloat16
  chosen only at :data:`BF16_MIN_SPEEDUP` or more.  bfloat16's translation quality was
  measured on such machines (BENCHMARKS.md "bfloat16: translation quality"); without native
  bfloat16 instructions it is never chosen;
* any other CPU, and a CPU whose bfloat16 matmuls are not faster: float32 with XLA (beam 4 on
  an AVX2-only AMD Zen 3: 1.1-1.4x faster in process than the plain graph, greedy search
  alike; 1.3-1.5x on an AVX512-BF16 EPYC before issue 31's lean decoder step);
* a GPU or TPU: float32 with XLA (not measured here).

For a precision given, the XLA setting is the same rule's (XLA, except bfloat16 on a CPU), the
library's default too (:func:`deep_nmt_tf.export.module.default_jit_compile`).
"""

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import platform
import time
from typing import Dict, FrozenSet, Optional, Tuple

from absl import logging

__all__ = ["cpu_name", "cpu_feature_key", "cpu_flags", "describe_machine", "record_hardware",
           "InferenceSettings", "fastest_inference_settings", "NATIVE_BF16_FLAGS",
           "bfloat16_matmul_speedup", "BF16_MIN_SPEEDUP", "cache_home"]

#: ``/proc/cpuinfo`` flags of native bfloat16 matmul instructions (AMX, AVX-512 BF16).
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")

#: bfloat16 is chosen for inference on a CPU only where its matmul runs at least this many times
#: float32's (:func:`bfloat16_matmul_speedup`): 1.9x on an AVX512-BF16 AMD Zen 4, 2.5-3.7x with
#: AMX, 0.5-0.7x on an Intel Xeon that lists ``avx512_bf16`` without AMX (BENCHMARKS.md).
BF16_MIN_SPEEDUP = 1.2


def cache_home() -> str:
    """Where the package keeps what it measured or compiled on this machine between runs:
    ``$XDG_CACHE_HOME/deep_nmt_tf`` (default ``~/.cache/deep_nmt_tf``), read when called."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "deep_nmt_tf")


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


def cpu_flags(cpuinfo: Optional[str] = None) -> FrozenSet[str]:
    """The first processor's feature flags (x86 ``flags``, ARM ``Features``) of ``/proc/cpuinfo``
    text (default this machine's; empty where there is none)."""
    if cpuinfo is None:
        return _this_cpu_flags()
    fields = _first_processor(cpuinfo)
    return frozenset((fields.get("flags", "") + " " + fields.get("Features", "")).split())


@functools.lru_cache(maxsize=1)
def _this_cpu_flags() -> FrozenSet[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return cpu_flags(f.read())
    except OSError:
        return frozenset()


@dataclasses.dataclass(frozen=True)
class InferenceSettings:
    """What :func:`fastest_inference_settings` chose: the inference ``precision``, whether to
    compile the search with XLA (``jit_compile``), and ``reason``, one line naming what decided
    (the CPU features, a GPU, the flags given)."""

    precision: str
    jit_compile: bool
    reason: str


def _has_accelerator() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def _matmul_rates(size: int = 1024, repeats: int = 5, inner: int = 4) -> Tuple[float, float]:
    """GFLOP/s of a ``size``² matmul in float32 and in bfloat16 (TensorFlow's plain graph, the
    process's threads): the best of ``repeats`` timings of ``inner`` products each, the two
    precisions in alternation, so that a background job slows both alike."""
    import tensorflow as tf

    products = {}
    for dtype in (tf.float32, tf.bfloat16):
        x = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), dtype)
        y = tf.cast(tf.random.stateless_normal((size, size), seed=(3, 4)), dtype)
        product = tf.function(lambda x=x, y=y: tf.linalg.matmul(x, y))
        product().numpy()  # Traced and run once, untimed.
        products[dtype.name] = product
    best = {name: float("inf") for name in products}
    for _ in range(repeats):
        for name, product in products.items():
            start = time.perf_counter()
            for _ in range(inner - 1):
                product()
            product().numpy()
            best[name] = min(best[name], time.perf_counter() - start)
    flops = 2.0 * size ** 3 * inner
    return flops / best["float32"] / 1e9, flops / best["bfloat16"] / 1e9


_CACHE_FILE = "bfloat16_speedup.json"


def _read_measurements(path: str) -> Dict:
    """The measurements kept in ``path`` by CPU key; ``{}`` when there is none or it is not a
    JSON object (a damaged file is measured over and replaced)."""
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


@functools.lru_cache(maxsize=None)
def bfloat16_matmul_speedup(cache_dir: Optional[str] = None) -> float:
    """How many times float32's rate this CPU's bfloat16 matmul runs (oneDNN, the plain graph):
    measured once per CPU (:func:`cpu_feature_key`; about a second once TensorFlow has
    started, BENCHMARKS.md) and kept in ``CACHE_DIR/bfloat16_speedup.json`` (default
    :func:`cache_home`) with both rates and the time, so that later runs on the same kind of
    CPU read it back.  A cache that cannot be
    read is measured over; one that cannot be written is only logged."""
    path = os.path.join(cache_dir or cache_home(), _CACHE_FILE)
    key = cpu_feature_key()
    known = _read_measurements(path)
    entry = known.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("speedup"), (int, float)):
        return float(entry["speedup"])
    float32, bfloat16 = _matmul_rates()
    speedup = bfloat16 / float32
    known[key] = {"speedup": round(speedup, 3), "float32_gflops": round(float32, 1),
                  "bfloat16_gflops": round(bfloat16, 1), "cpu": describe_machine(),
                  "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds")}
    logging.info("bfloat16 matmul on this CPU: %.0f GFLOP/s against float32's %.0f (%.2fx); "
                 "kept in %s", bfloat16, float32, speedup, path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError as e:
        logging.warning("Could not keep the bfloat16 measurement in %s (%s): it is measured "
                        "again next time", path, e)
    return speedup


def fastest_inference_settings(precision: Optional[str] = None,
                               jit_compile: Optional[bool] = None, *,
                               cpuinfo: Optional[str] = None,
                               accelerator: Optional[bool] = None,
                               bf16_speedup: Optional[float] = None) -> InferenceSettings:
    """The precision and XLA setting that decode fastest here (module docstring); a
    ``precision`` or ``jit_compile`` given is kept, and the other chosen for it.

    Args:
      precision: ``float32``, ``bfloat16``, ``float16``, or None to choose.
      jit_compile: True/False, or None to choose.
      cpuinfo: ``/proc/cpuinfo`` text (default: this machine's).
      accelerator: whether TensorFlow sees a GPU or TPU (default: asked, which imports
        TensorFlow).
      bf16_speedup: bfloat16's matmul rate over float32's on this CPU, consulted only when the
        precision is to be chosen for a CPU with native bfloat16 flags.  Default: measured
        (:func:`bfloat16_matmul_speedup`) for this machine; for ``cpuinfo`` given, the flags
        decide alone.

    Returns:
      :class:`InferenceSettings`.
    """
    flags = cpu_flags(cpuinfo)
    if accelerator is None:
        accelerator = _has_accelerator()
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if accelerator:
        device = "a GPU or TPU"
    elif native:
        device = f"a CPU with {', '.join(native)}"
    else:
        device = f"a CPU without {' or '.join(NATIVE_BF16_FLAGS)}"
    given = [f"--precision={precision}" if precision is not None else "",
             f"--{'' if jit_compile else 'no'}jit_compile" if jit_compile is not None else ""]
    if precision is None:
        precision = "bfloat16" if native and not accelerator else "float32"
        if precision == "bfloat16" and (bf16_speedup is not None or cpuinfo is None):
            if bf16_speedup is None:
                bf16_speedup = bfloat16_matmul_speedup()
            faster = bf16_speedup >= BF16_MIN_SPEEDUP
            device += (f" whose bfloat16 matmul runs {bf16_speedup:.2f}x float32's, "
                       f"{'at least' if faster else 'under'} {BF16_MIN_SPEEDUP}x")
            precision = "bfloat16" if faster else "float32"
    if jit_compile is None:  # oneDNN's bfloat16 kernels beat XLA's CPU bfloat16 dots
        jit_compile = accelerator or precision != "bfloat16"
    chosen = f"{precision} {'with' if jit_compile else 'without'} XLA"
    given = " ".join(g for g in given if g)
    reason = f"{chosen} for {device}" + (f" ({given} given)" if given else "")
    return InferenceSettings(precision, bool(jit_compile), reason)


def describe_machine() -> str:
    """``"<CPU> (cpu family F, model M), <n> cores, TensorFlow <version>"``: this machine.  Where
    TensorFlow is not installed (a machine with only JAX, say), the framework part is the
    Keras backend and its accelerators instead: ``"..., Keras 3.x on jax, 1 x NVIDIA H100"``."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = cpu_name(f.read())
    except OSError:
        pass
    cpu = cpu or platform.processor() or platform.machine()
    try:
        import tensorflow as tf
    except ImportError:
        return f"{cpu}, {os.cpu_count()} cores, {_keras_backend_description()}"
    return f"{cpu}, {os.cpu_count()} cores, TensorFlow {tf.__version__}"


def _keras_backend_description() -> str:
    import keras

    text = f"Keras {keras.__version__} on {keras.backend.backend()}"
    if keras.backend.backend() == "jax":
        import jax

        accelerators = [d.device_kind for d in jax.devices() if d.platform != "cpu"]
        if accelerators:
            text += f", {len(accelerators)} x {accelerators[0]}"
    return text


def record_hardware(training: Dict, hardware: str) -> None:
    """Adds ``hardware`` to the machines a run has trained on, in ``training["hardware"]``: a
    resumed run may continue on another machine, and its wall time then mixes both, so the
    record names both, joined by ``"; then "``."""
    seen = [h for h in training.get("hardware", "").split("; then ") if h]
    if not seen or seen[-1] != hardware:
        seen.append(hardware)
    training["hardware"] = "; then ".join(seen)
