"""Greedy and beam search over the decoder-state interface (pure ``keras.ops``: TensorFlow and
JAX backends).

:class:`SearchOptions` (``options.py``) is the one validated type of a search's options that
every entry point takes.  The TensorFlow-side translator (tokenisation, batching, checkpoints:
:mod:`deep_nmt_tf.inference`) and the SavedModel export (:mod:`deep_nmt_tf.export`) live apart,
since this package must not import TensorFlow.
"""

from deep_nmt_tf.decoding.options import SearchOptions
from deep_nmt_tf.decoding.search import (beam_search, gnmt_length_penalty, greedy_search,
                                         max_output_length, output_length_limits, search,
                                         source_lengths)

__all__ = [
    "SearchOptions",
    "beam_search",
    "gnmt_length_penalty",
    "greedy_search",
    "max_output_length",
    "output_length_limits",
    "search",
    "source_lengths",
]
