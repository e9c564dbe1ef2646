"""Every use of a private Keras or TensorFlow hook, in one place.

The package relies on a few internals that neither Keras nor TensorFlow documents.  Each one is
wrapped here by a small function or class, and ``tests/test_compat.py`` checks each hook by
name, so that a Keras or TensorFlow upgrade that moves or changes one fails that test (naming
the hook) instead of changing the package's behaviour quietly.  No other module of the package
touches a private name; ``keras.src`` is imported nowhere.

Hooks (``HOOKS`` lists their names, as the test reports them):

* ``keras.optimizers.Optimizer._all_reduce_sum_gradients`` (TensorFlow backend): Keras 3 sums
  the gradients passed to ``apply`` across replicas in replica context.  The trainer hands the
  optimizer gradients it already reduced; :func:`skip_gradient_all_reduce` overrides the hook
  so that they are not summed twice.
* ``DropoutRNNCell`` (Keras' mixin class of its dropout RNN cells): ``keras.layers.RNN`` draws
  the dropout masks of a cell once per sequence, before its loop (required by JAX's scan), only
  for cells deriving from this class.  It is not exported, so :func:`dropout_rnn_cell_base`
  finds it in the bases of the public ``keras.layers.LSTMCell`` instead of importing it.
* ``tf.__internal__.tracking.Trackable``: :func:`is_trackable` (can a ``tf.data`` or
  distributed iterator go into a ``tf.train.Checkpoint``).
* ``tf.__internal__.distribute.strategy_supports_no_merge_call``:
  :func:`strategy_supports_no_merge_call` (whether a conditional update needs a
  ``merge_call``).
* ``KerasVariable._value`` (TensorFlow backend): :func:`tf_variable`, the ``tf.Variable`` behind a
  Keras 3 variable (the SavedModel export tracks these).
* ``tensorflow.python.eager.context.context().configure_coordination_service``:
  :func:`set_worker_heartbeat_timeout`, the heartbeat timeout after which the coordination
  service of ``MultiWorkerMirroredStrategy`` declares a worker lost (the strategy configures the
  service itself, with TensorFlow's default, only when none is configured yet).
* ``tensorflow.python.eager.context.context().add_function_def`` and ``.call_function``:
  :func:`register_function_defs` and :func:`call_function`, how ``tf.function`` itself
  registers a traced function with the runtime and calls it by name (with the context's
  function-call options, so the graph is optimised as a ``tf.function`` call's is); the search
  cache (:mod:`deep_nmt_tf.export.search_cache`) runs saved searches this way without tracing
  them again.
* ``PyDatasetAdapter._output_signature`` (TensorFlow backend): ``fit`` on TensorFlow turns a
  ``keras.utils.PyDataset`` into a ``tf.data`` generator whose shapes it guesses from the first
  two batches, so token batches of other widths later fail.  :func:`allow_variable_batch_shapes`
  gives the adapter a signature with every dimension unknown for datasets that set
  ``variable_batch_shapes = True`` (:class:`deep_nmt_tf.data.batching.TokenBatches`), and
  gives the adapter's ``tf.data`` the autotuning choice such a dataset's ``tf_data_autotune``
  states (``data.autotune``: the adapter's ``prefetch(AUTOTUNE)`` otherwise starts tf.data's
  autotuning model, whose thread makes deleting an idle iterator wait, BENCHMARKS.md).
* ``tensorflow_text``'s ``SentencepieceTokenizer._model_resource`` and its
  ``gen_sentencepiece_tokenizer.sentencepiece_op``: tensorflow-text 2.21 creates the model
  resource owned by the eager kernel that made it, so it disappears whenever TensorFlow clears
  its eager kernel cache (``tf.random.set_seed`` does, as ``keras.utils.set_random_seed``):
  every later tokenisation fails with "Resource ... SentencepieceOp ... does not exist" (the
  library's own TODO b/318839908).  :func:`sentencepiece_tokenizer` gives the tokenizer a
  resource under a shared name derived from the model's bytes, kept by TensorFlow's resource
  manager (and re-created under the same name when a SavedModel is loaded).

Backend gaps (public APIs that lack something on one backend):

* ``keras.ops.scan`` on TensorFlow runs a ``tf.while_loop`` without ``maximum_iterations``, so
  XLA cannot compile its gradient (the loop's accumulators need a bounded size).
  :func:`scan` is ``keras.ops.scan`` on the other backends and, on TensorFlow, the same
  ``TensorArray`` loop with ``maximum_iterations`` set to the (padded, compile-time) length:
  the RNMT+ recurrences then train under ``jit_compile``.

TensorFlow is imported lazily, inside the functions that need it: ``deep_nmt_tf.layers`` uses
this module and stays TensorFlow-free.
"""

from __future__ import annotations

import warnings

import keras

__all__ = [
    "HOOKS",
    "ALL_REDUCE_HOOK",
    "skip_gradient_all_reduce",
    "optimizer_all_reduce_hook_present",
    "check_optimizer_all_reduce_hook",
    "dropout_rnn_cell_base",
    "is_trackable",
    "strategy_supports_no_merge_call",
    "tf_variable",
    "scan",
    "set_worker_heartbeat_timeout",
    "register_function_defs",
    "call_function",
    "allow_variable_batch_shapes",
    "sentencepiece_tokenizer",
]

#: Name of Keras 3's TensorFlow-optimizer method that all-reduces gradients in ``apply``.
ALL_REDUCE_HOOK = "_all_reduce_sum_gradients"
_DROPOUT_RNN_CELL = "DropoutRNNCell"
_VARIABLE_VALUE = "_value"
_PY_DATASET_ADAPTER = "keras.src.trainers.data_adapters.py_dataset_adapter"
_OUTPUT_SIGNATURE = "_output_signature"

#: The private hooks this module wraps (names as tests/test_compat.py reports them).
HOOKS = (
    f"keras.optimizers.Optimizer.{ALL_REDUCE_HOOK}",
    f"keras.layers.LSTMCell base class {_DROPOUT_RNN_CELL}",
    "tf.__internal__.tracking.Trackable",
    "tf.__internal__.distribute.strategy_supports_no_merge_call",
    f"keras.Variable.{_VARIABLE_VALUE}",
    "tensorflow.python.eager.context.configure_coordination_service",
    f"{_PY_DATASET_ADAPTER}.PyDatasetAdapter.{_OUTPUT_SIGNATURE}",
    "tensorflow.python.eager.context.add_function_def",
    "tensorflow.python.eager.context.call_function",
    "tensorflow_text.SentencepieceTokenizer._model_resource",
)

# --------------------------------------------------------------------------------------------
# Keras optimizer: the cross-replica gradient sum inside apply()
# --------------------------------------------------------------------------------------------


def _already_reduced(self, grads_and_vars):
    """Replaces Keras' cross-replica sum: the gradients are already summed."""
    del self
    return list(grads_and_vars)


def skip_gradient_all_reduce(cls):
    """Class decorator: ``cls`` (a Keras optimizer) takes gradients already summed across
    replicas (overrides ``_all_reduce_sum_gradients``, which Keras' TensorFlow optimizer calls in
    ``apply`` under a ``tf.distribute`` strategy).  Outside a strategy nothing changes."""
    setattr(cls, ALL_REDUCE_HOOK, _already_reduced)
    return cls


def optimizer_all_reduce_hook_present() -> bool:
    """Whether Keras' optimizer base (TensorFlow backend) defines the all-reduce hook that
    :func:`skip_gradient_all_reduce` overrides."""
    return any(ALL_REDUCE_HOOK in vars(base) for base in keras.optimizers.Optimizer.__mro__)


def check_optimizer_all_reduce_hook() -> None:
    """Raises ``RuntimeError`` when the TensorFlow backend's optimizer lost the hook (the
    gradients would then be summed across replicas twice).  No-op on other backends."""
    if keras.backend.backend() == "tensorflow" and not optimizer_all_reduce_hook_present():
        raise RuntimeError(
            f"keras {keras.__version__}: the optimizer hook {ALL_REDUCE_HOOK} is gone; "
            "deep_nmt_tf.compat must be updated for this Keras version (gradients would be "
            "summed across replicas twice)")


# --------------------------------------------------------------------------------------------
# Keras RNN: the dropout-cell mixin
# --------------------------------------------------------------------------------------------


def _find_dropout_rnn_cell():
    for base in keras.layers.LSTMCell.__mro__:
        if base.__name__ == _DROPOUT_RNN_CELL:
            return base
    return None


def dropout_rnn_cell_base() -> type:
    """Keras' ``DropoutRNNCell`` mixin, found among the bases of ``keras.layers.LSTMCell``.

    A cell deriving from it gets its dropout masks drawn once per sequence by
    ``keras.layers.RNN``, before the loop.  If a Keras version no longer has it, returns
    ``object`` and warns: the cell then still works in ``keras.layers.RNN`` without recurrent
    dropout masks drawn in advance (``tests/test_compat.py`` fails on such a version).
    """
    base = _find_dropout_rnn_cell()
    if base is None:
        warnings.warn(f"keras {keras.__version__}: keras.layers.LSTMCell has no base class "
                      f"{_DROPOUT_RNN_CELL}; keras.layers.RNN will not pre-draw the recurrent "
                      "dropout masks of deep_nmt_tf's LSTM cell (deep_nmt_tf.compat needs an "
                      "update)", RuntimeWarning, stacklevel=2)
        return object
    return base


# --------------------------------------------------------------------------------------------
# TensorFlow internals
# --------------------------------------------------------------------------------------------


def is_trackable(obj) -> bool:
    """Whether ``obj`` can be saved in a ``tf.train.Checkpoint`` (``tf.__internal__``'s
    ``Trackable``; e.g. a ``tf.data`` iterator under the default strategy)."""
    import tensorflow as tf

    return isinstance(obj, tf.__internal__.tracking.Trackable)


def strategy_supports_no_merge_call() -> bool:
    """Whether the current ``tf.distribute`` strategy runs replica code without a
    ``merge_call`` (``tf.__internal__.distribute.strategy_supports_no_merge_call``)."""
    import tensorflow as tf

    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def tf_variable(variable):
    """The ``tf.Variable`` behind a Keras 3 variable (TensorFlow backend); a ``tf.Variable`` is
    returned as it is.  Raises ``TypeError`` when there is none."""
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, _VARIABLE_VALUE, None)
    if not isinstance(value, tf.Variable):
        raise TypeError(f"cannot find the tf.Variable of {variable!r}")
    return value


# --------------------------------------------------------------------------------------------
# Backend gaps
# --------------------------------------------------------------------------------------------


def scan(f, init, xs):
    """``keras.ops.scan(f, init, xs)`` whose TensorFlow loop has a maximum iteration count.

    ``f(carry, x) -> (carry, y)``; ``xs`` a tensor or a nest of tensors with the steps on
    axis 0 (``T``, static or not); returns ``(final carry, ys stacked on axis 0)``.  As with
    ``keras.ops.scan`` on TensorFlow, ``y`` must have the structure, dtypes and shapes of the
    carry.  On TensorFlow the loop is a ``tf.while_loop`` over ``TensorArray`` s (as Keras')
    with ``maximum_iterations = T``, which XLA needs to compile the gradient (``T`` is a
    constant once XLA compiles a shape).  Other backends: ``keras.ops.scan``.
    """
    if keras.backend.backend() != "tensorflow":
        return keras.ops.scan(f, init, xs)
    import tensorflow as tf

    xs_flat = [tf.convert_to_tensor(x) for x in keras.tree.flatten(xs)]
    init_flat = [tf.convert_to_tensor(c) for c in keras.tree.flatten(init)]
    steps = tf.shape(xs_flat[0])[0]
    inputs = [tf.TensorArray(x.dtype, size=steps, element_shape=x.shape[1:]).unstack(x)
              for x in xs_flat]
    outputs = [tf.TensorArray(c.dtype, size=steps, element_shape=c.shape) for c in init_flat]

    def body(i, carry, ys):
        x = keras.tree.pack_sequence_as(xs, [ta.read(i) for ta in inputs])
        carry, y = f(keras.tree.pack_sequence_as(init, carry), x)
        ys = [ta.write(i, v) for ta, v in zip(ys, keras.tree.flatten(y))]
        return i + 1, [tf.convert_to_tensor(c) for c in keras.tree.flatten(carry)], ys

    _, carry, ys = tf.while_loop(lambda i, carry, ys: i < steps, body,
                                 (tf.constant(0), init_flat, outputs),
                                 maximum_iterations=steps, parallel_iterations=1)
    length = xs_flat[0].shape[0]
    ys = [ta.stack() for ta in ys]
    for y in ys:
        y.set_shape(tf.TensorShape([length]).concatenate(y.shape[1:]))
    return keras.tree.pack_sequence_as(init, carry), keras.tree.pack_sequence_as(init, ys)


def set_worker_heartbeat_timeout(seconds: float) -> None:
    """Configures the coordination service that ``MultiWorkerMirroredStrategy`` starts (from
    ``TF_CONFIG``) with a heartbeat timeout of ``seconds``: a worker silent that long counts as
    lost, and the collectives of the others fail with ``UnavailableError``.  Call it before the
    strategy is created (and before TensorFlow's runtime starts)."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    jobs = resolver.cluster_spec().jobs
    leader = "chief" if "chief" in jobs else "worker"
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{leader}/replica:0/task:0",
        heartbeat_timeout_in_ms=int(seconds * 1000))


def register_function_defs(functions) -> None:
    """Adds ``FunctionDef`` protos to TensorFlow's eager runtime (callees first), as
    ``tf.function`` does for a trace; a name already registered with the same body is kept."""
    from tensorflow.python.eager import context

    ctx = context.context()
    for function in functions:
        ctx.add_function_def(function)


def call_function(name: str, inputs, num_outputs: int) -> list:
    """Runs the registered function ``name`` eagerly on ``inputs`` (tensors, variable handles
    included) as a ``tf.function`` call does, and returns its ``num_outputs`` outputs."""
    from tensorflow.python.eager import context

    return list(context.context().call_function(name.encode(), list(inputs), num_outputs))


# --------------------------------------------------------------------------------------------
# Keras fit on TensorFlow: the tf.data signature of a PyDataset
# --------------------------------------------------------------------------------------------


def _py_dataset_adapter():
    import importlib

    return importlib.import_module(_PY_DATASET_ADAPTER).PyDatasetAdapter


def _unknown_shapes_signature(batch):
    import tensorflow as tf

    return keras.tree.map_structure(
        lambda a: tf.TensorSpec([None] * len(a.shape), tf.as_dtype(a.dtype)), batch)


def allow_variable_batch_shapes() -> None:
    """Lets ``fit``/``evaluate`` on the TensorFlow backend read ``keras.utils.PyDataset`` s
    whose batches change shape (those with ``variable_batch_shapes = True``): the adapter's
    ``tf.data`` signature gets every dimension unknown, from the dataset's first batch, instead
    of the shapes of its first two batches.  A dataset with a ``tf_data_autotune`` attribute
    (True or False) also gets tf.data's autotuning model set so (``data.autotune``), unless
    Keras set it itself (off, for a dataset with ``workers``: its enqueuer does the threading).
    Idempotent; other datasets are unaffected."""
    adapter = _py_dataset_adapter()
    original = adapter.get_tf_dataset
    if getattr(original, "_deep_nmt_tf", False):
        return

    def get_tf_dataset(self):
        if (getattr(self.py_dataset, "variable_batch_shapes", False)
                and getattr(self, _OUTPUT_SIGNATURE, None) is None):
            setattr(self, _OUTPUT_SIGNATURE, _unknown_shapes_signature(self.py_dataset[0]))
        dataset = original(self)
        autotune = getattr(self.py_dataset, "tf_data_autotune", None)
        if autotune is None:
            return dataset
        from deep_nmt_tf.data.options import default_autotune

        return default_autotune(dataset, autotune)

    get_tf_dataset._deep_nmt_tf = True
    adapter.get_tf_dataset = get_tf_dataset


# --------------------------------------------------------------------------------------------
# tensorflow-text: a SentencePiece model resource that survives a cleared kernel cache
# --------------------------------------------------------------------------------------------


def sentencepiece_tokenizer(model: bytes):
    """A ``tensorflow_text.SentencepieceTokenizer`` of ``model`` (the ``.model`` file's bytes)
    whose model resource lives under a shared name (module docstring), so that it outlives
    ``tf.random.set_seed`` and other clears of the eager kernel cache."""
    import hashlib

    import tensorflow as tf
    import tensorflow_text as tf_text
    from tensorflow_text.python.ops import sentencepiece_tokenizer as sp_ops

    shared_name = "deep_nmt_tf_sentencepiece_" + hashlib.sha256(model).hexdigest()[:24]

    class SharedModelResource(sp_ops._SentencepieceModelResource):
        def _create_resource(self):
            with tf.name_scope("SentenceTokenizerInitializer"):
                return sp_ops.gen_sentencepiece_tokenizer.sentencepiece_op(
                    model=self._model, shared_name=shared_name)

    tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
    tokenizer._model_resource = SharedModelResource(model, None)
    return tokenizer
