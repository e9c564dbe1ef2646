"""Warm start and freezing of sub-modules (Chen et al. 2018 section 6: the cascaded and
multi-column hybrids start from pre-trained, optionally frozen, encoders).

Config (``training`` section)::

    warm_start:
      checkpoint: runs/rnmt_plus       # ckpt-N, or a model directory (its latest checkpoint)
      source: encoder                  # sub-module of that run's model
      target: encoder/stages/0         # sub-module of this model (empty: = source)
    freeze: [encoder/stages/0]         # sub-modules not trained (excluded from the optimizer)

Each ``warm_start`` key takes one value or a list: entry i copies ``source[i]`` of
``checkpoint[i]`` into ``target[i]`` (one source/target applies to every checkpoint), e.g. a
multi-column encoder from two runs: ``checkpoint: [runs/rnmt, runs/trans_rnmt]``, ``source:
encoder``, ``target: [encoder/columns/0, encoder/columns/1]``.

A sub-module is a ``/``-separated attribute path from the :class:`~deep_nmt_tf.models.
Seq2SeqModel` (``encoder``, ``decoder``, ``encoder/stages/0`` (a cascade's first stage),
``encoder/columns/0``
(multi-column; integers index lists), ``decoder/embedding`` ...).

The earlier run's model is described by the ``config.yaml`` of the checkpoint's directory; it is
built (variables only) to learn the path of every checkpointed variable (the checkpoint stores
``model.variables`` by position, :mod:`deep_nmt_tf.checkpointing`), and the values are read
with ``tf.train.load_checkpoint``.  Source and target weights (trainable and non-trainable; not
the dropout seed states) are matched by their path relative to the sub-module
(``layer_0/forward/cell/kernel`` ...); any variable missing on either side or with a different
shape is a :class:`~deep_nmt_tf.config.ConfigError` listing all of them.  Sub-modules share
variables as the model does (e.g. a tied source/target embedding belongs to the encoder, so
freezing the encoder freezes it for the decoder too).

The runner (:mod:`deep_nmt_tf.training.runner`) warm-starts only when the run directory has no
checkpoint of its own (a resumed run restores its own weights); freezing holds throughout
(:func:`trainable_variables`).
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import tensorflow as tf
from absl import logging

from deep_nmt_tf.checkpoints import TF_CHECKPOINT, CheckpointStore
from deep_nmt_tf.config import Config, ConfigError
from deep_nmt_tf.run_dir import RunDir

__all__ = ["resolve_module", "module_weights", "warm_start", "frozen_variables",
           "trainable_variables"]


def resolve_module(model, path: str, key: str, source: str = "<config>"):
    """The sub-module of ``model`` at ``path`` (``encoder/stages/0``); ConfigError naming
    ``key``."""
    node = model
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ConfigError(f"{source}: {key}: empty sub-module path")
    for i, part in enumerate(parts):
        try:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        except (AttributeError, IndexError, TypeError, KeyError):
            node = None
        if node is None or not (isinstance(node, (list, tuple)) or hasattr(node, "weights")):
            raise ConfigError(f"{source}: {key}: {'/'.join(parts[:i + 1])!r} is not a "
                              f"sub-module of the {_describe(model)}")
    if not hasattr(node, "weights"):
        raise ConfigError(f"{source}: {key}: {path!r} is not a layer")
    return node


def _describe(model) -> str:
    """``Seq2SeqModel (encoder rnmt_plus, decoder transformer)`` for messages."""
    cfg = getattr(model, "model_config", None)
    if cfg is None:
        return type(model).__name__
    return f"{type(model).__name__} (encoder {cfg.encoder.type}, decoder {cfg.decoder.type})"


def module_weights(module) -> Dict[str, object]:
    """``{path relative to the module: variable}`` of the module's weights (shared variables
    created elsewhere keep their full path)."""
    prefix = getattr(module, "path", module.name) + "/"
    out = {}
    for v in module.weights:
        rel = v.path[len(prefix):] if v.path.startswith(prefix) else v.path
        if rel in out:
            raise ValueError(f"two variables with the path {rel!r} in {module.name}")
        out[rel] = v
    return out


def _checkpoint_path(checkpoint: str, source: str) -> str:
    path = checkpoint
    if tf.io.gfile.isdir(checkpoint):
        # The newest ckpt-N that can be read (warm start reads variables by name).
        path = CheckpointStore(checkpoint).latest(kinds=[TF_CHECKPOINT])
    if not path or not tf.io.gfile.exists(path + ".index"):
        raise ConfigError(f"{source}: training.warm_start.checkpoint: no checkpoint at "
                          f"{checkpoint!r}")
    return path


def warm_start_entries(config: Config) -> List[Tuple[str, str, str]]:
    """``(checkpoint, source, target)`` of each ``training.warm_start`` entry."""
    ws = config.training.warm_start
    n = len(ws.checkpoint)

    def pick(values, i, default):
        return values[i] if len(values) == n else values[0] if values else default

    out = []
    for i, checkpoint in enumerate(ws.checkpoint):
        source = pick(ws.source, i, "encoder")
        out.append((checkpoint, source, pick(ws.target, i, source)))
    return out


def warm_start(model, config: Config) -> List[str]:
    """Copies each ``training.warm_start`` source of its checkpointed run into its target in
    ``model``.  Returns the target variable paths loaded."""
    loaded = []
    for entry in warm_start_entries(config):
        loaded += _warm_start_one(model, config, *entry)
    return loaded


def _warm_start_one(model, config: Config, checkpoint: str, source: str,
                    target: str) -> List[str]:
    from deep_nmt_tf.models import build_model

    src = config.source
    path = _checkpoint_path(checkpoint, src)
    earlier = RunDir(os.path.dirname(path))
    earlier_config = earlier.saved_config()
    if earlier_config is None:
        raise ConfigError(f"{src}: training.warm_start.checkpoint: {earlier.config_path} (the "
                          "earlier run's model config) is missing")
    source_model = build_model(earlier_config)
    source_module = resolve_module(source_model, source, "training.warm_start.source", src)
    target_module = resolve_module(model, target, "training.warm_start.target", src)
    index = {id(v): i for i, v in enumerate(source_model.variables)}
    source_weights = module_weights(source_module)
    target_weights = module_weights(target_module)
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    problems: List[str] = []
    values: List[Tuple[object, object]] = []
    for rel in sorted(set(source_weights) | set(target_weights)):
        s, t = source_weights.get(rel), target_weights.get(rel)
        if s is None:
            problems.append(f"{rel}: only in this model's {target}")
            continue
        if t is None:
            problems.append(f"{rel}: only in the checkpoint's {source}")
            continue
        key = f"model/variables/{index[id(s)]}/.ATTRIBUTES/VARIABLE_VALUE"
        if key not in shapes:
            problems.append(f"{rel}: not in the checkpoint {path}")
            continue
        if tuple(shapes[key]) != tuple(t.shape):
            problems.append(f"{rel}: checkpoint shape {tuple(shapes[key])} != "
                            f"{tuple(t.shape)}")
            continue
        values.append((t, reader.get_tensor(key)))
    if problems:
        raise ConfigError(f"{src}: training.warm_start: {source} of {path} does not fit "
                          f"{target} of this model; mismatching variables:\n  " +
                          "\n  ".join(problems))
    for variable, value in values:
        variable.assign(value)
    del source_model
    loaded = [t.path for t, _ in values]
    logging.info("Warm start: %d variables of %s from %s (%s)", len(loaded),
                 target, path, source)
    return loaded


def frozen_variables(model, config: Config) -> List:
    """The variables of the ``training.freeze`` sub-modules."""
    out, seen = [], set()
    for i, module_path in enumerate(config.training.freeze):
        module = resolve_module(model, module_path, f"training.freeze[{i}]", config.source)
        for v in module.weights:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def trainable_variables(model, config: Config) -> List:
    """The model's trainable variables minus the ``training.freeze`` ones (the trainer's
    ``trainable_variables``)."""
    frozen = {id(v) for v in frozen_variables(model, config)}
    if frozen:
        logging.info("Frozen: %d variables (%s)", len(frozen), ", ".join(config.training.freeze))
    return [v for v in model.trainable_variables if id(v) not in frozen]
