"""The private Keras/TensorFlow hooks of deep_nmt_tf.compat, each checked by name.

A failure here means that a Keras or TensorFlow upgrade moved or changed one of the internals
the package relies on: the message names the hook; update ``deep_nmt_tf/compat.py``.  The last
test checks that no other module of the package or its tools touches a private hook.
"""

import contextlib
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def hook(name):
    """Turns any failure inside into one that names the hook and the versions."""
    assert name in compat.HOOKS, name
    try:
        yield
    except Exception as e:  # noqa: BLE001 - AssertionError included: report them all alike.
        pytest.fail(f"private hook {name!r} changed (keras {keras.__version__}, tensorflow "
                    f"{tf.__version__}); update deep_nmt_tf/compat.py: "
                    f"{type(e).__name__}: {e}", pytrace=False)


def test_optimizer_all_reduce_hook():
    with hook(compat.HOOKS[0]):
        assert keras.backend.backend() == "tensorflow"
        assert compat.optimizer_all_reduce_hook_present(), \
            "no base class of keras.optimizers.Optimizer defines it"
        compat.check_optimizer_all_reduce_hook()
        # Keras' apply() still calls the hook with the (gradient, variable) pairs...
        calls = []

        class Spy(keras.optimizers.SGD):
            pass

        def spy(self, grads_and_vars):
            grads_and_vars = list(grads_and_vars)
            calls.append(grads_and_vars)
            return grads_and_vars

        setattr(Spy, compat.ALL_REDUCE_HOOK, spy)
        w = keras.Variable(np.ones([2], np.float32))
        Spy(learning_rate=0.5).apply([tf.constant([1.0, 2.0])], [w])
        assert len(calls) == 1 and len(calls[0]) == 1, calls
        grad, _ = calls[0][0]
        np.testing.assert_array_equal(np.asarray(grad), [1.0, 2.0])
        np.testing.assert_allclose(w.numpy(), [0.5, 0.0])
        # ... and the package's optimizer overrides it with the identity.
        from deep_nmt_tf.training.optimizers import ReducedGradientsAdam

        pairs = [(tf.constant([3.0]), w)]
        assert getattr(ReducedGradientsAdam(), compat.ALL_REDUCE_HOOK)(pairs) == pairs


def test_dropout_rnn_cell_mixin():
    from deep_nmt_tf.layers.lstm import LayerNormLSTMCell

    with hook(compat.HOOKS[1]):
        base = compat.dropout_rnn_cell_base()
        assert base is not object, "keras.layers.LSTMCell has no base class DropoutRNNCell"
        for method in ("get_dropout_mask", "get_recurrent_dropout_mask", "reset_dropout_mask",
                       "reset_recurrent_dropout_mask"):
            assert callable(getattr(base, method, None)), method
        assert issubclass(LayerNormLSTMCell, base)
        # keras.layers.RNN recognises the cell: it draws the recurrent mask before its loop and
        # resets it after the call.
        events = []

        class Cell(LayerNormLSTMCell):
            def get_recurrent_dropout_mask(self, step_input):
                events.append("get")
                return super().get_recurrent_dropout_mask(step_input)

            def reset_recurrent_dropout_mask(self):
                events.append("reset")
                super().reset_recurrent_dropout_mask()

        rnn = keras.layers.RNN(Cell(4, recurrent_dropout=0.5, seed=1), return_sequences=True)
        out = rnn(np.ones([2, 3, 5], np.float32), training=True)
        assert tuple(out.shape) == (2, 3, 4)
        assert events and events[0] == "get" and events[-1] == "reset", events


def test_trackable_iterator_hook(tmp_path):
    with hook(compat.HOOKS[2]):
        assert hasattr(tf.__internal__.tracking, "Trackable")
        iterator = iter(tf.data.Dataset.range(5))
        assert compat.is_trackable(iterator)
        assert not compat.is_trackable(object())
        next(iterator)
        checkpoint = tf.train.Checkpoint(data_iterator=iterator)
        path = checkpoint.write(str(tmp_path / "iterator"))
        next(iterator)
        checkpoint.read(path).assert_consumed()
        assert int(next(iterator)) == 1


def test_no_merge_call_hook():
    with hook(compat.HOOKS[3]):
        assert callable(tf.__internal__.distribute.strategy_supports_no_merge_call)
        assert isinstance(compat.strategy_supports_no_merge_call(), bool)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        result = strategy.run(compat.strategy_supports_no_merge_call)
        assert isinstance(result, bool)


def test_keras_variable_value_hook():
    with hook(compat.HOOKS[4]):
        variable = keras.Variable(np.arange(3, dtype=np.float32))
        assert not isinstance(variable, tf.Variable)
        backing = compat.tf_variable(variable)
        assert isinstance(backing, tf.Variable)
        backing.assign([5.0, 6.0, 7.0])
        np.testing.assert_array_equal(variable.numpy(), [5.0, 6.0, 7.0])
        plain = tf.Variable(1.0)
        assert compat.tf_variable(plain) is plain
        with pytest.raises(TypeError):
            compat.tf_variable(object())


def test_py_dataset_output_signature_hook():
    with hook(compat.HOOKS[6]):

        class Widths(keras.utils.PyDataset):
            variable_batch_shapes = True

            def __len__(self):
                return 4

            def __getitem__(self, i):  # Widths 3, 3, 5, 2: the first two agree.
                width = (3, 3, 5, 2)[i]
                return np.ones([2, width, 1], np.float32), np.zeros([2, width, 1], np.float32)

        compat.allow_variable_batch_shapes()
        compat.allow_variable_batch_shapes()  # Idempotent.
        inputs = keras.Input((None, 1))
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        model.compile(loss="mse", optimizer="sgd")
        model.fit(Widths(), epochs=1, verbose=0)
        assert model.evaluate(Widths(), verbose=0) >= 0.0


PRIVATE = re.compile(r"keras\.src|tf\.__internal__|\._value\b|[\"']_value[\"']|"
                     r"_all_reduce_sum_gradients|tensorflow\.python")


def test_coordination_service_hook():
    """MultiWorkerMirroredStrategy leaves a coordination service configured beforehand alone,
    and the configuration takes a heartbeat timeout (the behaviour itself: the multi-worker
    test, tests/test_training_multi_worker.py)."""
    import inspect

    with hook(compat.HOOKS[5]):
        from tensorflow.python.distribute import collective_all_reduce_strategy
        from tensorflow.python.eager import context

        parameters = inspect.signature(context.context().configure_coordination_service)
        assert {"service_type", "service_leader", "heartbeat_timeout_in_ms"} <= set(
            parameters.parameters)
        source = inspect.getsource(collective_all_reduce_strategy.CollectiveAllReduceExtended)
        assert "context.context().coordination_service is None" in source
        assert callable(compat.set_worker_heartbeat_timeout)


def test_function_def_hooks():
    """A traced function's definition, registered under a new name, runs by that name with a
    variable handle among its inputs (what the search cache does)."""
    with hook(compat.HOOKS[7]), hook(compat.HOOKS[8]):
        v = tf.Variable([1.0, 2.0])
        f = tf.function(lambda x: x * 3.0 + v)
        concrete = f.get_concrete_function(tf.TensorSpec([2], tf.float32))
        definition = concrete.function_def
        definition.signature.name = "deep_nmt_tf_compat_test_fn"
        compat.register_function_defs([definition])
        compat.register_function_defs([definition])  # The same body again: accepted.
        (out,) = compat.call_function("deep_nmt_tf_compat_test_fn",
                                      [tf.constant([1.0, 1.0])] +
                                      [t for t in concrete.captured_inputs], 1)
        assert out.numpy().tolist() == [4.0, 5.0]


def test_sentencepiece_model_resource_hook(tmp_path):
    import sentencepiece

    text = tmp_path / "text.txt"
    text.write_text("\n".join(["the cat sat on the mat", "a dog ran far away"] * 20) + "\n")
    sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "m"),
                                             vocab_size=20, minloglevel=2)
    model = (tmp_path / "m.model").read_bytes()
    with hook("tensorflow_text.SentencepieceTokenizer._model_resource"):
        tokenizer = compat.sentencepiece_tokenizer(model)
        want = tokenizer.tokenize(["the cat ran"]).to_list()
        tf.random.set_seed(7)  # clears the eager kernel cache
        assert tokenizer.tokenize(["the cat ran"]).to_list() == want
        assert tokenizer.detokenize(tf.ragged.constant(want)).numpy().tolist() == [b"the cat ran"]


def test_private_hooks_only_in_compat():
    offenders = []
    for top in ("deep_nmt_tf", "tools"):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(directory, name)
                if not name.endswith(".py") or os.path.relpath(path, ROOT) == os.path.join(
                        "deep_nmt_tf", "compat.py"):
                    continue
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if PRIVATE.search(line):
                            offenders.append(f"{os.path.relpath(path, ROOT)}:{number}: "
                                             f"{line.strip()}")
    assert not offenders, "private Keras/TensorFlow hooks outside deep_nmt_tf/compat.py:\n" + \
        "\n".join(offenders)
