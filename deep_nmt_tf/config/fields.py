"""Building blocks of the typed config: declared fields, registries and one-of sections.

Every key is declared once with :func:`field`: its default, a one-line description and the
per-value checks (choices, range, finiteness) that the loader applies.  A :class:`OneOf` section
holds a ``type`` and one option section per registered type, in the manner of TF Model Garden's
``OneOfConfig``::

    encoder:
      type: rnmt_plus          # selects the section below; the others are ignored
      rnmt_plus:
        num_layers: 6

The types a one-of accepts come from a :class:`Registry`; the package registers its built-in
types (``deep_nmt_tf.config.schema``) and code outside the package adds its own
(``deep_nmt_tf.models.register_encoder``, ``deep_nmt_tf.task.schedules.register_schedule``).

This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar, Dict, Iterable, List, Optional

__all__ = ["ConfigError", "field", "Registry", "OneOf", "is_section", "section_fields",
           "operational_keys"]


class ConfigError(ValueError):
    """A config file or override is invalid.  The message names file, line and key."""


def field(default, help: str, choices: Optional[Iterable[Any]] = None,
          min: Optional[float] = None, max: Optional[float] = None,
          min_exclusive: bool = False, max_exclusive: bool = False,
          affects_results: bool = True):
    """Declares a config key: its default, description and value checks.

    Args:
      default: the default value (lists/sections are copied for every instance).
      help: one-line description (shown in ``docs/CONFIG.md``).
      choices: allowed values (for a tuple-valued key: allowed items).
      min, max: inclusive bounds unless ``min_exclusive`` / ``max_exclusive``.
      affects_results: False for an operational key, one that does not change what a run
        computes (how long it trains, how it is logged, checkpointed, evaluated or compiled,
        where its data lies): a run resumed with another value is the same recipe
        (:func:`operational_keys`).

    Numbers must be finite (NaN and infinities are refused for every numeric key).
    """
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None,
            "min": min, "max": max, "min_exclusive": min_exclusive,
            "max_exclusive": max_exclusive, "affects_results": affects_results}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default) or isinstance(
            default, OneOf) or (isinstance(default, tuple) and any(
                is_section(v) for v in default)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section_fields(cls) -> List[dataclasses.Field]:
    """The declared keys of a dataclass section (internal fields left out)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def operational_keys(cls, prefix: str = "") -> List[str]:
    """The dotted keys of the dataclass section ``cls`` (and its sub-sections) declared with
    ``affects_results=False``, sorted (one-of sections: not descended into)."""
    import typing

    keys = []
    hints = typing.get_type_hints(cls)
    for f in section_fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            keys += operational_keys(tp, f"{prefix}{f.name}.")
        elif not f.metadata.get("affects_results", True):
            keys.append(f"{prefix}{f.name}")
    return sorted(keys)


class Registry:
    """Maps type names to their option sections (dataclasses) for one :class:`OneOf`.

    Args:
      kind: what the types are (``"encoder"``), for messages.
      key: where the one-of lives in the config (``"model.encoder"``), for messages.
      how_to_register: the call that adds a type, for the unknown-type message.
    """

    def __init__(self, kind: str, key: str, how_to_register: str):
        self.kind = kind
        self.key = key
        self.how_to_register = how_to_register
        self._types: Dict[str, type] = {}

    def register(self, name: str, options_class: type) -> None:
        """Adds type ``name`` with its options dataclass (re-registering the same class is a
        no-op; another class under a taken name is an error)."""
        if not dataclasses.is_dataclass(options_class):
            raise TypeError(f"{self.kind} type {name!r}: options must be a dataclass, got "
                            f"{options_class!r}")
        if not name.isidentifier():
            raise ValueError(f"{self.kind} type name {name!r} must be an identifier")
        known = self._types.get(name)
        if known is not None and known is not options_class:
            raise ValueError(f"{self.kind} type {name!r} is already registered (with "
                             f"{known.__qualname__})")
        self._types[name] = options_class

    def __contains__(self, name) -> bool:
        return name in self._types

    def __getitem__(self, name: str) -> type:
        try:
            return self._types[name]
        except KeyError:
            raise ConfigError(self.unknown_message(name)) from None

    def unknown_message(self, name) -> str:
        return (f"{name!r} is not a registered {self.kind} type (known: "
                f"{', '.join(self.names())}; code outside the package registers its own with "
                f"{self.how_to_register}, in a module the config names under 'imports')")

    def names(self) -> List[str]:
        return sorted(self._types)


class OneOf:
    """A section whose ``type`` selects one option section among the registered types.

    Subclasses set ``registry`` and ``default_type``.  The selected section is :meth:`get`;
    every registered type's section is also an attribute (``cfg.model.encoder.transformer``),
    holding its defaults unless given.  Two one-ofs are equal when they select the same type
    with equal options (the other sections do not matter).

    Args:
      type: the selected type (default ``default_type``).
      **sections: option sections by type name (dataclass instances).
    """

    registry: ClassVar[Registry]
    default_type: ClassVar[str]

    def __init__(self, type: Optional[str] = None, **sections):
        self.type = type or self.default_type
        self._sections: Dict[str, Any] = {}
        for name, value in sections.items():
            if not isinstance(value, self.registry[name]):
                raise TypeError(f"{self.registry.key}.{name}: expected "
                                f"{self.registry[name].__name__}, got {value!r}")
            self._sections[name] = value
        self.registry[self.type]  # noqa: B018  (an unknown type fails here)

    def section(self, name: str):
        """The option section of type ``name`` (its defaults if it was not given)."""
        if name not in self._sections:
            self._sections[name] = self.registry[name]()
        return self._sections[name]

    def get(self):
        """The selected type's option section."""
        return self.section(self.type)

    def __getattr__(self, name):
        if name.startswith("_") or name in ("type", "registry", "default_type"):
            raise AttributeError(name)
        if name in self.registry:
            return self.section(name)
        raise AttributeError(f"{type(self).__name__} has no section {name!r} (registered "
                             f"{self.registry.kind} types: {', '.join(self.registry.names())})")

    def __eq__(self, other):
        return (type(other) is type(self) and self.type == other.type
                and self.get() == other.get())

    def __repr__(self):
        return f"{type(self).__name__}(type={self.type!r}, {self.type}={self.get()!r})"

    def __deepcopy__(self, memo):
        return type(self)(self.type, **copy.deepcopy(self._sections, memo))


def is_section(value_or_type) -> bool:
    """Whether a value (or a type) is a config section: a dataclass or a :class:`OneOf`."""
    if isinstance(value_or_type, type):
        return dataclasses.is_dataclass(value_or_type) or issubclass(value_or_type, OneOf)
    return dataclasses.is_dataclass(value_or_type) or isinstance(value_or_type, OneOf)
