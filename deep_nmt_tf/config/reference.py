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

__all__ = ["describe_config", "config_reference_markdown"]


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


def config_reference_markdown() -> str:
    """The text of ``docs/CONFIG.md``."""
    lines = ["# Configuration reference", "",
             "Generated from `deep_nmt_tf/config/` by `python -m deep_nmt_tf.config`; every key "
             "can be set in YAML or with `--override=KEY=VALUE`.", "",
             "A section with a `type` key is a one-of: `type` selects one of the sections below "
             "it (`model.encoder.type: rnmt_plus` uses `model.encoder.rnmt_plus.*`). Options of "
             "another type are an error in the file (or override) that chose the type or in a "
             "later one, and are ignored when they come from a `base:` file or from a file "
             "whose type an `--override` switched.", ""]
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
