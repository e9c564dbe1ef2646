"""Keys that moved when the config was split by concern (deep_nmt_tf 0.1 -> 0.2).

A config file or override that still uses an old key fails with a message naming the new key
(:func:`check_no_moved_keys`, :func:`moved_key_message`).  A run directory written by 0.1 holds a
complete resolved ``config.yaml`` in the old layout; :func:`upgrade` translates such a complete
config so that trained models keep working (the run directory rewrites its ``config.yaml``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["MOVED", "moved_key_message", "check_no_moved_keys", "is_legacy", "upgrade"]

_T = "model.encoder.transformer.{0} and model.decoder.transformer.{0}"

#: Old dotted key (or old section) -> where its value lives now.
MOVED: Dict[str, str] = {
    "model.architecture": "model.encoder.type and model.decoder.type (transformer_rnmt = "
                          "encoder transformer + decoder rnmt_plus; cascaded and multi_column "
                          "are encoder types)",
    "model.encoder_layers": "model.encoder.<type>.num_layers (e.g. "
                            "model.encoder.transformer.num_layers)",
    "model.decoder_layers": "model.decoder.<type>.num_layers (e.g. "
                            "model.decoder.transformer.num_layers)",
    "model.num_heads": _T.format("num_heads"),
    "model.ffn_dim": _T.format("ffn_dim"),
    "model.norm": _T.format("norm"),
    "model.relu_dropout": _T.format("relu_dropout"),
    "model.input_dropout": _T.format("input_dropout") + " (RNMT+: "
                           "model.{encoder,decoder}.rnmt_plus.embedding_dropout)",
    "model.residual_dropout": _T.format("residual_dropout") + " (RNMT+: "
                              "model.{encoder,decoder}.rnmt_plus.dropout)",
    "model.attention_dropout": _T.format("attention_dropout") + " (RNMT+: "
                               "model.decoder.rnmt_plus.attention_dropout)",
    "model.tie_softmax_embeddings": "model.decoder.transformer.tie_softmax",
    "model.dlcl": "model.encoder.transformer.dlcl and model.decoder.transformer.dlcl (each "
                  "with enabled: true and its own options)",
    "model.lexical_shortcuts": "model.encoder.transformer.lexical_shortcuts and "
                               "model.decoder.transformer.lexical_shortcuts (placement is a "
                               "decoder option)",
    "model.rnmt.encoder_units": "model.encoder.rnmt_plus.units",
    "model.rnmt.decoder_units": "model.decoder.rnmt_plus.units",
    "model.rnmt.attention_heads": "model.decoder.rnmt_plus.attention_heads",
    "model.rnmt.attention_dim": "model.decoder.rnmt_plus.attention_dim",
    "model.rnmt": "model.encoder.rnmt_plus and model.decoder.rnmt_plus",
    "model.hybrid.columns": "model.encoder.multi_column.columns (a list of encoder sections)",
    "model.hybrid.cascade_layers": "model.encoder.cascaded.stages (a list of encoder "
                                   "sections; the Transformer stage's num_layers)",
    "model.hybrid": "model.encoder.cascaded and model.encoder.multi_column",
    "training.learning_rate": "training.schedule.<type>.learning_rate (the transformer "
                              "schedule's r0: training.schedule.transformer.scale)",
    "training.warmup_steps": "training.schedule.<type>.warmup_steps",
    "training.warmup_init_lr": "training.schedule.inverse_sqrt.warmup_init_lr",
    "training.decay_start": "training.schedule.rnmt_plus.decay_start",
    "training.decay_end": "training.schedule.rnmt_plus.decay_end",
    "training.min_learning_rate": "training.schedule.rnmt_plus.min_learning_rate",
}

_SCHEDULE_AS_STRING = ("is now a section: training.schedule.type names the schedule and its "
                       "options live under training.schedule.<type> (e.g. "
                       "training.schedule.inverse_sqrt.learning_rate)")


def moved_key_message(key: str, value: Any = None) -> Optional[str]:
    """``"moved to ..."`` if ``key`` (dotted) is an old key, else None."""
    if key == "training.schedule" and isinstance(value, str):
        return _SCHEDULE_AS_STRING
    parts = key.split(".")
    for n in range(len(parts), 1, -1):
        new = MOVED.get(".".join(parts[:n]))
        if new:
            return f"this key moved in deep_nmt_tf 0.2: use {new}"
    return None


def check_no_moved_keys(data: Dict[str, Any], where: Callable[[str], str]) -> None:
    """Raises ConfigError for the first old key in a (possibly partial) config dict."""
    from deep_nmt_tf.config.fields import ConfigError

    for key, value in _walk(data):
        message = moved_key_message(key, value)
        if message:
            raise ConfigError(f"{where(key)}: {key}: {message}")


def _walk(tree, prefix=""):
    if not isinstance(tree, dict):
        return
    for k, v in tree.items():
        key = f"{prefix}{k}"
        yield key, v
        if isinstance(v, dict):
            yield from _walk(v, key + ".")


def is_legacy(data: Dict[str, Any]) -> bool:
    """Whether a complete config dict uses the 0.1 layout."""
    return any(moved_key_message(k, v) for k, v in _walk(data))


_ARCHITECTURES = {"transformer": ("transformer", "transformer"),
                  "rnmt_plus": ("rnmt_plus", "rnmt_plus"),
                  "transformer_rnmt": ("transformer", "rnmt_plus"),
                  "rnmt_transformer": ("rnmt_plus", "transformer"),
                  "cascaded": ("cascaded", "rnmt_plus"),
                  "multi_column": ("multi_column", "rnmt_plus")}
_DLCL_KEYS = ("weights", "init", "layer_norm", "normalize_embedding", "window", "softmax")


def _transformer_stack(m: Dict[str, Any], layers: int, decoder: bool) -> Dict[str, Any]:
    out = {"num_layers": layers}
    for key in ("num_heads", "ffn_dim", "norm", "input_dropout", "residual_dropout",
                "attention_dropout", "relu_dropout"):
        if key in m:
            out[key] = m[key]
    dlcl = m.get("dlcl") or {}
    out["dlcl"] = {"enabled": bool(dlcl.get("decoder" if decoder else "encoder", False)),
                   **{k: dlcl[k] for k in _DLCL_KEYS if k in dlcl}}
    lex = dict(m.get("lexical_shortcuts") or {})
    placement = lex.get("placement", "self")
    enabled = bool(lex.get("enabled", False))
    if decoder:
        out["tie_softmax"] = m.get("tie_softmax_embeddings", True)
        out["lexical_shortcuts"] = {"enabled": enabled, "placement": placement,
                                    **{k: lex[k] for k in ("variant", "source") if k in lex}}
    else:
        out["lexical_shortcuts"] = {"enabled": enabled and placement in ("self", "both"),
                                    **{k: lex[k] for k in ("variant", "source") if k in lex}}
    return out


def _rnmt_stack(m: Dict[str, Any], layers: int, decoder: bool) -> Dict[str, Any]:
    r = m.get("rnmt") or {}
    out = {"num_layers": layers,
           "units": r.get("decoder_units" if decoder else "encoder_units", 0),
           "embedding_dropout": m.get("input_dropout", 0.1),
           "dropout": m.get("residual_dropout", 0.1)}
    for key in ("residual_start", "cell_clip", "forget_bias"):
        if key in r:
            out[key] = r[key]
    if decoder:
        out["attention_dropout"] = m.get("attention_dropout", 0.0)
        for key in ("attention_heads", "attention_dim"):
            if key in r:
                out[key] = r[key]
    return out


def _stack(kind: str, m: Dict[str, Any], layers: int, decoder: bool) -> Dict[str, Any]:
    build = _transformer_stack if kind == "transformer" else _rnmt_stack
    return {"type": kind, kind: build(m, layers, decoder)}


def _upgrade_model(m: Dict[str, Any]) -> Dict[str, Any]:
    enc_type, dec_type = _ARCHITECTURES[m.get("architecture", "transformer")]
    enc_layers, dec_layers = m.get("encoder_layers", 6), m.get("decoder_layers", 6)
    hybrid = m.get("hybrid") or {}
    if enc_type == "cascaded":
        cascade = _stack("transformer", m, hybrid.get("cascade_layers", 4), False)
        cascade["transformer"]["input_dropout"] = 0.0
        for key in ("dlcl", "lexical_shortcuts"):
            cascade["transformer"].pop(key)
        encoder = {"type": "cascaded", "cascaded": {"stages": [
            _stack("rnmt_plus", m, enc_layers, False), cascade]}}
    elif enc_type == "multi_column":
        encoder = {"type": "multi_column", "multi_column": {"columns": [
            _stack(kind, m, enc_layers, False)
            for kind in hybrid.get("columns", ["rnmt_plus", "transformer"])]}}
    else:
        encoder = _stack(enc_type, m, enc_layers, False)
    out = {k: m[k] for k in ("vocab_size", "d_model", "layer_norm_epsilon",
                             "tie_source_target_embeddings", "transparent_attention") if k in m}
    out["encoder"] = encoder
    out["decoder"] = _stack(dec_type, m, dec_layers, True)
    return out


def _upgrade_training(t: Dict[str, Any]) -> Dict[str, Any]:
    t = dict(t)
    kind = t.pop("schedule", "transformer")
    options = {"warmup_steps": t.pop("warmup_steps", 4000)}
    rate = t.pop("learning_rate", 2.0)
    if kind == "transformer":
        options["scale"] = rate
    else:
        options["learning_rate"] = rate
    extra = {"inverse_sqrt": ("warmup_init_lr",),
             "rnmt_plus": ("decay_start", "decay_end", "min_learning_rate")}
    for key in ("warmup_init_lr", "decay_start", "decay_end", "min_learning_rate"):
        value = t.pop(key, None)
        if value is not None and key in extra.get(kind, ()):
            options[key] = value
    t["schedule"] = {"type": kind, kind: options}

    def path(p):
        return "encoder/stages/0" + p[len("encoder/rnmt"):] if p.startswith("encoder/rnmt") \
            else p

    ws = dict(t.get("warm_start") or {})
    if "target" in ws:
        targets = ws["target"] if isinstance(ws["target"], list) else [ws["target"]]
        ws["target"] = [path(p) for p in targets]
        t["warm_start"] = ws
    if "freeze" in t:
        freeze = t["freeze"] if isinstance(t["freeze"], list) else [t["freeze"]]
        t["freeze"] = [path(p) for p in freeze]
    return t


def upgrade(data: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """Translates a complete 0.1 config dict (a run directory's ``config.yaml``) to the
    current layout.  Returns the new dict and the old keys it translated."""
    data = copy.deepcopy(data)
    old = [k for k, v in _walk(data) if moved_key_message(k, v)]
    if "model" in data:
        data["model"] = _upgrade_model(data["model"])
    if "training" in data:
        data["training"] = _upgrade_training(data["training"])
    return data, old
