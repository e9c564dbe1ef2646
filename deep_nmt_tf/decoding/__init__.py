"""Greedy and beam search over the decoder-state interface (pure ``keras.ops``: TensorFlow and
JAX backends).

The TensorFlow-side translator (tokenisation, batching, checkpoints) and the SavedModel export
live in :mod:`deep_nmt_tf.export`, since this package must not import TensorFlow.
"""

from deep_nmt_tf.decoding.search import (beam_search, gnmt_length_penalty, greedy_search,
                                         max_output_length, output_length_limits, search,
                                         source_lengths)

__all__ = [
    "beam_search",
    "gnmt_length_penalty",
    "greedy_search",
    "max_output_length",
    "output_length_limits",
    "search",
    "source_lengths",
]
