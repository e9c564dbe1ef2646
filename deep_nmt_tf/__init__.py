"""deep_nmt_tf: deep neural machine translation in TensorFlow 2 / Keras 3.

Transformer, RNMT+ and hybrid models with the deep-network methods of Bapna et al. 2018
(transparent attention), Wang et al. 2019 (DLCL) and Emelin et al. 2019 (lexical shortcuts).

``deep_nmt_tf.layers`` and ``deep_nmt_tf.models`` are pure Keras 3 (TensorFlow or JAX backend);
``deep_nmt_tf.data``, ``deep_nmt_tf.training`` and ``deep_nmt_tf.export`` use TensorFlow.
"""

__version__ = "0.2.0"
