"""Reading configs: YAML files with ``base:`` includes, ``--override`` strings, and the typed
tree built from them; writing the resolved tree back.

A config file is a YAML mapping with the sections ``model``, ``data``, ``training`` and
``decoding`` (each optional).  A file may start from another one with ``base: other.yaml`` (path
relative to the including file); its own keys then override the base.  Overrides use dotted keys,
``--override=training.schedule.inverse_sqrt.learning_rate=1e-3``; the value is parsed as YAML.

Every problem raises :class:`~deep_nmt_tf.config.fields.ConfigError` naming where the key was
set (``file:line``, or ``--override``) and the dotted key, e.g.::

    configs/demo.yaml:12: model.encoder.transformer.num_heads: 6 does not divide model.d_model=256
"""

from __future__ import annotations

import importlib
import math
import os
import typing
from typing import Any, Dict, Iterable, Optional, Tuple

import yaml

from deep_nmt_tf.config import legacy
from deep_nmt_tf.config.fields import ConfigError, OneOf, is_section, section_fields
from deep_nmt_tf.config.schema import Config

__all__ = ["Locator", "load_config", "config_from_dict", "config_to_dict", "save_config",
           "build_section", "load_section"]


class Locator:
    """Remembers where each dotted key was set (``file:line`` or ``--override``) and at which
    precedence level: files in include order (a ``base:`` file below the file including it),
    overrides above every file."""

    OVERRIDE_LEVEL = 1 << 30

    def __init__(self):
        self._where: Dict[str, str] = {}
        self._level: Dict[str, int] = {}
        self._files = 0

    def add_file(self, path: str, text: str):
        """Records the keys of one more file (each file read ranks above the ones before)."""
        level = self._files
        self._files += 1
        try:
            node = yaml.compose(text)
        except yaml.YAMLError:
            return
        self._walk(node, "", path, level)

    def _walk(self, node, prefix, path, level):
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                self.set(key, f"{path}:{key_node.start_mark.line + 1}", level)
                self._walk(value_node, key + ".", path, level)
        elif isinstance(node, yaml.SequenceNode):
            base = prefix[:-1]
            for i, item in enumerate(node.value):
                self.set(f"{base}[{i}]", f"{path}:{item.start_mark.line + 1}", level)
                self._walk(item, f"{base}[{i}].", path, level)

    def set(self, key: str, where: str, level: int = OVERRIDE_LEVEL):
        self._where[key] = where
        self._level[key] = level

    def note(self, key: str, where: str):
        """Records where ``key`` comes from without giving it a precedence level (a section
        that an override creates on the way to its key)."""
        self._where.setdefault(key, where)

    def where(self, key: str, default: str) -> str:
        return self._where.get(key, default)

    def level(self, key: str) -> int:
        """The precedence level that set ``key`` (-1: not set, the default)."""
        return self._level.get(key, -1)

    def keys_under(self, prefix: str, min_level: int):
        """The keys at or under ``prefix`` set at ``min_level`` or above, sorted."""
        return sorted(k for k, level in self._level.items() if level >= min_level and (
            k == prefix or k.startswith((prefix + ".", prefix + "["))))


# --------------------------------------------------------------------------------------------
# YAML files
# --------------------------------------------------------------------------------------------


def read_yaml_mapping(path: str) -> Tuple[Dict[str, Any], str]:
    """``(mapping, text)`` of the YAML config file ``path`` (an empty file: ``{}``), for a config
    given to a tool and a run directory's saved ``config.yaml`` alike.

    Raises:
      ConfigError: unreadable, not UTF-8, not YAML or not a mapping; the message names the file
        and, where known, the line.
    """
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
    return data, text


def _read_yaml(path: str, locator: Locator, seen: Tuple[str, ...] = ()) -> Dict[str, Any]:
    apath = os.path.abspath(path)
    if apath in seen:
        raise ConfigError(f"{path}: 'base' includes form a cycle: {' -> '.join(seen + (apath,))}")
    data, text = read_yaml_mapping(path)
    base = data.pop("base", None)
    merged: Dict[str, Any] = {}
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: base: must be a path to another config file")
        merged = _read_yaml(os.path.join(os.path.dirname(path), base), locator,
                            seen + (apath,))
    legacy.check_no_moved_keys(data, lambda key: locator_for_file(path, text, key))
    locator.add_file(path, text)
    return _deep_merge(merged, data)


def locator_for_file(path: str, text: str, key: str) -> str:
    """``file:line`` of ``key`` in one file's text (for errors found before merging)."""
    one = Locator()
    one.add_file(path, text)
    return one.where(key, path)


def _deep_merge(base: Dict[str, Any], update: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _apply_override(data: Dict[str, Any], override: str, locator: Locator):
    if "=" not in override:
        raise ConfigError(f"--override {override!r}: expected KEY=VALUE, e.g. "
                          "training.train_steps=100")
    key, raw = override.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"--override {override!r}: malformed key {key!r}")
    moved = legacy.moved_key_message(key)
    if moved:
        raise ConfigError(f"--override {key}: {moved}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    for depth, p in enumerate(parts[:-1]):
        child = node.get(p)
        if child is None:  # A section the override creates: its keys are the override's.
            child = node[p] = {}
            locator.note(".".join(parts[:depth + 1]), "--override")
        if not isinstance(child, dict):
            raise ConfigError(f"--override {key}: {p} is not a section")
        node = child
    node[parts[-1]] = value
    locator.set(key, "--override")
    if isinstance(value, dict):  # every key inside is blamed on the override too
        for sub in _dotted_keys(value, key + "."):
            locator.set(sub, "--override")


def _dotted_keys(tree: Dict[str, Any], prefix: str):
    for k, v in tree.items():
        yield f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _dotted_keys(v, f"{prefix}{k}.")


# --------------------------------------------------------------------------------------------
# Building the typed tree
# --------------------------------------------------------------------------------------------


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, key: str, where: str, locator: Locator, default_where: str):
    """Checks/coerces a YAML value to the declared type (sections are built recursively)."""
    if is_section(tp):
        return build_section(tp, value, key, locator, default_where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string.
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{where}: {key}: {value!r} is not a finite number")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is tuple:  # Tuple[X, ...]: a YAML list (or one scalar).
        if not isinstance(value, (list, tuple)):
            value = [value]
        item = typing.get_args(tp)[0]
        return tuple(_coerce(v, item, f"{key}[{i}]", locator.where(f"{key}[{i}]", where),
                             locator, default_where) for i, v in enumerate(value))
    raise ConfigError(f"{where}: {key}: expected {_type_name(tp)}, got {value!r} "
                      f"({type(value).__name__})")


def _check_value(value, meta, key: str, where: str):
    values = value if isinstance(value, tuple) else (value,)
    choices = meta.get("choices")
    for v in values:
        if choices is not None and v not in choices:
            raise ConfigError(f"{where}: {key}: {v!r} is not one of "
                              f"{', '.join(map(str, choices))}")
    if isinstance(value, tuple):
        return
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
        op = ">" if meta.get("min_exclusive") else ">="
        raise ConfigError(f"{where}: {key}: {value!r} is out of range (must be {op} {lo})")
    if hi is not None and (value > hi or (meta.get("max_exclusive") and value == hi)):
        op = "<" if meta.get("max_exclusive") else "<="
        raise ConfigError(f"{where}: {key}: {value!r} is out of range (must be {op} {hi})")


def build_section(cls, data, key: str, locator: Locator, default_where: str):
    """Builds a dataclass or :class:`OneOf` section from its YAML mapping."""
    where = locator.where(key, default_where)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {key}: expected a mapping, got {data!r}")
    prefix = f"{key}." if key else ""
    if issubclass(cls, OneOf):
        return _build_one_of(cls, data, prefix, locator, default_where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in section_fields(cls)}
    for name in data:
        if name not in fields:
            full = f"{prefix}{name}"
            raise ConfigError(f"{locator.where(full, default_where)}: {full}: unknown key "
                              f"(known keys here: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        full = f"{prefix}{name}"
        tp = hints[name]
        if name not in data:
            if is_section(tp):  # defaults, but checked like the rest
                kwargs[name] = f.default_factory()
            continue
        where = locator.where(full, default_where)
        value = _coerce(data[name], tp, full, where, locator, default_where)
        if not is_section(tp):
            _check_value(value, f.metadata, full, where)
        kwargs[name] = value
    return cls(**kwargs)


def _build_one_of(cls, data, prefix: str, locator: Locator, default_where: str):
    registry = cls.registry
    type_key = f"{prefix}type"
    chosen = data.get("type", cls.default_type)
    if not isinstance(chosen, str) or chosen not in registry:
        raise ConfigError(f"{locator.where(type_key, default_where)}: {type_key}: "
                          f"{registry.unknown_message(chosen)}")
    sections = {}
    for name, value in data.items():
        if name == "type":
            continue
        full = f"{prefix}{name}"
        if name not in registry:
            raise ConfigError(f"{locator.where(full, default_where)}: {full}: unknown key "
                              f"(known keys here: type, {', '.join(registry.names())})")
        if name != chosen:
            # Options of another type: an error where they were set at or above the level that
            # chose the type (the same file, a later file, an override); below it (a base
            # file, or a file whose type an override switched) they are ignored.
            explicit = locator.keys_under(full, locator.level(type_key))
            if explicit:
                raise ConfigError(
                    f"{locator.where(explicit[0], default_where)}: {explicit[0]}: set, but "
                    f"{type_key} is {chosen!r} (options of another {registry.kind} type are "
                    f"ignored; remove them or set {type_key}: {name})")
            continue
        sections[name] = build_section(registry[name], value, full, locator, default_where)
    return cls(chosen, **sections)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def _import_extensions(data: Dict[str, Any], locator: Locator, source: str) -> None:
    """Imports the modules of the top-level ``imports`` list before the rest is read, so that
    the encoder/decoder/schedule types they register can be selected."""
    modules = data.get("imports") or []
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(modules, list):
        return  # build_section reports the wrong type
    for i, name in enumerate(modules):
        key = f"imports[{i}]"
        where = locator.where(key, locator.where("imports", source))
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: {key}: expected a module name, got {name!r}")
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of a user's module is reported
            raise ConfigError(f"{where}: {key}: cannot import {name!r}: "
                              f"{type(e).__name__}: {e}") from None


def _finish(data: Dict[str, Any], locator: Locator, source: str) -> Config:
    from deep_nmt_tf.config.rules import validate

    _import_extensions(data, locator, source)
    cfg = build_section(Config, data, "", locator, source)
    validate(cfg, locator, source)
    cfg.source = source
    return cfg


def config_from_dict(data: Dict[str, Any], source: str = "<dict>",
                     overrides: Iterable[str] = ()) -> Config:
    """Builds and validates a :class:`Config` from a nested dict (as YAML would give)."""
    locator = Locator()
    data = _deep_merge({}, data or {})
    legacy.check_no_moved_keys(data, lambda key: source)
    for ov in overrides:
        _apply_override(data, ov, locator)
    return _finish(data, locator, source)


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Config:
    """Loads, overrides and validates a config.

    Args:
      path: YAML file; None gives the defaults (which need data paths or overrides).
      overrides: ``"section.key=value"`` strings, applied after the file.

    Raises:
      ConfigError: naming the file, line and key of the first problem found.
    """
    locator = Locator()
    data: Dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        data = _read_yaml(path, locator)
        source = path
    for ov in overrides:
        _apply_override(data, ov, locator)
    return _finish(data, locator, source)


def load_section(cls, path: str, locator: Optional[Locator] = None):
    """Reads a YAML file (``base:`` includes allowed) into the dataclass section ``cls``, with
    the same checks and ``file:line`` errors as a config (e.g. an experiment suite file).
    ``locator`` (optional) receives where each key was set (which keys the file gives)."""
    locator = Locator() if locator is None else locator
    return build_section(cls, _read_yaml(path, locator), "", locator, path)


def config_to_dict(cfg) -> Dict[str, Any]:
    """Nested plain dict of every key (defaults included; of a one-of, its type and the
    selected section only), suitable for YAML."""
    if isinstance(cfg, OneOf):
        return {"type": cfg.type, cfg.type: config_to_dict(cfg.get())}
    out = {}
    for f in section_fields(cfg):
        v = getattr(cfg, f.name)
        if is_section(v):
            out[f.name] = config_to_dict(v)
        elif isinstance(v, tuple):
            out[f.name] = [config_to_dict(x) if is_section(x) else x for x in v]
        else:
            out[f.name] = v
    return out


def save_config(cfg: Config, path: str):
    """Writes the fully resolved config (every key) as YAML; load_config reads it back."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"# Resolved configuration (from {cfg.source}).\n")
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False, default_flow_style=False)
    os.replace(tmp, path)
