"""Oldest-first eviction for the on-disk caches (no TensorFlow import).

Two caches share it: XLA's persistent compilation cache, bounded in bytes
(:func:`deep_nmt_tf.cli.prune_compilation_cache`), and the traced-search cache, bounded in
entries (:class:`deep_nmt_tf.export.search_cache.SearchCache`).  Several processes may prune
the same directory at once, so a file that vanishes meanwhile is not an error.
"""

from __future__ import annotations

import os
from typing import Hashable, Iterable, List, Sequence, Tuple

#: An entry of a cache: (key, last use as a modification time, cost against the budget, files).
Entry = Tuple[Hashable, float, float, Sequence[str]]


def stat_or_none(path: str):
    """``os.stat(path)`` or None when the file is gone (removed by another process)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def remove_oldest(entries: Iterable[Entry], budget: float) -> List[Hashable]:
    """Removes the files of the least recently used entries until the remaining entries' costs
    sum to at most ``budget``; returns the removed entries' keys, oldest first.  Files already
    removed by another process count as removed."""
    entries = sorted(entries, key=lambda entry: entry[1])
    total = sum(entry[2] for entry in entries)
    removed = []
    for key, _, cost, paths in entries:
        if total <= budget:
            break
        for path in paths:
            try:
                os.remove(path)
            except OSError:  # Already gone: fine.
                pass
        removed.append(key)
        total -= cost
    return removed
