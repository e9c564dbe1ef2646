"""Token-id files, the TensorFlow-free batcher (``TokenBatches``/``EvalBatches``, Keras
``PyDataset`` s) and the plain-Python ``Detokenizer`` (deep_nmt_tf.data.token_ids/batching)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.data.batching import (EvalBatches, TokenBatches, bucket_batch_sizes,
                                       bucket_upper_bounds, bucket_shapes)
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.data.token_ids import Detokenizer, TokenIds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _corpus(n=200, seed=0, vocab=50, longest=30):
    rng = np.random.RandomState(seed)
    src = [list(rng.randint(4, vocab, size=rng.randint(0, longest))) for _ in range(n)]
    tgt = [list(rng.randint(4, vocab, size=rng.randint(1, longest))) for _ in range(n)]
    return TokenIds.from_rows(src, tgt, vocab, "abc123", split="train")


def test_the_fit_route_imports_without_tensorflow():
    code = ("import sys\n"
            "import deep_nmt_tf.data.batching, deep_nmt_tf.data.token_ids, deep_nmt_tf.progress\n"
            "import deep_nmt_tf.fit, deep_nmt_tf.fit.run, deep_nmt_tf.fit.callbacks\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_text'))\n"
            "assert not bad, bad[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_token_ids_round_trip_and_vocabulary_check(tmp_path):
    data = _corpus(20)
    path = data.save(str(tmp_path / "train.npz"))
    again = TokenIds.load(path, vocab_sha256="abc123")
    assert len(again) == 20 and again.info["split"] == "train"
    for i in range(20):
        np.testing.assert_array_equal(again.source(i), data.source(i))
        np.testing.assert_array_equal(again.target(i), data.target(i))
    with pytest.raises(DataError, match="another vocabulary"):
        TokenIds.load(path, vocab_sha256="fff")
    with pytest.raises(DataError, match="deep-nmt-preprocess"):
        TokenIds.load(str(tmp_path / "missing.npz"))


def test_bucketing_is_the_pipelines():
    from deep_nmt_tf.data import pipeline

    assert pipeline.bucket_upper_bounds is bucket_upper_bounds
    assert pipeline.bucket_batch_sizes is bucket_batch_sizes


@pytest.mark.parametrize("static_shapes", [True, False])
def test_token_batches_respect_the_budget_and_the_length_limits(static_shapes):
    data = _corpus()
    batches = TokenBatches(data, batch_tokens=200, max_source_length=20, max_target_length=24,
                           num_buckets=3, seed=1, num_batches=30, static_shapes=static_shapes)
    kept = {i for i in range(len(data)) if 0 < len(data.source(i)) < 20
            and len(data.target(i)) < 24}
    assert batches.num_dropped == len(data) - len(kept)
    seen = []
    for b in range(len(batches)):
        x, y = batches[b]
        src, tin = x["source_ids"], x["target_input_ids"]
        assert src.dtype == tin.dtype == y.dtype == np.int32
        assert src.shape[0] * (src.shape[1] + tin.shape[1]) <= 200
        if static_shapes:
            assert src.shape[1] == tin.shape[1] in batches.bounds
        np.testing.assert_array_equal(tin[:, 0], BOS_ID)
        for row in range(len(src)):
            s = src[row][src[row] != PAD_ID]
            t = y[row][y[row] != PAD_ID]
            assert s[-1] == EOS_ID and t[-1] == EOS_ID
            np.testing.assert_array_equal(tin[row, 1:len(t)], t[:-1])
            seen.append((tuple(s[:-1]), tuple(t[:-1])))
        assert batches.tokens(b) == sum(int((a != PAD_ID).sum()) for a in (src, y))
    pairs = {(tuple(data.source(i)), tuple(data.target(i))) for i in kept}
    assert set(seen) <= pairs
    assert len(set(seen)) > 0.8 * len(pairs)  # 30 batches cover more than a pass.


def test_shape_classes_group_neighbouring_buckets_into_their_largest_shape():
    bounds, sizes = [8, 10, 13, 16, 20], [50, 40, 30, 25, 20]
    assert bucket_shapes(bounds, sizes, 0) == list(zip(sizes, bounds))  # one per bucket
    assert bucket_shapes(bounds, sizes, 5) == bucket_shapes(bounds, sizes, 9) == list(
        zip(sizes, bounds))
    assert bucket_shapes(bounds, sizes, 1) == [(50, 20)] * 5
    # 5 buckets in 2 classes: 2 + 3 (the longer ones get the extra bucket).
    assert bucket_shapes(bounds, sizes, 2) == [(50, 10)] * 2 + [(30, 20)] * 3


def test_shape_classes_pad_the_same_batches_to_fewer_shapes_with_empty_rows():
    """The same pairs in the same batches, in ``shape_classes`` shapes; the rows added hold
    no token (the loss and its token and sentence counts are unchanged)."""
    data = _corpus(400)
    kwargs = dict(batch_tokens=400, max_source_length=32, max_target_length=32, num_buckets=6,
                  seed=2, num_batches=40, static_shapes=True)
    plain, grouped = TokenBatches(data, **kwargs), TokenBatches(data, shape_classes=2, **kwargs)
    shapes = set()
    for b in range(40):
        (x, y), (gx, gy) = plain[b], grouped[b]
        shapes.add(gx["source_ids"].shape)
        rows, width = x["source_ids"].shape
        assert gx["source_ids"].shape[0] >= rows and gx["source_ids"].shape[1] >= width
        for key in ("source_ids", "target_input_ids"):
            np.testing.assert_array_equal(gx[key][:rows, :width], x[key])
            assert (gx[key][rows:] == PAD_ID).all() and (gx[key][:, width:] == PAD_ID).all()
        np.testing.assert_array_equal(gy[:rows, :width], y)
        assert (gy[rows:] == PAD_ID).all() and grouped.tokens(b) == plain.tokens(b)
    assert len(shapes) <= 2 < len({plain[b][0]["source_ids"].shape for b in range(40)})


def test_the_custom_loop_refuses_shape_classes(tmp_path):
    from deep_nmt_tf.config import ConfigError, config_from_dict
    from deep_nmt_tf.training import Runner
    from test_decoding_helpers import TINY

    tree = dict(TINY, training=dict(TINY["training"], shape_classes=3))
    with pytest.raises(ConfigError, match="training.shape_classes=3: only the Keras fit route"):
        Runner(config_from_dict(tree, source="<t>"), str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")  # refused before any work


def test_token_batches_continue_across_epochs_and_resume_with_start():
    data = _corpus()
    kwargs = dict(batch_tokens=300, max_source_length=32, max_target_length=32, num_buckets=4,
                  seed=3, static_shapes=True)
    stream = TokenBatches(data, num_batches=5, **kwargs)
    first = [stream[i] for i in range(5)]
    stream.on_epoch_end()
    second = [stream[i] for i in range(5)]
    resumed = TokenBatches(data, num_batches=5, start=5, **kwargs)
    for (x, y), (rx, ry) in zip(second, [resumed[i] for i in range(5)]):
        np.testing.assert_array_equal(x["source_ids"], rx["source_ids"])
        np.testing.assert_array_equal(y, ry)
    assert any(a[1].shape != b[1].shape or (a[1] != b[1]).any() for a, b in zip(first, second))
    with pytest.raises(IndexError):
        stream[5]


def test_eval_batches_keep_every_pair_in_order():
    data = _corpus(21)
    batches = EvalBatches(data, batch_size=8, max_source_length=10, max_target_length=12,
                          static_shapes=True, pad_to=16)
    assert len(batches) == 3
    rows = []
    for b in range(3):
        x, y = batches[b]
        assert x["source_ids"].shape == (8, 16) and y.shape[0] == 8
        rows.extend(r for r in y if (r != PAD_ID).any())
    assert len(rows) == 21
    for i, row in enumerate(rows):
        t = row[row != PAD_ID]
        assert t[-1] == EOS_ID and len(t) <= 12
        np.testing.assert_array_equal(t[:-1], data.target(i)[:len(t) - 1])


def test_detokenizer_matches_the_tensorflow_tokenizer(tmp_path):
    from deep_nmt_tf.data.vocab import Tokenizer, build_vocab

    text = tmp_path / "text.txt"
    lines = ['Ta broku, glimo (vasu) "da" jo.', "Hello world! It's 3.5% ¿no?",
             "Unbelievably long-winded sentences; with colons: and [brackets]."] * 20
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = str(tmp_path / "vocab.txt")
    build_vocab([str(text)], vocab, 120)
    tokenizer = Tokenizer(vocab)
    detok = Detokenizer(vocab)
    ids = tokenizer.tokenize(lines[:3]).to_list()
    ids[1] = ids[1] + [EOS_ID, 7, 8]  # Everything after </s> is dropped.
    ids[2] = [BOS_ID] + ids[2] + [10 ** 6]  # <s> dropped, out-of-vocabulary ids read as [UNK].
    width = max(len(r) for r in ids)
    padded = np.array([r + [PAD_ID] * (width - len(r)) for r in ids], np.int64)
    padded = np.minimum(padded, tokenizer.vocab_size - 1)
    want = [t.decode("utf-8") for t in tokenizer.detokenize(padded).numpy()]
    assert detok.batch(padded) == want


def test_the_fit_loss_of_a_batch_padded_to_its_shape_class_is_the_same():
    import keras

    from deep_nmt_tf import fit
    from deep_nmt_tf.config import config_from_dict
    from test_decoding_helpers import TINY

    config = config_from_dict(dict(TINY, model=dict(TINY["model"], vocab_size=30),
                                   training=dict(TINY["training"], shape_classes=1)),
                              source="<t>")
    keras.utils.set_random_seed(1)
    model = fit.build_fit_model(config)
    fit.compile_model(model, config)
    data = _corpus(60, vocab=30)
    kwargs = dict(batch_tokens=300, max_source_length=20, max_target_length=20, num_buckets=4,
                  seed=1, num_batches=4, static_shapes=True)
    plain, grouped = TokenBatches(data, **kwargs), TokenBatches(data, shape_classes=1, **kwargs)
    padded = False
    for b in range(4):
        (x, y), (gx, gy) = plain[b], grouped[b]
        padded = padded or gx["source_ids"].shape != x["source_ids"].shape
        want = model.evaluate(x, y, batch_size=len(y), verbose=0, return_dict=True)["loss"]
        got = model.evaluate(gx, gy, batch_size=len(gy), verbose=0, return_dict=True)["loss"]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert padded  # (rows and columns of padding were added)


@pytest.mark.parametrize("autotune", [False, True])
def test_fit_on_tensorflow_gets_the_configs_tf_data_autotuning(autotune):
    """``data.autotune`` reaches the ``tf.data`` Keras makes of the batches for ``fit`` on
    TensorFlow: left on (the adapter's ``prefetch(AUTOTUNE)``), deleting an iterator that sat
    idle can wait for the autotuning thread (BENCHMARKS.md); a PyDataset of someone else's
    keeps Keras's choice."""
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's tf.data")
    from deep_nmt_tf import compat
    from deep_nmt_tf.config import config_from_dict
    from test_decoding_helpers import TINY

    config = config_from_dict(dict(TINY, data=dict(TINY.get("data", {}), autotune=autotune)),
                              source="<t>")
    data = _corpus(60)
    adapter = compat._py_dataset_adapter()
    for batches in (TokenBatches.from_config(config, data, num_batches=3),
                    EvalBatches.from_config(config, data)):
        assert batches.tf_data_autotune is autotune
        dataset = adapter(batches, shuffle=False).get_tf_dataset()
        assert dataset.options().autotune.enabled is autotune
        assert next(iter(dataset))[0]["source_ids"].shape[0] >= 1

    class Theirs(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return np.ones([2, 3], np.float32), np.zeros([2, 3], np.float32)

    assert adapter(Theirs(), shuffle=False).get_tf_dataset().options().autotune.enabled is None
