"""The translator's compiled searches: one export module per set of search options, and the
searches traced by an earlier process (the search cache, ``--compilation_cache``).

:class:`Searches` gives :meth:`~Searches.run`, the search of prepared source ids under a
:class:`~deep_nmt_tf.decoding.SearchOptions`: from the search cache
(:mod:`deep_nmt_tf.export.search_cache`) when it holds that search (the Keras model is then
never built: the variables are read from the checkpoint), else from the
:class:`~deep_nmt_tf.export.module.TranslationModule` of those options (built on first use,
and the traced search added to the cache).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import tensorflow as tf
from absl import logging

from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.export.module import TranslationModule

__all__ = ["Searches"]


class Searches:
    """Export modules by search options, and the search cache (module docstring).

    Args:
      model: ``() -> model`` (the translator's model, built on first use).
      model_built: ``() -> bool``: whether the model exists already (its variables then serve
        a cached search).
      tokenizer: the run's ``Tokenizer``.
      config: the run's config (``decoding.max_input_length``, ``model`` for cache keys).
      precision: the inference precision (cache keys).
      jit_compile: compile the searches with XLA.
      pad_to_multiple: source widths are padded to a multiple of this.
      search_cache: a :class:`~deep_nmt_tf.export.search_cache.SearchCache` or None.
      checkpoint: ``() -> path`` of the checkpoint the variables come from.
    """

    def __init__(self, model: Callable, model_built: Callable[[], bool], tokenizer, config,
                 precision: str, jit_compile: bool, pad_to_multiple: int, search_cache=None,
                 checkpoint: Callable[[], Optional[str]] = lambda: None):
        self._model = model
        self.model_built = model_built
        self.tokenizer = tokenizer
        self.config = config
        self.precision = precision
        self.jit_compile = jit_compile
        self.pad_to_multiple = pad_to_multiple
        self.search_cache = search_cache
        self._checkpoint = checkpoint
        self._modules: Dict[SearchOptions, TranslationModule] = {}
        self._cached_variables: Dict[str, Dict[int, tf.Variable]] = {}
        self._keys: Dict[Tuple, str] = {}
        self._saved_keys = set()

    def checkpoint_changed(self) -> None:
        """Forgets the variables read from the previous checkpoint."""
        self._cached_variables.clear()

    def module(self, options: SearchOptions) -> TranslationModule:
        """The (cached) export module of ``options``; one returning more hypotheses with the
        same beam and length limits serves too (the caller keeps the first ``n_best``; the
        length penalty is an input of the search)."""
        shape = (options.beam_size, options.max_length_a, options.max_length_b,
                 options.min_length)
        for known, module in self._modules.items():
            if (known.beam_size, known.max_length_a, known.max_length_b,
                    known.min_length) == shape and known.n_best >= options.n_best:
                return module
        self._modules[options] = TranslationModule(
            self._model(), self.tokenizer, options, self.config.decoding.max_input_length,
            jit_compile=self.jit_compile, pad_to_multiple=self.pad_to_multiple)
        return self._modules[options]

    def run(self, source_ids, options: SearchOptions) -> Dict[str, tf.Tensor]:
        """The search of ``options`` on prepared source ids (module docstring)."""
        cache, key = self.search_cache, None
        if cache is not None:
            key = self._key(options, tuple(source_ids.shape))
            cached = cache.load(key)
            variables = self._variables(cached, options) if cached is not None else None
            if variables is not None:
                return cached(source_ids, options.length_penalty, variables)
        module = self.module(options)
        out = module.search_ids(source_ids, options.length_penalty)
        if key is not None and key not in self._saved_keys:
            function = module._search_fn.get_concrete_function(
                source_ids, tf.constant(options.length_penalty, tf.float32))
            cache.save(key, function, module.model_variables)
            self._saved_keys.add(key)  # (Saved once per process, whatever the outcome.)
        return out

    def _key(self, options: SearchOptions, shape) -> str:
        """:func:`~deep_nmt_tf.export.search_cache.search_key` of a search (memoised: the
        config's digest is the same for every batch of a width; the length penalty is an input,
        not part of the key)."""
        from deep_nmt_tf.export.search_cache import search_key

        baked = options.replace(length_penalty=0.0)
        memo = (baked, shape)
        if memo not in self._keys:
            self._keys[memo] = search_key(self.config.model, baked, self.precision,
                                          self.jit_compile, options.min_length, shape)
        return self._keys[memo]

    def _variables(self, cached, options: SearchOptions):
        """The variables ``cached`` reads: the built model's, else read from the checkpoint
        (``None`` when the checkpoint does not hold them as recorded)."""
        if self.model_built():
            return self.module(options).model_variables
        path = self._checkpoint()
        variables = self._cached_variables.setdefault(path, {})
        missing = [i for i in cached.captures if i not in variables]
        if missing:
            try:
                read = cached.read_variables(path)
            except (tf.errors.OpError, ValueError, KeyError) as e:
                logging.warning("Search cache: %s: %s; building the model", path, e)
                read = None
            if read is None:
                return None
            variables.update(read)
        return variables
