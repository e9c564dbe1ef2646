"""The search options: one type, validated once, for every entry point of a search.

:class:`SearchOptions` (beam size, ``n_best``, length penalty, length limits) is checked when
it is made, by :func:`deep_nmt_tf.config.check_search_options` (the one place that knows
``n_best <= beam_size`` and the other rules; the config's ``decoding`` section is checked by the
same function when it is loaded).  The translator and its exported signatures, the tools and
dev BLEU during training take one, so none of them checks or clamps an option again:

* :meth:`SearchOptions.from_config`: the ``decoding`` section with a tool's overrides (an
  ``n_best`` left to the config is capped at a smaller beam given here);
* :meth:`SearchOptions.search`: :func:`deep_nmt_tf.decoding.search.search` with these options
  (greedy for a beam of 1);
* :meth:`SearchOptions.greedy`: the same limits, beam 1 (dev BLEU: the length rule of
  ``deep-nmt-evaluate``).

Example:
    >>> options = SearchOptions.from_config(config.decoding, beam_size=8)
    >>> out = options.search(model, source_ids)          # ids [B, N, L], scores [B, N] ...
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from deep_nmt_tf.config import check_search_options

__all__ = ["SearchOptions"]


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Options of one search (module docstring); invalid values raise
    :class:`~deep_nmt_tf.config.SearchOptionsError` (a ``ValueError``) when it is made.

    Attributes:
      beam_size: K (1: greedy search).
      n_best: hypotheses returned per sentence (``<= beam_size``).
      length_penalty: GNMT's alpha, ``((5 + len) / 6) ** alpha`` (finite, ``>= 0``).
      max_length_a, max_length_b: at most ``floor(a * n + b)`` tokens for a source of ``n``.
      min_length: tokens before ``</s>`` is allowed (benchmarks use a fixed length).
    """

    beam_size: int = 4
    n_best: int = 1
    length_penalty: float = 0.6
    max_length_a: float = 1.5
    max_length_b: int = 10
    min_length: int = 0

    def __post_init__(self):
        for key, kind in (("beam_size", int), ("n_best", int), ("length_penalty", float),
                          ("max_length_a", float), ("max_length_b", int), ("min_length", int)):
            object.__setattr__(self, key, kind(getattr(self, key)))
        check_search_options(self.beam_size, self.n_best, self.length_penalty,
                             self.max_length_a, self.max_length_b, self.min_length)

    @classmethod
    def from_config(cls, decoding, beam_size: Optional[int] = None,
                    n_best: Optional[int] = None, length_penalty: Optional[float] = None,
                    min_length: int = 0) -> "SearchOptions":
        """The options of a :class:`~deep_nmt_tf.config.DecodingConfig`, with the given ones
        instead of the config's.  An ``n_best`` given here must not exceed the beam; the
        config's ``n_best`` is capped at a smaller beam given here."""
        beam = decoding.beam_size if beam_size is None else int(beam_size)
        return cls(beam_size=beam,
                   n_best=min(decoding.n_best, beam) if n_best is None else int(n_best),
                   length_penalty=(decoding.length_penalty if length_penalty is None
                                   else float(length_penalty)),
                   max_length_a=decoding.max_length_a, max_length_b=decoding.max_length_b,
                   min_length=min_length)

    def replace(self, **changes) -> "SearchOptions":
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def greedy(self) -> "SearchOptions":
        """Beam 1, one hypothesis, the same length limits."""
        return self.replace(beam_size=1, n_best=1)

    def to_dict(self) -> Dict[str, Any]:
        """The options as a dict (a search cache's key)."""
        return dataclasses.asdict(self)

    def search(self, model, source_ids, length_penalty=None) -> Dict[str, Any]:
        """:func:`~deep_nmt_tf.decoding.search.search` with these options; ``length_penalty``
        (e.g. a float32 tensor input of a compiled search) replaces the option's value."""
        from deep_nmt_tf.decoding.search import search

        return search(model, source_ids, beam_size=self.beam_size,
                      length_penalty=(self.length_penalty if length_penalty is None
                                      else length_penalty),
                      n_best=self.n_best, max_length_a=self.max_length_a,
                      max_length_b=self.max_length_b, min_length=self.min_length)
