"""Mixed-precision training (training.precision): float32 variables and checkpoints that load
under any precision, float16 loss scaling with skipped overflow steps, and every architecture's
training step compiled by XLA in bfloat16.  (MirroredStrategy: tests/test_training_distributed.py.)
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf import checkpointing
from deep_nmt_tf.config import ConfigError
from deep_nmt_tf.models import build_model
from config_trees import architecture, constant, merge
from deep_nmt_tf.training import Runner
from keras_test_utils import fast_xla_compile_env
from test_training_helpers import (NO_DROPOUT, make_batches, make_trainer_class, run_python,
                                   tiny_config, weights)


def _runner(tmp_path, model=None, **training):
    cls = make_trainer_class(make_batches(6, batch_size=16))
    return Runner(tiny_config(model, **training), str(tmp_path), trainer=cls)


def test_precision_key_is_checked():
    with pytest.raises(ConfigError, match="training.precision"):
        tiny_config(precision="bfloat16")  # an inference precision, not a training policy


def test_mixed_bfloat16_trains_and_checkpoints_load_under_any_precision(tmp_path):
    runner = _runner(tmp_path, train_steps=20, schedule=constant(1e-2), checkpoint_every=20,
                     eval_every=20, precision="mixed_bfloat16")
    trainer = runner.trainer
    assert trainer.model.dtype_policy.name == "mixed_bfloat16"
    assert trainer.loss_scaling is None  # bfloat16 needs no loss scaling
    before = runner.evaluate(write_summaries=False)
    logs = runner.run()
    assert logs["eval_loss"] < before["loss"] - 0.3, (before, logs)
    assert logs["skipped_updates"] == 0
    path = runner.checkpoints.latest()
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    assert {dtypes[k] for k in dtypes if k.startswith("model/")} <= {tf.float32, tf.int64}
    # float32 training model, float32 inference model, bfloat16 inference model.
    config = trainer.config
    as_float32 = build_model(config)
    checkpointing.restore_model_weights(as_float32, path)
    for a, b in zip(weights(trainer), [np.array(v.numpy()) for v in as_float32.variables]):
        np.testing.assert_array_equal(a, b)
    as_bfloat16 = build_model(config, dtype="bfloat16")
    checkpointing.restore_model_weights(as_bfloat16, path)
    for a, b in zip(weights(trainer), as_bfloat16.variables):
        np.testing.assert_allclose(np.asarray(tf.cast(b, tf.float32)), a, rtol=1e-2, atol=1e-6)
    batch = make_batches(1, batch_size=4, seed=3)[0]
    inputs = {k: batch[k] for k in ("source_ids", "target_input_ids")}
    expected, got = as_float32(inputs), as_bfloat16(inputs)
    assert got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=0.15)
    # A checkpoint of the wrong shape fails as loudly as before.
    with pytest.raises((AssertionError, ValueError)):
        checkpointing.restore_model_weights(
            build_model(tiny_config({"d_model": 8}), dtype="bfloat16"), path)


def test_float16_overflow_step_is_skipped_and_counted(tmp_path):
    runner = _runner(tmp_path, NO_DROPOUT, train_steps=3, precision="mixed_float16",
                     checkpoint_every=3)
    trainer = runner.trainer
    scaling = trainer.loss_scaling
    assert trainer.model.dtype_policy.name == "mixed_float16"
    assert float(scaling.current_scale()) == 2.0 ** 15
    scaling.optimizer.dynamic_growth_steps = 2  # before the step function is traced
    iterator = runner.make_train_iterator()
    # Force an overflow: loss * 2^127 is not finite in float32.
    scaling.optimizer.dynamic_scale.assign(2.0 ** 127)
    before = weights(trainer)
    out = trainer.train_step(iterator)
    assert float(out["skipped"]) == 1.0 and float(out["overflow"]) == 1.0
    assert int(trainer.skipped_updates.numpy()) == 1
    assert int(scaling.overflow_updates.numpy()) == 1
    assert float(scaling.current_scale()) == 2.0 ** 126  # halved
    assert int(trainer.optimizer.iterations.numpy()) == 0
    for a, b in zip(before, weights(trainer)):
        np.testing.assert_array_equal(a, b)
    # A usable scale: the next steps apply, the gradient is the unscaled one.
    scaling.optimizer.dynamic_scale.assign(2.0 ** 10)
    out = trainer.train_step(iterator)
    assert float(out["skipped"]) == 0.0 and float(out["overflow"]) == 0.0
    assert 0.0 < float(out["grad_norm"]) < 100.0
    trainer.train_step(iterator)
    assert float(scaling.current_scale()) == 2.0 ** 11  # doubled after 2 finite steps
    assert int(trainer.optimizer.iterations.numpy()) == 2
    assert int(scaling.overflow_updates.numpy()) == 1
    assert int(trainer.skipped_updates.numpy()) == 1
    # The scale and the counters are checkpointed and restored.
    runner.save_checkpoint()
    restored = _runner(tmp_path, NO_DROPOUT, train_steps=3, precision="mixed_float16",
                       checkpoint_every=3).trainer
    assert float(restored.loss_scaling.current_scale()) == 2.0 ** 11
    assert int(restored.loss_scaling.overflow_updates.numpy()) == 1
    assert int(restored.skipped_updates.numpy()) == 1


def test_float16_gradients_match_float32(tmp_path):
    """Loss scaling is transparent: the first update's gradient norm is float32's.  (The steps
    run eagerly, untraced: the traced float16 step is test_float16_overflow_step_...'s.)"""
    norms = {}
    for precision in ("float32", "mixed_float16"):
        runner = _runner(tmp_path / precision, NO_DROPOUT, train_steps=1, seed=3,
                         precision=precision)
        trainer = runner.trainer
        if trainer.loss_scaling is not None:  # 2^15 overflows this model's first step
            trainer.loss_scaling.optimizer.dynamic_scale.assign(2.0 ** 8)
        iterator = runner.make_train_iterator()  # tf.data functions are traced anyway
        tf.config.run_functions_eagerly(True)
        try:
            out = trainer.train_step(iterator)
        finally:
            tf.config.run_functions_eagerly(False)
        norms[precision] = float(out["grad_norm"])
    np.testing.assert_allclose(norms["mixed_float16"], norms["float32"], rtol=2e-2)


RNMT = {"num_layers": 1, "units": 8, "embedding_dropout": 0.0, "dropout": 0.0}
TRANSFORMER = {"num_layers": 1, "num_heads": 2, "ffn_dim": 32, "input_dropout": 0.0,
               "residual_dropout": 0.0}
ENCODER = {"transformer": TRANSFORMER, "rnmt_plus": RNMT}
DECODER = {"transformer": dict(TRANSFORMER, tie_softmax=False),
           "rnmt_plus": dict(RNMT, attention_dropout=0.0, attention_heads=2, attention_dim=16)}
#: Untied, without dropout (the cascade's second stage: 1 layer): the Transformer, and the
#: cascade, whose RNMT+ encoder stage, Transformer encoder stage and RNMT+ decoder hold every
#: other architecture's parts (RNMT+, the hybrids and the multi-column encoder are made of
#: these stacks; each XLA compilation of a training step costs 1-2 minutes of CI).
ARCHITECTURES = {name: merge({"tie_source_target_embeddings": False},
                             architecture(name, ENCODER, DECODER))
                 for name in ("transformer", "cascaded")}


def xla_step_results(model_dir):
    """For each of :data:`ARCHITECTURES`: one training step in mixed_bfloat16 run eagerly
    (``tf.config.run_functions_eagerly``: nothing traced or compiled) and one compiled with
    XLA (jit_compile), from the same initial weights (no dropout); returns
    ``{architecture: {"plain": outputs, "xla": outputs, "differ": fraction}}`` (``outputs``:
    ``loss_sum``, ``grad_norm``, ``skipped``; ``differ``: the fraction of weight entries whose
    updates differ by over 1e-4).  Run in a subprocess with fast XLA compilation."""
    import pathlib

    out = {}
    for name in sorted(ARCHITECTURES):
        model = merge(NO_DROPOUT, ARCHITECTURES[name])
        results = {}
        for jit in (False, True):
            runner = _runner(pathlib.Path(model_dir) / f"{name}_{jit}", model, train_steps=1,
                             jit_compile=jit, precision="mixed_bfloat16", seed=5)
            trainer = runner.trainer
            iterator = runner.make_train_iterator()  # tf.data functions are traced anyway
            tf.config.run_functions_eagerly(not jit)
            try:
                step = trainer.train_step(iterator)
            finally:
                tf.config.run_functions_eagerly(False)
            results[jit] = ({k: float(step[k]) for k in ("loss_sum", "grad_norm", "skipped")},
                            weights(trainer))
        (plain, w_plain), (xla, w_xla) = results[False], results[True]
        flat = [np.abs(a - b).ravel() for a, b in zip(w_plain, w_xla)]
        out[name] = {"plain": plain, "xla": xla,
                     "differ": float((np.concatenate(flat) > 1e-4).mean())}
    return out


@pytest.fixture(scope="module")
def xla_steps(tmp_path_factory):
    """:func:`xla_step_results` in a fresh process whose XLA compiles with
    FAST_XLA_COMPILE_FLAGS (XLA reads them once per process): the cascade's compilation takes
    a third of the time (otherwise 40 s of CPU, 1-2 minutes of a loaded CI machine); the
    programs compiled are the same."""
    model_dir = str(tmp_path_factory.mktemp("xla"))
    code = ("import json, test_training_precision as t\n"
            f"print('RESULT ' + json.dumps(t.xla_step_results({model_dir!r})))")
    proc = run_python(code, env=fast_xla_compile_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_architectures_train_under_xla_in_bfloat16(architecture, xla_steps):
    """One training step compiled with XLA (jit_compile) in mixed_bfloat16 gives the loss and
    the update of the uncompiled step, run eagerly (no dropout, same initial weights).  (The
    step traced without XLA is every other training test's.)"""
    result = xla_steps[architecture]
    plain, xla = result["plain"], result["xla"]
    assert plain["skipped"] == xla["skipped"] == 0.0
    np.testing.assert_allclose(xla["loss_sum"], plain["loss_sum"], rtol=1e-2)
    np.testing.assert_allclose(xla["grad_norm"], plain["grad_norm"], rtol=5e-2)
    # Adam's first update is about lr * sign(g): bfloat16 rounding may flip the sign of a
    # gradient entry near 0, so compare the updates entry by entry and allow some such flips.
    # How many depends on the model and the CPU's kernels (2.3% of the cascade's entries on
    # CI's CPU, under 1% elsewhere); a wrong compiled step (another gradient, a missed update)
    # changes about half of them.
    assert result["differ"] < 0.05, result["differ"]


@pytest.mark.parametrize("norm,normalize_embedding", [("pre", False), ("pre", True),
                                                      ("post", False), ("post", True)])
def test_dlcl_history_gradient_equals_the_row_sums(norm, normalize_embedding):
    """DLCL's linear-memory history (a custom gradient, with the pre-norm LayerNorms inside it
    and recomputed in the backward pass) differentiates like the plain sums of combine(), with
    respect to the layer outputs, the weights and every LayerNorm's scale and offset."""
    from deep_nmt_tf.layers.dlcl import DynamicLinearCombination

    layer = DynamicLinearCombination(3, 8, norm=norm, window=3,
                                     normalize_embedding=normalize_embedding)
    layer.build()
    layer.weight.assign(np.tril(np.random.RandomState(4).randn(4, 4)).astype("float32"))
    rs = np.random.RandomState(0)
    for v in layer.trainable_variables:
        if v is not layer.weight:  # LayerNorm scales and offsets away from 1 and 0
            v.assign(rs.randn(*v.shape).astype("float32"))
    ys = [tf.constant(rs.randn(2, 3, 8).astype("float32")) for _ in range(4)]
    probes = [tf.constant(rs.randn(2, 3, 8).astype("float32")) for _ in range(4)]

    def loss_history():
        history, total = layer.start(ys[0]), 0.0
        for row in range(4):
            total += tf.reduce_sum(probes[row] * history.next_input())
            if row < 3:
                history.add(ys[row + 1])
        return total

    def loss_rows():
        stored = [layer.store(y, k) for k, y in enumerate(ys)]
        return sum(tf.reduce_sum(probes[row] * layer.combine(stored[: row + 1], row))
                   for row in range(4))

    grads = []
    for fn in (loss_history, loss_rows):
        with tf.GradientTape() as tape:
            tape.watch(ys)
            loss = fn()
        grads.append(tape.gradient(loss, ys + list(layer.trainable_variables)))
    assert len(grads[0]) == 4 + 1 + 2 * (3 + normalize_embedding)
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
