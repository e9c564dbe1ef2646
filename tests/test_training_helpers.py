"""Shared pieces of the training tests: a tiny config, a synthetic copy task, a test Trainer.

:class:`SyntheticTrainer` is a :class:`deep_nmt_tf.training.Trainer` whose data comes from a
fixed list of in-memory batches (no files, no vocabulary), so the loop, the distribution and the
checkpointing can be tested quickly and deterministically.  Helper scripts run in subprocesses
import this module (``sys.path`` gets ``tests/``).
"""

import contextlib
import itertools
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = 24


def tiny_model(model=None):
    """The tiny Transformer's model section (1+1 layers, d_model 16, vocab 24, dropout 0.1)
    with ``model`` (a current-layout model section) merged in."""
    from config_trees import merge, transformer

    return merge(transformer(VOCAB, 16, num_heads=2, ffn_dim=32, encoder_layers=1,
                             decoder_layers=1, input_dropout=0.1, residual_dropout=0.1), model)


def tiny_config(model=None, **training):
    """A validated Config of :func:`tiny_model`; ``training`` keys replace the tiny training
    section's (constant learning rate 3e-3: ``schedule=constant(...)`` for another).  Both in
    the current layout (``tests/config_trees.py``)."""
    from config_trees import config, constant

    train = dict(train_steps=10, schedule=constant(3e-3), log_every=5, checkpoint_every=5,
                 keep_checkpoints=3, eval_every=0, label_smoothing=0.1, seed=7)
    train.update(training)
    return config(tiny_model(model), train, data={"corpus": "synthetic"},
                  decoding={"max_length_a": 1.0, "max_length_b": 3})


def copy_batch(rng, batch_size, max_len=7):
    """A copy-task batch (target = source) in the docs/DESIGN.md format, numpy int32."""
    lengths = rng.randint(2, max_len + 1, size=batch_size)
    width = int(lengths.max())
    src = np.zeros([batch_size, width + 1], np.int32)
    tin = np.zeros([batch_size, width + 1], np.int32)
    tout = np.zeros([batch_size, width + 1], np.int32)
    for i, n in enumerate(lengths):
        toks = rng.randint(4, VOCAB, size=n)
        src[i, :n], src[i, n] = toks, 2
        tin[i, 0], tin[i, 1:n + 1] = 1, toks
        tout[i, :n], tout[i, n] = toks, 2
    return {"source_ids": src, "target_input_ids": tin, "target_output_ids": tout}


def make_batches(num, batch_size=8, seed=0):
    rng = np.random.RandomState(seed)
    return [copy_batch(rng, batch_size) for _ in range(num)]


def split_batch(batch, parts):
    """Rows of ``batch`` in ``parts`` consecutive chunks, each trimmed to its own width."""
    out = []
    for rows in np.array_split(np.arange(len(batch["source_ids"])), parts):
        piece = {k: v[rows] for k, v in batch.items()}
        for k, v in piece.items():
            used = np.nonzero((v != 0).any(axis=0))[0]
            piece[k] = v[:, : used.max() + 1]
        out.append(piece)
    return out


def batches_dataset(batches, split=1):
    """An endless dataset cycling over ``batches``, each emitted as ``split`` pieces."""
    import tensorflow as tf

    spec = {k: tf.TensorSpec([None, None], tf.int32) for k in batches[0]}

    def gen():
        for batch in itertools.cycle(batches):
            yield from split_batch(batch, split)

    return tf.data.Dataset.from_generator(gen, output_signature=spec)


#: No dropout in either Transformer stack (a model section to merge).
NO_DROPOUT = {stack: {"transformer": {"input_dropout": 0.0, "residual_dropout": 0.0}}
              for stack in ("encoder", "decoder")}


def make_trainer_class(train_batches=None, split=1):
    """A fresh :class:`SyntheticTrainer` class (its class attributes may be set freely)."""
    from deep_nmt_tf.training import Trainer

    class SyntheticTrainer(Trainer):
        """Trains the real Transformer on in-memory copy-task batches.

        Class attributes (set per test): ``train_batches`` (list of global batches), ``split``
        (pieces per global batch: accumulation micro-batches x replicas), ``dev_batches``.
        """

        dev_batches = make_batches(2, seed=99)

        def prepare(self, config):
            return config

        def build_train_dataset(self, input_context):
            return batches_dataset(self.train_batches, self.split)

        def build_eval_dataset(self):
            import tensorflow as tf

            def gen():
                for b in self.dev_batches:
                    text = [" ".join(f"w{i}" for i in r if i > 2) for r in b["target_output_ids"]]
                    yield dict(b, target_text=np.array(text, dtype=object))

            spec = {k: tf.TensorSpec([None, None], tf.int32) for k in self.dev_batches[0]}
            spec["target_text"] = tf.TensorSpec([None], tf.string)
            return tf.data.Dataset.from_generator(gen, output_signature=spec)

        def detokenize(self, ids):
            from deep_nmt_tf.training.metrics import strip_ids

            return [" ".join(f"w{i}" for i in strip_ids(x)) for x in ids]

    SyntheticTrainer.train_batches = train_batches or make_batches(4)
    SyntheticTrainer.split = split
    return SyntheticTrainer


def weights(trainer):
    return [np.array(v.numpy()) for v in trainer.model.variables]


def optimizer_state(trainer):
    return [np.array(v.numpy()) for v in trainer.optimizer.variables]


#: Seconds a test's subprocess may run: a hang still fails, but a loaded 2-core machine must
#: not (test_mirrored_strategy_matches_default takes 97 s beside a training, and passed 300 s
#: when the suite's two workers and a training shared the cores).
SUBPROCESS_TIMEOUT = 600


@contextlib.contextmanager
def captured_logs():
    """The absl log messages (INFO and up) emitted inside the ``with`` block, as a list."""
    import logging

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("absl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run_python(code, env=None, timeout=SUBPROCESS_TIMEOUT):
    """Runs ``code`` in a fresh Python with ``tests/`` and the repo on sys.path."""
    import subprocess

    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": os.pathsep.join([HERE, ROOT, full_env.get("PYTHONPATH", "")]),
                     "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def run_tool(name, *args, input=None, timeout=SUBPROCESS_TIMEOUT, cwd=None, env=None):
    """Runs ``python -m deep_nmt_tf.tools.<name> *args`` in a fresh process, the way an installed
    package runs: from outside the source tree (``cwd``: the temporary directory by default), so
    that ``deep_nmt_tf`` and its ``tools`` are the installed ones (editable or not); ``env``
    adds environment variables."""
    import subprocess
    import tempfile

    return subprocess.run([sys.executable, "-m", f"deep_nmt_tf.tools.{name}", *args],
                          cwd=cwd or tempfile.gettempdir(), input=input, capture_output=True,
                          text=True, timeout=timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))


def test_split_batch_keeps_rows():
    batch = make_batches(1, batch_size=5)[0]
    pieces = split_batch(batch, 2)
    assert [len(p["source_ids"]) for p in pieces] == [3, 2]
    for k in batch:
        got = sorted(int((p[k] != 0).sum()) for p in pieces)
        assert sum(got) == int((batch[k] != 0).sum())
