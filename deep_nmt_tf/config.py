"""Typed configuration: one dataclass tree, loaded from YAML, validated before any work starts.

A config file is a YAML mapping with the sections ``model``, ``data``, ``training`` and
``decoding`` (each optional; defaults below).  A file may start from another one with
``base: other.yaml`` (path relative to the including file); its own keys then override the base.

Every key is declared once, with its default and a one-line description (``help``).  Unknown
keys, wrong types and impossible values raise :class:`ConfigError` naming the file, the line and
the dotted key, e.g.::

    configs/demo.yaml:12: model.num_heads: 6 does not divide model.d_model=256

Command-line overrides use the same dotted keys: ``--override=training.learning_rate=1e-3``;
the value is parsed as YAML (``true``, ``1e-3``, ``[1, 2]`` ...).

Example:
    >>> from deep_nmt_tf.config import load_config
    >>> cfg = load_config("configs/demo.yaml", overrides=["training.train_steps=10"])
    >>> cfg.model.d_model
    128
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Dict, Iterable, List, Optional, Tuple

import yaml

__all__ = [
    "ConfigError",
    "Config",
    "ModelConfig",
    "DataConfig",
    "TrainingConfig",
    "DecodingConfig",
    "TransparentAttentionConfig",
    "DLCLConfig",
    "LexicalShortcutsConfig",
    "RNMTConfig",
    "AdaptiveClippingConfig",
    "HybridConfig",
    "WarmStartConfig",
    "ARCHITECTURES",
    "model_components",
    "load_config",
    "require_training_data",
    "config_from_dict",
    "config_to_dict",
    "save_config",
    "describe_config",
]


class ConfigError(ValueError):
    """A config file or override is invalid.  The message names file, line and key."""


def _field(default, help: str, choices: Optional[Iterable[Any]] = None, min: Optional[float] = None,
           max: Optional[float] = None, min_exclusive: bool = False):
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None,
            "min": min, "max": max, "min_exclusive": min_exclusive}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=type(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TransparentAttentionConfig:
    """Transparent attention (Bapna et al. 2018): decoder attends softmax-mixed encoder layers."""
    enabled: bool = _field(False, "Attend a learned softmax mix of all encoder layer outputs.")
    weight_dropout: float = _field(0.1, "Dropout on the (N+1)xM mix logits before the softmax.",
                                   min=0.0, max=1.0)
    min_probability: float = _field(0.0, "Optional floor p on each source's mix probability: "
                                    "s = p + (1 - (N+1) p) softmax(W); needs (N+1) p <= 1.",
                                    min=0.0, max=1.0)


@dataclasses.dataclass
class DLCLConfig:
    """Dynamic linear combination of layers (Wang et al. 2019)."""
    encoder: bool = _field(False, "Use DLCL in the encoder stack.")
    decoder: bool = _field(False, "Use DLCL in the decoder stack.")
    weights: str = _field("learnable", "Combination weights: learned, fixed all-one or fixed average.",
                          choices=("learnable", "one", "avg"))
    init: str = _field("avg", "Initialisation of learnable weights: 1/(l+1) ('avg') or 1 ('one').",
                       choices=("avg", "one"))
    layer_norm: bool = _field(True, "Apply the layer norms of Eq. 8/9 (off: Table 6 ablation).")
    normalize_embedding: bool = _field(False, "Also normalise y_0 as Eq. 8/9 literally do (pre-norm: "
                                       "LN(y_0) when stored; post-norm: LN of the first "
                                       "combination); the reference never does. Needs layer_norm.")
    window: int = _field(0, "Combine only the last k outputs (0: all).", min=0)
    softmax: bool = _field(False, "Softmax-normalise each row of the weight matrix.")

    def __post_init__(self):
        if self.normalize_embedding and not self.layer_norm:
            raise ConfigError("model.dlcl.normalize_embedding: true needs model.dlcl.layer_norm: "
                              "true (without the layer norms there is nothing to apply to y_0)")


@dataclasses.dataclass
class LexicalShortcutsConfig:
    """Lexical shortcuts (Emelin et al. 2019)."""
    enabled: bool = _field(False, "Gate embedding shortcuts into attention keys and values.")
    variant: str = _field("shortcuts", "'shortcuts' (Eq. 5-12) or 'feature_fusion' (Eq. 13-14).",
                          choices=("shortcuts", "feature_fusion"))
    placement: str = _field("self", "Which attentions get shortcuts (their Table 4).",
                            choices=("self", "cross", "both"))
    source: str = _field("lexical", "'lexical': embeddings; 'non_lexical': layer n-2's output "
                         "(layers 1 and 2: the embeddings); self-attention placement only.",
                         choices=("lexical", "non_lexical"))

    def __post_init__(self):
        if self.source == "non_lexical" and self.placement != "self":
            raise ConfigError("model.lexical_shortcuts.source: 'non_lexical' (Emelin et al. "
                              "section 4.3) is defined for self-attention shortcuts only; use "
                              "placement: self")


#: ``model.architecture`` -> (encoder type, decoder type).  ``deep_nmt_tf.models`` builds each
#: component from its own factory (``ENCODER_BUILDERS`` / ``DECODER_BUILDERS``), so a new
#: encoder/decoder combination (a hybrid, Chen et al. 2018 section 6) is one entry here.
ARCHITECTURES: Dict[str, Tuple[str, str]] = {
    "transformer": ("transformer", "transformer"),
    "rnmt_plus": ("rnmt_plus", "rnmt_plus"),
    # Hybrids (Chen et al. 2018 section 6; deep_nmt_tf.models.hybrid, options under
    # model.hybrid).
    "transformer_rnmt": ("transformer", "rnmt_plus"),
    "rnmt_transformer": ("rnmt_plus", "transformer"),
    "cascaded": ("cascaded", "rnmt_plus"),
    "multi_column": ("multi_column", "rnmt_plus"),
}

#: Encoder types a multi-column encoder's columns may have (``model.hybrid.columns``).
COLUMN_TYPES = ("transformer", "rnmt_plus")


def model_components(model_config) -> Tuple[str, str]:
    """``(encoder_type, decoder_type)`` of a ``ModelConfig``."""
    return ARCHITECTURES[model_config.architecture]


@dataclasses.dataclass
class RNMTConfig:
    """RNMT+ (Chen et al. 2018) components.  ``model.d_model`` is the embedding width and the
    width of the projected encoder output; dropout rates are ``model.input_dropout``
    (embeddings), ``model.residual_dropout`` (each LSTM layer's output) and
    ``model.attention_dropout`` (attention probabilities)."""
    encoder_units: int = _field(0, "LSTM units per direction of each RNMT+ encoder layer "
                                "(0: d_model); layer outputs are twice as wide.", min=0)
    decoder_units: int = _field(0, "LSTM units of each RNMT+ decoder layer (0: d_model).", min=0)
    attention_heads: int = _field(4, "Heads of the multi-head additive attention.", min=1)
    attention_dim: int = _field(0, "Additive-attention projection (= context) width (0: the "
                                "decoder units); attention_heads must divide it.", min=0)
    residual_start: int = _field(2, "First layer (0-based) with a residual connection, encoder "
                                 "and decoder (2: from the third layer on, as the paper).", min=1)
    cell_clip: float = _field(10.0, "Clip the LSTM cell state to +-cell_clip (0: no clipping).",
                              min=0.0)
    forget_bias: float = _field(1.0, "Initial forget-gate bias (part of the per-gate LayerNorm "
                                "offset).")


@dataclasses.dataclass
class HybridConfig:
    """Hybrid encoders (Chen et al. 2018 section 6, :mod:`deep_nmt_tf.models.hybrid`)."""
    columns: Tuple[str, ...] = _field(("rnmt_plus", "transformer"), "multi_column: encoder "
                                      "type of each column (a list, >= 1), each with "
                                      "model.encoder_layers layers.", choices=COLUMN_TYPES)
    cascade_layers: int = _field(4, "cascaded: Transformer layers on the RNMT+ encoder "
                                 "(model.encoder_layers RNMT+ layers below them).", min=1)


@dataclasses.dataclass
class ModelConfig:
    architecture: str = _field("transformer", "Model family: encoder and decoder types "
                               "(rnmt_plus: Chen et al. 2018, options under model.rnmt; the hybrids "
                               "of its section 6: docs/HYBRIDS.md).",
                               choices=tuple(ARCHITECTURES))
    vocab_size: int = _field(0, "Vocabulary size; 0 = read from the vocabulary file.", min=0)
    d_model: int = _field(512, "Model (embedding) dimension.", min=1)
    num_heads: int = _field(8, "Attention heads; must divide d_model.", min=1)
    ffn_dim: int = _field(2048, "Inner dimension of the feed-forward sub-layers.", min=1)
    encoder_layers: int = _field(6, "Number of encoder layers.", min=1)
    decoder_layers: int = _field(6, "Number of decoder layers.", min=1)
    norm: str = _field("post", "Residual layout: 'post' (LN after the residual) or 'pre'.",
                       choices=("pre", "post"))
    layer_norm_epsilon: float = _field(1e-6, "LayerNorm epsilon.", min=0.0, min_exclusive=True)
    input_dropout: float = _field(0.1, "Dropout on embeddings + positions (T2T input dropout).",
                                  min=0.0, max=1.0)
    residual_dropout: float = _field(0.1, "Dropout on each sub-layer output before the residual.",
                                     min=0.0, max=1.0)
    relu_dropout: float = _field(0.0, "Dropout inside the feed-forward sub-layer.", min=0.0, max=1.0)
    attention_dropout: float = _field(0.0, "Dropout on attention probabilities.", min=0.0, max=1.0)
    tie_source_target_embeddings: bool = _field(True, "Share the source and target embedding matrix.")
    tie_softmax_embeddings: bool = _field(True, "Use the target embedding matrix as the softmax.")
    transparent_attention: TransparentAttentionConfig = _field(TransparentAttentionConfig(),
                                                               "Transparent attention options.")
    dlcl: DLCLConfig = _field(DLCLConfig(), "DLCL options.")
    lexical_shortcuts: LexicalShortcutsConfig = _field(LexicalShortcutsConfig(),
                                                       "Lexical shortcut options.")
    rnmt: RNMTConfig = _field(RNMTConfig(), "RNMT+ encoder/decoder options.")
    hybrid: HybridConfig = _field(HybridConfig(), "Cascaded / multi-column encoder options.")


@dataclasses.dataclass
class DataConfig:
    corpus: str = _field("files", "'files': the paths below; 'synthetic': the built-in corpus "
                         "(written under MODEL_DIR/data).", choices=("files", "synthetic"))
    synthetic_train_size: int = _field(20000, "Synthetic corpus: training pairs.", min=1)
    synthetic_dev_size: int = _field(500, "Synthetic corpus: dev pairs.", min=1)
    synthetic_test_size: int = _field(500, "Synthetic corpus: test pairs.", min=1)
    synthetic_seed: int = _field(1234, "Synthetic corpus: generator seed.")
    train_source: str = _field("", "Training source text, one sentence per line.")
    train_target: str = _field("", "Training target text, aligned with train_source.")
    dev_source: str = _field("", "Dev source (validation loss and BLEU); optional.")
    dev_target: str = _field("", "Dev target reference.")
    test_source: str = _field("", "Test source (tools/evaluate.py default); optional.")
    test_target: str = _field("", "Test target reference.")
    vocab: str = _field("", "Shared WordPiece vocabulary file; empty = MODEL_DIR/vocab.txt "
                        "(learned from the training data if missing).")
    vocab_size: int = _field(8000, "Target size when learning the vocabulary.", min=16)
    lowercase: bool = _field(False, "Lower-case text before tokenisation.")
    max_source_length: int = _field(128, "Drop training pairs with longer source (tokens).", min=1)
    max_target_length: int = _field(128, "Drop training pairs with longer target (tokens).", min=1)
    shuffle_buffer: int = _field(100000, "Examples in the shuffle buffer.", min=1)
    num_buckets: int = _field(16, "Length buckets for token-based batching.", min=1)
    max_dev_sentences: int = _field(0, "Use at most this many dev pairs (0 = all).", min=0)


@dataclasses.dataclass
class AdaptiveClippingConfig:
    """Adaptive gradient clipping of RNMT+ (Chen et al. 2018 section 4.2): skip a step whose
    log gradient norm is more than ``num_stddevs`` moving standard deviations above its moving
    mean (:mod:`deep_nmt_tf.training.adaptive_clipping`)."""
    enabled: bool = _field(False, "Skip outlier steps (the skips are counted in TensorBoard).")
    decay: float = _field(0.995, "Decay of the moving averages of log-norm statistics.",
                          min=0.0, max=1.0, min_exclusive=True)
    num_stddevs: float = _field(4.0, "Skip when log-norm > mean + num_stddevs * std.", min=0.0,
                                min_exclusive=True)
    warmup_steps: int = _field(-1, "Finite norms to see before any skip (-1: until the moving "
                               "averages' weight exceeds 0.75, 277 steps at decay 0.995).",
                               min=-1)
    norm_floor: float = _field(0.01, "The norm is floored at this value before the log.",
                               min=0.0, min_exclusive=True)
    min_stddev: float = _field(1e-3, "Floor of the moving standard deviation.", min=0.0)


@dataclasses.dataclass
class WarmStartConfig:
    """Initialise sub-modules from earlier runs (``deep_nmt_tf.training.warm_start``).  Each
    key is one value or a list; entry i copies source[i] of checkpoint[i] into target[i] (a
    single source/target applies to every checkpoint)."""
    checkpoint: Tuple[str, ...] = _field((), "Checkpoint(s) (MODEL_DIR/ckpt-N) or model "
                                         "directories (their latest) of earlier runs, whose "
                                         "config.yaml describes the model; empty: no warm "
                                         "start.")
    source: Tuple[str, ...] = _field(("encoder",), "Sub-module(s) of the earlier run's model "
                                     "to copy, '/'-separated attribute paths (e.g. encoder, "
                                     "decoder).")
    target: Tuple[str, ...] = _field((), "Sub-module(s) of this model to initialise (e.g. "
                                     "encoder/rnmt: the cascade's RNMT+ part; "
                                     "encoder/columns/0: a multi-column encoder's first "
                                     "column); empty: the same as source.")


@dataclasses.dataclass
class TrainingConfig:
    train_steps: int = _field(100000, "Number of optimizer updates.", min=1)
    batch_tokens: int = _field(4096, "Approximate source+target tokens per global batch.", min=1)
    gradient_accumulation_steps: int = _field(1, "Micro-batches accumulated per update.", min=1)
    learning_rate: float = _field(2.0, "Peak learning rate; for 'transformer' the constant r0; "
                                  "for 'rnmt_plus' the base rate of Eq. 1 (1e-4 in the paper).",
                                  min=0.0, min_exclusive=True)
    schedule: str = _field("transformer", "Learning-rate schedule (rnmt_plus: Chen et al. 2018 "
                           "Eq. 1 with n = replicas, then held at min_learning_rate).",
                           choices=("transformer", "inverse_sqrt", "constant", "rnmt_plus"))
    warmup_steps: int = _field(4000, "Warm-up steps of the schedule.", min=0)
    decay_start: int = _field(600000, "rnmt_plus schedule: s of Eq. 1 (decay starts when "
                              "replicas * step reaches s).", min=0)
    decay_end: int = _field(1200000, "rnmt_plus schedule: e of Eq. 1 (end of the exponential "
                            "decay); must exceed decay_start.", min=1)
    min_learning_rate: float = _field(5e-5, "rnmt_plus schedule: floor after the decay (the "
                                      "paper's 5e-5).", min=0.0)
    warmup_init_lr: float = _field(1e-7, "inverse_sqrt: learning rate at step 0.", min=0.0)
    adam_beta1: float = _field(0.9, "Adam beta1.", min=0.0, max=1.0)
    adam_beta2: float = _field(0.98, "Adam beta2.", min=0.0, max=1.0)
    adam_epsilon: float = _field(1e-9, "Adam epsilon.", min=0.0, min_exclusive=True)
    weight_decay: float = _field(0.0, "L2 weight decay added to the loss (0 = off).", min=0.0)
    label_smoothing: float = _field(0.1, "Label smoothing epsilon.", min=0.0, max=1.0)
    loss_normalization: str = _field("token", "Normalise the loss per target token or per sentence.",
                                     choices=("token", "sentence"))
    clip_norm: float = _field(0.0, "Clip gradients to this global norm (0 = off).", min=0.0)
    adaptive_clipping: AdaptiveClippingConfig = _field(AdaptiveClippingConfig(),
                                                       "Adaptive gradient clipping (RNMT+).")
    seed: int = _field(42, "Seed for initialisation, dropout and data order.")
    log_every: int = _field(100, "Steps between console/TensorBoard logs.", min=1)
    checkpoint_every: int = _field(1000, "Steps between checkpoints.", min=1)
    keep_checkpoints: int = _field(5, "Checkpoints to keep.", min=1)
    eval_every: int = _field(5000, "Steps between dev evaluations (0 = never).", min=0)
    eval_bleu: bool = _field(True, "Compute dev BLEU (greedy decoding) at each evaluation.")
    grad_norm_ratio_every: int = _field(0, "Steps between grad-norm-ratio diagnostics (0 = off).",
                                        min=0)
    diagnostics_every: int = _field(0, "Steps between the TensorBoard heatmaps of the mixing "
                                    "weights (transparent attention, DLCL) and the mean "
                                    "lexical-shortcut gates on a fixed batch (0: every "
                                    "log_every steps).", min=0)
    jit_compile: bool = _field(False, "Compile the training step with XLA.")
    warm_start: WarmStartConfig = _field(WarmStartConfig(), "Warm start from an earlier run.")
    freeze: Tuple[str, ...] = _field((), "Sub-modules (a list of '/'-separated attribute paths, "
                                     "e.g. [encoder/rnmt]) whose variables are not trained "
                                     "(excluded from the optimizer).")


@dataclasses.dataclass
class DecodingConfig:
    beam_size: int = _field(4, "Beam size (1 = greedy).", min=1)
    length_penalty: float = _field(0.6, "GNMT length penalty alpha: ((5+len)/6)^alpha.", min=0.0)
    max_length_a: float = _field(1.5, "Max output length = a * source_length + b.", min=0.0)
    max_length_b: int = _field(10, "Max output length = a * source_length + b.", min=1)
    n_best: int = _field(1, "Hypotheses returned per source.", min=1)
    batch_size: int = _field(32, "Sentences per decoding batch.", min=1)
    max_input_length: int = _field(256, "Longer inputs are truncated (tokens) when serving.", min=1)


@dataclasses.dataclass
class Config:
    model: ModelConfig = _field(ModelConfig(), "Model architecture.")
    data: DataConfig = _field(DataConfig(), "Data and vocabulary.")
    training: TrainingConfig = _field(TrainingConfig(), "Optimisation and training loop.")
    decoding: DecodingConfig = _field(DecodingConfig(), "Search.")

    # Where the config came from (not a key).
    source: str = dataclasses.field(default="<defaults>", compare=False, repr=False,
                                    metadata={"internal": True})


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


class _Locator:
    """Maps dotted keys to 'file:line' for error messages."""

    def __init__(self):
        self._where: Dict[str, str] = {}

    def add_file(self, path: str, text: str):
        try:
            node = yaml.compose(text)
        except yaml.YAMLError:
            return
        self._walk(node, "", path)

    def _walk(self, node, prefix, path):
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                self._where[key] = f"{path}:{key_node.start_mark.line + 1}"
                self._walk(value_node, key + ".", path)

    def set(self, key: str, where: str):
        self._where[key] = where

    def where(self, key: str, default: str) -> str:
        return self._where.get(key, default)


def _read_yaml(path: str, locator: _Locator, seen: Tuple[str, ...] = ()) -> Dict[str, Any]:
    apath = os.path.abspath(path)
    if apath in seen:
        raise ConfigError(f"{path}: 'base' includes form a cycle: {' -> '.join(seen + (apath,))}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: config file is not valid UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping of sections, "
                          f"got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        locator.add_file(path, text)
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: must be a path to another config file")
    base_path = os.path.join(os.path.dirname(path), base)
    merged = _read_yaml(base_path, locator, seen + (apath,))
    locator.add_file(path, text)
    return _deep_merge(merged, data)


def _deep_merge(base: Dict[str, Any], update: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, key: str, where: str):
    """Checks/coerces a YAML scalar to the declared field type."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string.
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is tuple:  # Tuple[X, ...]: a YAML list (or one scalar).
        if not isinstance(value, (list, tuple)):
            value = [value]
        item = typing.get_args(tp)[0]
        return tuple(_coerce(v, item, f"{key}[{i}]", where) for i, v in enumerate(value))
    raise ConfigError(f"{where}: {key}: expected {_type_name(tp)}, got {value!r} "
                      f"({type(value).__name__})")


def _build(cls, data: Dict[str, Any], prefix: str, locator: _Locator, default_where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{locator.where(prefix.rstrip('.'), default_where)}: {prefix.rstrip('.')}: "
                          f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in data:
        if key not in fields:
            full = f"{prefix}{key}"
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{locator.where(full, default_where)}: {full}: unknown key "
                              f"(known keys here: {known})")
    kwargs = {}
    for name, f in fields.items():
        full = f"{prefix}{name}"
        where = locator.where(full, default_where)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data.get(name, {}) or {}, full + ".", locator, default_where)
            continue
        if name not in data:
            continue
        value = _coerce(data[name], tp, full, where)
        meta = f.metadata
        if isinstance(value, tuple):
            bad = [v for v in value if meta.get("choices") is not None and
                   v not in meta["choices"]]
            if bad:
                raise ConfigError(f"{where}: {full}: {bad[0]!r} is not one of "
                                  f"{', '.join(map(str, meta['choices']))}")
            kwargs[name] = value
            continue
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise ConfigError(f"{where}: {full}: {value!r} is not one of "
                              f"{', '.join(map(str, meta['choices']))}")
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
            op = ">" if meta.get("min_exclusive") else ">="
            raise ConfigError(f"{where}: {full}: {value!r} is out of range (must be {op} {lo})")
        if hi is not None and value > hi:
            raise ConfigError(f"{where}: {full}: {value!r} is out of range (must be <= {hi})")
        kwargs[name] = value
    return cls(**kwargs)


def _validate(cfg: Config, locator: _Locator, default_where: str):
    """Cross-field checks."""

    def fail(key, msg):
        raise ConfigError(f"{locator.where(key, default_where)}: {key}: {msg}")

    m = cfg.model
    encoder_type, decoder_type = model_components(m)
    if "transformer" in (encoder_type, decoder_type) and m.d_model % m.num_heads:
        fail("model.num_heads", f"{m.num_heads} does not divide model.d_model={m.d_model}")
    if "rnmt_plus" in (encoder_type, decoder_type):
        r = m.rnmt
        attention_dim = r.attention_dim or r.decoder_units or m.d_model
        if decoder_type == "rnmt_plus" and attention_dim % r.attention_heads:
            fail("model.rnmt.attention_heads", f"{r.attention_heads} does not divide the "
                 f"attention width {attention_dim} (model.rnmt.attention_dim, else the decoder "
                 "units)")
        if decoder_type == "rnmt_plus" and m.tie_softmax_embeddings:
            fail("model.tie_softmax_embeddings", "the RNMT+ softmax reads [decoder output; "
                 "attention context], not an embedding-sized vector: set it to false")
    if encoder_type != "transformer" and (m.dlcl.encoder or (
            m.lexical_shortcuts.enabled and m.lexical_shortcuts.placement != "cross")):
        fail("model.dlcl.encoder" if m.dlcl.encoder else "model.lexical_shortcuts.enabled",
             f"DLCL and lexical shortcuts are Transformer options; the {encoder_type} encoder "
             "has neither")
    if decoder_type != "transformer" and (m.dlcl.decoder or m.lexical_shortcuts.enabled):
        fail("model.dlcl.decoder" if m.dlcl.decoder else "model.lexical_shortcuts.enabled",
             f"DLCL and lexical shortcuts are Transformer options; the {decoder_type} decoder "
             "has neither")
    if m.tie_softmax_embeddings is False and m.tie_source_target_embeddings is None:
        pass
    _validate_hybrid(m, fail)
    d = cfg.data
    if bool(d.dev_source) != bool(d.dev_target):
        fail("data.dev_source", "dev_source and dev_target must be given together")
    if bool(d.test_source) != bool(d.test_target):
        fail("data.test_source", "test_source and test_target must be given together")
    t = cfg.training
    if t.schedule in ("transformer",) and t.warmup_steps < 1:
        fail("training.warmup_steps", "the transformer schedule needs warmup_steps >= 1")
    if t.adaptive_clipping.decay >= 1.0:
        fail("training.adaptive_clipping.decay", f"{t.adaptive_clipping.decay} must be < 1")
    if t.jit_compile and "rnmt_plus" in model_components(m):
        fail("training.jit_compile", "XLA cannot compile the gradient of the RNMT+ recurrences "
             "(keras.ops.scan's while loop on TensorFlow has no maximum_iterations); set it "
             "to false (decoding and export still compile with XLA)")
    ws = t.warm_start
    n = len(ws.checkpoint)
    for key, paths in (("source", ws.source), ("target", ws.target)):
        if n and len(paths) not in ((1, n) if key == "source" else (0, 1, n)):
            fail(f"training.warm_start.{key}", f"{len(paths)} entries for {n} "
                 "training.warm_start.checkpoint entries (give one, or one per checkpoint)")
        for i, path in enumerate(paths):
            if not path.strip("/"):
                fail(f"training.warm_start.{key}", f"entry {i} names no sub-module")
    for i, path in enumerate(ws.checkpoint):
        if not path:
            fail("training.warm_start.checkpoint", f"entry {i} is empty")
    for i, path in enumerate(t.freeze):
        if not path.strip("/"):
            fail(f"training.freeze", f"entry {i} names no sub-module (e.g. encoder/rnmt)")
    if t.schedule == "rnmt_plus" and t.decay_end <= t.decay_start:
        fail("training.decay_end", f"{t.decay_end} must exceed training.decay_start="
             f"{t.decay_start}")
    if cfg.decoding.n_best > cfg.decoding.beam_size:
        fail("decoding.n_best", f"{cfg.decoding.n_best} exceeds decoding.beam_size="
             f"{cfg.decoding.beam_size}")


def _validate_hybrid(m, fail):
    """Cross-field checks of the hybrid architectures (Chen et al. 2018 section 6)."""
    encoder_type, decoder_type = model_components(m)
    embedding_types = {"cascaded": "rnmt_plus",
                       "multi_column": m.hybrid.columns[0] if m.hybrid.columns else None}
    source_embedding = embedding_types.get(encoder_type, encoder_type)
    if encoder_type == "multi_column":
        if not m.hybrid.columns:
            fail("model.hybrid.columns", "a multi-column encoder needs at least one column")
        if "transformer" in m.hybrid.columns and m.d_model % m.num_heads:
            fail("model.num_heads", f"{m.num_heads} does not divide model.d_model={m.d_model} "
                 "(a Transformer column)")
    if encoder_type == "cascaded" and m.d_model % m.num_heads:
        fail("model.num_heads", f"{m.num_heads} does not divide model.d_model={m.d_model} "
             "(the cascade's Transformer layers)")
    if encoder_type in ("cascaded", "multi_column") and m.transparent_attention.enabled:
        fail("model.transparent_attention.enabled", f"transparent attention is not defined "
             f"for the {encoder_type} encoder (its layers differ in width)")
    if m.tie_source_target_embeddings and source_embedding != decoder_type:
        fail("model.tie_source_target_embeddings", f"the source embedding is a "
             f"{source_embedding} embedding and the target one a {decoder_type} embedding "
             "(scaled by sqrt(d_model) or not, initialised differently): set it to false")


def _apply_override(data: Dict[str, Any], override: str, locator: _Locator):
    if "=" not in override:
        raise ConfigError(f"--override {override!r}: expected KEY=VALUE, e.g. training.train_steps=100")
    key, raw = override.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"--override {override!r}: malformed key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--override {key}: {p} is not a section")
        node = child
    node[parts[-1]] = value
    locator.set(key, "--override")


def require_training_data(cfg: Config):
    """Raises :class:`ConfigError` (naming key and file) if no training corpus is configured.

    Checked by the training tools before any work, not at load time, so that a config file
    describing only a model (e.g. ``configs/transformer_base.yaml``) loads and builds.
    """
    d = cfg.data
    if d.corpus == "files":
        for key in ("train_source", "train_target"):
            if not getattr(d, key):
                raise ConfigError(f"{cfg.source}: data.{key}: required when data.corpus is "
                                  f"'files' (give --override=data.{key}=PATH, or set "
                                  f"data.corpus: synthetic)")


def config_from_dict(data: Dict[str, Any], source: str = "<dict>",
                     overrides: Iterable[str] = ()) -> Config:
    """Builds and validates a :class:`Config` from a nested dict (as YAML would give)."""
    locator = _Locator()
    data = _deep_merge({}, data or {})
    for ov in overrides:
        _apply_override(data, ov, locator)
    cfg = _build(Config, data, "", locator, source)
    _validate(cfg, locator, source)
    cfg.source = source
    return cfg


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Config:
    """Loads, overrides and validates a config.

    Args:
      path: YAML file; None gives the defaults (which need data paths or overrides).
      overrides: ``"section.key=value"`` strings, applied after the file.

    Raises:
      ConfigError: naming the file, line and key of the first problem found.
    """
    locator = _Locator()
    data: Dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        data = _read_yaml(path, locator)
        source = path
    for ov in overrides:
        _apply_override(data, ov, locator)
    cfg = _build(Config, data, "", locator, source)
    _validate(cfg, locator, source)
    cfg.source = source
    return cfg


def config_to_dict(cfg) -> Dict[str, Any]:
    """Nested plain dict of every key (defaults included), suitable for YAML."""
    out = {}
    for f in dataclasses.fields(cfg):
        if f.metadata.get("internal"):
            continue
        v = getattr(cfg, f.name)
        out[f.name] = (config_to_dict(v) if dataclasses.is_dataclass(v) else
                       list(v) if isinstance(v, tuple) else v)
    return out


def save_config(cfg: Config, path: str):
    """Writes the fully resolved config (every key) as YAML; load_config reads it back."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"# Resolved configuration (from {cfg.source}).\n")
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False, default_flow_style=False)
    os.replace(tmp, path)


def describe_config(cls=Config, prefix: str = "") -> List[Tuple[str, Any, str]]:
    """(dotted key, default, help) for every key: the reference table in docs/CONFIG.md."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe_config(tp, f"{prefix}{f.name}."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            default = list(default) if isinstance(default, tuple) else default  # a YAML list
            help_ = f.metadata.get("help", "")
            if f.metadata.get("choices"):
                help_ += f" One of: {', '.join(map(str, f.metadata['choices']))}."
            rows.append((f"{prefix}{f.name}", default, help_))
    return rows


def config_reference_markdown() -> str:
    """The text of ``docs/CONFIG.md``: every key, its default and its description.

    Regenerate with ``python -m deep_nmt_tf.config > docs/CONFIG.md`` (a test checks it is
    current).
    """
    lines = ["# Configuration reference", "",
             "Generated from `deep_nmt_tf/config.py` by `python -m deep_nmt_tf.config`; every key "
             "can be set in YAML or with `--override=KEY=VALUE`.", ""]
    section = None
    for key, default, help_ in describe_config():
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += [f"## {section}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        lines.append(f"| `{key}` | `{default!r}` | {help_.replace('|', '/')} |")
    text = []
    for line in lines:  # a blank line before each new section's heading
        if line.startswith("## ") and text and text[-1] != "":
            text.append("")
        text.append(line)
    return "\n".join(text) + "\n"


if __name__ == "__main__":
    print(config_reference_markdown(), end="")
