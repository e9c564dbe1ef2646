"""``docs/CONFIG.md``: every key of the config with its default and description.

Regenerate with ``python -m deep_nmt_tf.config > docs/CONFIG.md`` (a test checks it is current).
One-of sections list the keys of every registered type (``model.encoder.rnmt_plus.units`` ...);
only the section that ``type`` selects is used.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, List, Tuple

from deep_nmt_tf.config.fields import OneOf, is_section, section_fields
from deep_nmt_tf.config.schema import Config

__all__ = ["COMBINATIONS", "describe_config", "config_reference_markdown"]


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def describe_config(cls=Config, prefix: str = "") -> List[Tuple[str, Any, str]]:
    """(dotted key, default, help) for every key, one-of branches included."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in section_fields(cls):
        tp, help_ = hints[f.name], f.metadata.get("help", "")
        key = f"{prefix}{f.name}"
        if isinstance(tp, type) and issubclass(tp, OneOf):
            # The package's own types (not those a user's code or a test registered).
            names = [n for n in tp.registry.names()
                     if tp.registry[n].__module__.startswith("deep_nmt_tf.")]
            rows.append((f"{key}.type", tp.default_type,
                         f"{help_} One of: {', '.join(names)}."))
            for name in names:
                rows.extend(describe_config(tp.registry[name], f"{key}.{name}."))
        elif is_section(tp):
            rows.extend(describe_config(tp, f"{key}."))
        else:
            default = _default(f)
            if isinstance(default, tuple):  # a YAML list
                from deep_nmt_tf.config.loading import config_to_dict

                default = [config_to_dict(v) if is_section(v) else v for v in default]
            if f.metadata.get("choices"):
                help_ += f" One of: {', '.join(map(str, f.metadata['choices']))}."
            rows.append((key, default, help_))
            item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
            if dataclasses.is_dataclass(item):  # a list of sections: the keys of each entry
                rows.extend(describe_config(item, f"{key}[]."))
    return rows


def _cell(value) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "`[" + ", ".join(v.get("type", "?") for v in value) + "]`"
    return f"`{value!r}`"


#: How the deep methods combine (docs/CONFIG.md): what the config accepts, and what it refuses
#: (the refusals are ``deep_nmt_tf/config/rules.py``'s, each a ConfigError naming the key).
COMBINATIONS: Tuple[Tuple[str, str], ...] = (
    ("DLCL + transparent attention, DLCL + lexical shortcuts or feature fusion, transparent "
     "attention + lexical shortcuts",
     "yes: DLCL mixes each layer's input, transparent attention mixes the encoder layers' "
     "outputs for the decoder, shortcuts feed the self-attention's keys and values; none "
     "changes what the others read"),
    ("DeepNorm or Admin (`residual_scaling.method`) + `norm: post`",
     "yes (what they are for)"),
    ("DeepNorm or Admin + `norm: pre`",
     "refused: both up-weight the residual of a post-norm layer, `LN(w x + G(x))`; a pre-norm "
     "layer has no norm after the sum to rescale"),
    ("DeepNorm or Admin + DLCL in the same stack",
     "refused: DLCL replaces the residual stream their constants (DeepNorm's alpha and beta, "
     "Admin's omega from the number of residual sub-layers) are derived for"),
    ("DeepNorm or Admin + transparent attention",
     "yes: the decoder attends the encoder layers' outputs, which are post-norm as without "
     "them"),
    ("DeepNorm or Admin + lexical shortcuts or feature fusion",
     "yes: the shortcut enters the self-attention, inside the sub-layer G; the residual form "
     "is unchanged"),
    ("DeepNorm or Admin in one stack only",
     "yes: each stack is scaled (or not) on its own; DeepNorm's constants still take both "
     "depths"),
    ("DeepNorm with an RNMT+ or hybrid side, default constants",
     "refused: the paper's formulas need a Transformer encoder's depth N and decoder's depth "
     "M; give `alpha` and `beta` explicitly"),
    ("`alpha` / `beta` with Admin, `omega` with DeepNorm, any of them with `method: none`",
     "refused: not a constant of that method"),
    ("transparent attention over an RNMT+ encoder",
     "yes (Bapna et al.'s RNMT+ experiments; `rnmt_plus_512_transparent.yaml`)"),
    ("transparent attention over a cascaded or multi-column encoder",
     "refused: their stages' or columns' layer outputs differ in width"),
)


def _combinations_markdown() -> List[str]:
    return ["## Combining the deep methods", "",
            "Each method is a switch of its own and they compose, within these rules (the "
            "config refuses the others before anything is built, naming the key):", "",
            "| combination | defined? |", "| --- | --- |"] + [
        f"| {what} | {defined} |" for what, defined in COMBINATIONS] + [""]


def config_reference_markdown() -> str:
    """The text of ``docs/CONFIG.md``."""
    lines = ["# Configuration reference", "",
             "Generated from `deep_nmt_tf/config/` by `python -m deep_nmt_tf.config`; every key "
             "can be set in YAML or with `--override=KEY=VALUE`.", "",
             "A section with a `type` key is a one-of: `type` selects one of the sections below "
             "it (`model.encoder.type: rnmt_plus` uses `model.encoder.rnmt_plus.*`). Options of "
             "another type are an error in the file (or override) that chose the type or in a "
             "later one, and are ignored when they come from a `base:` file or from a file "
             "whose type an `--override` switched.", ""] + _combinations_markdown()
    section = None
    for key, default, help_ in describe_config():
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += [f"## {section}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        lines.append(f"| `{key}` | {_cell(default)} | {help_.replace('|', '/')} |")
    text = []
    for line in lines:  # a blank line before each new section's heading
        if line.startswith("## ") and text and text[-1] != "":
            text.append("")
        text.append(line)
    return "\n".join(text) + "\n"
