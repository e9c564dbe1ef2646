"""Traced searches kept on disk, so that a later process translates without tracing.

Tracing the beam search (building its TensorFlow graph from the Keras layers) is most of what a
one-sentence ``deep-nmt-translate`` does after importing TensorFlow (1.2-1.7 s for the demo
model, BENCHMARKS.md "One-sentence translate"), and building the Keras model only to give the
trace its variables is most of the rest.  A :class:`SearchCache` keeps what a trace produced:
the search's function definitions (the ``FunctionDef`` of the concrete function and of the loop
bodies it calls), which checkpoint variables it reads, and its outputs.  A later process
registers the definitions with TensorFlow's runtime and calls the function by name with
variables read straight from the checkpoint: no Keras model, no trace.  XLA's persistent cache
(``--compilation_cache``) then finds the compiled search too.

An entry is keyed by everything that shapes the traced graph (:func:`search_key`): the model
config, the baked-in decoding parameters, precision, XLA, the input shape, the TensorFlow and
Keras versions, a digest of this package's layer, model and search code, and the CPU's feature
set (:func:`deep_nmt_tf.hardware.cpu_feature_key`: an entry written on another kind of CPU, in
a cache directory that moved with a run or a home directory, is never loaded; the graph itself
is portable, but what TensorFlow and XLA build from it for this CPU is not).  The weights are
not in the key (they are inputs), so a new checkpoint of the same model reuses its entries.
Anything unexpected (a damaged or foreign file, a checkpoint whose variables do not match,
TensorFlow refusing the definitions) makes :meth:`SearchCache.load` return ``None`` with a
WARNING, and the caller traces as usual.  Registering and calling the definitions uses two
TensorFlow internals, the ones ``tf.function`` itself calls (:mod:`deep_nmt_tf.compat`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import tensorflow as tf
from absl import logging

from deep_nmt_tf import compat, eviction, hardware
from deep_nmt_tf.checkpointing import model_variable_key

__all__ = ["SearchCache", "CachedSearch", "search_key"]

#: Bumped when the file layout changes (old entries then simply miss).
CACHE_FORMAT = 1
#: Entries a :class:`SearchCache` keeps by default (each a few hundred KB).
DEFAULT_MAX_ENTRIES = 256
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CODE = ("layers", "models", "decoding", "compat.py", "constants.py", "export/module.py",
         "export/search_cache.py")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """sha256 of the package code a traced search is built from."""
    digest = hashlib.sha256()
    for entry in _CODE:
        path = os.path.join(_PACKAGE_DIR, entry)
        files = ([os.path.join(root, name) for root, _, names in os.walk(path)
                  for name in names if name.endswith(".py")] if os.path.isdir(path) else [path])
        for name in sorted(files):
            digest.update(os.path.relpath(name, _PACKAGE_DIR).encode())
            with open(name, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def search_key(model_config, decoding, precision: str, jit_compile: bool, min_length: int,
               shape: Sequence[int]) -> str:
    """The cache key of a search: a hex digest of what determines its traced graph.

    Args:
      model_config: the ``model`` section (a dataclass).
      decoding: the :class:`~deep_nmt_tf.config.DecodingConfig` the search was built with
        (beam size, n-best and length limits are baked in; the length penalty is an input).
      precision: the inference precision (``float32``, ``bfloat16``, ``float16``).
      jit_compile: whether the search is compiled with XLA.
      min_length: the search's minimum output length.
      shape: the source ids' shape ``(batch, width)``.

    The CPU's feature set (:func:`deep_nmt_tf.hardware.cpu_feature_key`) is part of the key.
    """
    import keras

    from deep_nmt_tf.config import config_to_dict

    payload = {
        "format": CACHE_FORMAT, "tensorflow": tf.__version__, "keras": keras.__version__,
        "code": _code_digest(), "model": config_to_dict(model_config),
        "decoding": dataclasses.asdict(decoding), "precision": precision,
        "jit_compile": bool(jit_compile), "min_length": int(min_length),
        "shape": [int(s) for s in shape], "cpu": hardware.cpu_feature_key(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _rename_functions(functions: List, suffix: str) -> str:
    """Gives every function a name ending in ``suffix`` (a trace's names are only unique within
    its process) and updates the references between them; returns the last (outer) one's."""
    renamed = {f.signature.name: f"{f.signature.name}_{suffix}" for f in functions}

    def fix(attr):
        if attr.HasField("func") and attr.func.name in renamed:
            attr.func.name = renamed[attr.func.name]
        if attr.HasField("list"):
            for func in attr.list.func:
                if func.name in renamed:
                    func.name = renamed[func.name]

    for f in functions:
        f.signature.name = renamed[f.signature.name]
        for node in f.node_def:
            for attr in node.attr.values():
                fix(attr)
    return functions[-1].signature.name


class CachedSearch:
    """A registered search function: ``(source_ids, length_penalty, variables) -> dict``.

    ``variables`` is the model's variable list in checkpoint order (``model/variables/<i>``);
    :meth:`read_variables` makes it from a checkpoint without building the model.
    """

    def __init__(self, name: str, outputs: Sequence[str], captures: Sequence[int],
                 variables: Dict[str, List]):
        self.name = name
        self.outputs = list(outputs)
        self.captures = list(captures)
        self.variable_specs = variables  # str(index) -> [shape, dtype]

    def __call__(self, source_ids, length_penalty, variables) -> Dict[str, tf.Tensor]:
        inputs = [tf.convert_to_tensor(source_ids, tf.int32),
                  tf.convert_to_tensor(length_penalty, tf.float32)]
        inputs += [variables[i].handle for i in self.captures]
        return dict(zip(self.outputs, compat.call_function(self.name, inputs,
                                                           len(self.outputs))))

    def read_variables(self, checkpoint: str) -> Optional[Dict[int, tf.Variable]]:
        """The variables the search reads, from a trainer or averaged checkpoint (cast to the
        recorded dtype); ``None`` if the checkpoint lacks one or holds another shape."""
        reader = tf.train.load_checkpoint(checkpoint)
        shapes = reader.get_variable_to_shape_map()
        out = {}
        for i in self.captures:
            key = model_variable_key(i)
            shape, dtype = self.variable_specs[str(i)]
            if key not in shapes or list(shapes[key]) != list(shape):
                return None
            out[i] = tf.Variable(tf.cast(reader.get_tensor(key), dtype), trainable=False)
        return out


class SearchCache:
    """A directory of traced searches (module docstring).

    The directory is bounded: saving an entry removes the least recently used ones beyond
    ``max_entries`` (an entry is "used" when written or loaded; a few hundred KB each).

    Args:
      directory: where the entries live (created when the first one is saved).
      max_entries: how many entries to keep at most (>= 1).
    """

    def __init__(self, directory: str, max_entries: int = DEFAULT_MAX_ENTRIES):
        if int(max_entries) < 1:
            raise ValueError(f"SearchCache: max_entries must be at least 1, got {max_entries}")
        self.directory = directory
        self.max_entries = int(max_entries)
        self._loaded: Dict[str, CachedSearch] = {}

    def _paths(self, key: str):
        base = os.path.join(self.directory, key)
        return base + ".functions.pb", base + ".json"

    def save(self, key: str, concrete_function, variables: Sequence[tf.Variable]) -> bool:
        """Writes the entry of a traced search (``tf.function.get_concrete_function`` of the
        ``(source_ids, length_penalty)`` search) whose captures are among ``variables`` (the
        model's, in checkpoint order).  Returns False (nothing written) when it cannot."""
        from tensorflow.core.framework import function_pb2

        index = {id(v.handle): i for i, v in enumerate(variables)}
        try:
            captures = [index[id(t)] for t in concrete_function.captured_inputs]
        except KeyError:  # A capture that is not a model variable: not cacheable.
            return False
        outputs = concrete_function.structured_outputs
        if not isinstance(outputs, dict):
            return False
        library = function_pb2.FunctionDefLibrary()
        library.function.extend(concrete_function.graph.as_graph_def().library.function)
        library.function.append(concrete_function.function_def)
        meta = {"format": CACHE_FORMAT, "outputs": sorted(outputs), "captures": captures,
                "variables": {str(i): [list(variables[i].shape), variables[i].dtype.name]
                              for i in captures}}
        functions_path, meta_path = self._paths(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            for path, data in ((functions_path, library.SerializeToString()),
                               (meta_path, json.dumps(meta).encode())):
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
        except OSError as e:
            logging.warning("Search cache: could not write %s: %s", functions_path, e)
            return False
        self._prune(keep=key)
        return True

    def _prune(self, keep: str):
        """Removes the least recently used entries beyond ``max_entries`` (never ``keep``)."""
        try:
            keys = [n[:-len(".json")] for n in os.listdir(self.directory) if n.endswith(".json")]
        except OSError:
            return
        entries = []
        for key in keys:
            stat = eviction.stat_or_none(self._paths(key)[1])
            if stat is not None and key != keep:
                entries.append((key, stat.st_mtime, 1, self._paths(key)))
        for key in eviction.remove_oldest(entries, budget=self.max_entries - 1):
            self._loaded.pop(key, None)

    def _touch(self, key: str):
        """Marks ``key`` as used (its files' modification time) for :meth:`_prune`."""
        for path in self._paths(key):
            try:
                os.utime(path)
            except OSError:
                pass

    def load(self, key: str) -> Optional[CachedSearch]:
        """The entry of ``key`` registered with TensorFlow's runtime, or ``None`` (no entry, or
        one that cannot be used: a WARNING says why)."""
        if key in self._loaded:
            return self._loaded[key]
        from tensorflow.core.framework import function_pb2

        functions_path, meta_path = self._paths(key)
        if not (os.path.exists(functions_path) and os.path.exists(meta_path)):
            return None
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            if meta.get("format") != CACHE_FORMAT:
                return None
            library = function_pb2.FunctionDefLibrary()
            with open(functions_path, "rb") as f:
                library.ParseFromString(f.read())
            functions = list(library.function)
            name = _rename_functions(functions, key[:16])
            compat.register_function_defs(functions)
            cached = CachedSearch(name, meta["outputs"], meta["captures"], meta["variables"])
        except Exception as e:  # noqa: BLE001  (a damaged entry must not stop translation)
            logging.warning("Search cache: ignoring %s (%s: %s); tracing instead",
                            functions_path, type(e).__name__, e)
            return None
        self._loaded[key] = cached
        self._touch(key)
        return cached
