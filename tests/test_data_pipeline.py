"""Tests for deep_nmt_tf.data.text_io and deep_nmt_tf.data.pipeline."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.config import config_from_dict
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.data import pipeline, synthetic
from deep_nmt_tf.data.text_io import DataError, check_parallel, count_lines, is_blank
from deep_nmt_tf.data.vocab import Tokenizer, build_vocab

BATCH_TOKENS = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    paths = synthetic.write_corpus(str(directory), 300, 20, 20, seed=21)
    vocab = str(directory / "vocab.txt")
    build_vocab([paths["train_source"], paths["train_target"]], vocab, vocab_size=500)
    return {**paths, "vocab": vocab, "dir": str(directory)}


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return Tokenizer(corpus["vocab"])


@pytest.fixture(scope="module")
def default_batches(corpus, tokenizer):
    """The first 30 batches of the default training pipeline (shared: pipelines are slow)."""
    return _batches(pipeline.make_train_dataset(_config(corpus), tokenizer), 30)


def _config(corpus, **training):
    data = {k: corpus[k] for k in ("train_source", "train_target", "dev_source", "dev_target",
                                   "test_source", "test_target", "vocab")}
    data.update(shuffle_buffer=1000, max_source_length=64, max_target_length=64, num_buckets=6)
    return config_from_dict({"data": data,
                             "training": {"batch_tokens": BATCH_TOKENS, "seed": 7, **training}})


def _batches(dataset, n):
    return [{k: v.numpy() for k, v in batch.items()} for batch in dataset.take(n)]


def _write(path, lines, raw=False):
    with open(path, "wb") as f:
        f.write(lines if raw else "".join(line + "\n" for line in lines).encode("utf-8"))
    return str(path)


# ---------------------------------------------------------------------------------------------
# text_io
# ---------------------------------------------------------------------------------------------


def test_count_lines(tmp_path):
    assert count_lines(_write(tmp_path / "a", b"x\ny\n", raw=True)) == 2
    assert count_lines(_write(tmp_path / "b", b"x\ny", raw=True)) == 2
    assert count_lines(_write(tmp_path / "c", b"", raw=True)) == 0
    assert count_lines(_write(tmp_path / "d", b"\n\n", raw=True)) == 2


def test_misaligned_corpus_is_refused_naming_paths_and_counts(tmp_path):
    src = _write(tmp_path / "train.src", ["a", "b", "c"])
    tgt = _write(tmp_path / "train.tgt", ["x", "y"])
    with pytest.raises(DataError) as info:
        check_parallel(src, tgt)
    message = str(info.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2 lines" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = _write(tmp_path / "s.txt", b"ok\nfine\nbad \xc3\x28 here\n", raw=True)
    tgt = _write(tmp_path / "t.txt", ["a", "b", "c"])
    with pytest.raises(DataError, match=rf"{src}:3: invalid UTF-8"):
        check_parallel(src, tgt)
    with pytest.raises(DataError, match=rf"{src}:3: invalid UTF-8"):
        check_parallel(tgt, src)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="nope.src: cannot open corpus file"):
        check_parallel(str(tmp_path / "nope.src"), str(tmp_path / "nope.tgt"))


def test_blank_detection_agrees_between_python_and_tensorflow():
    lines = ["", " ", "\t\r", "\u3000", "\u00a0\u2029", "\x1c\x85", "a", " b ", "\u200b", "."]
    python = [is_blank(line) for line in lines]
    graph = [bool(pipeline._not_blank(tf.constant(line), tf.constant("x")).numpy()) is False
             for line in lines]
    assert python == graph == [True] * 6 + [False] * 4


# ---------------------------------------------------------------------------------------------
# Training batches
# ---------------------------------------------------------------------------------------------


def test_batch_format(default_batches):
    for batch in default_batches:
        assert sorted(batch) == ["source_ids", "target_input_ids", "target_output_ids"]
        assert all(v.dtype == np.int32 for v in batch.values())
        src, tgt_in, tgt_out = batch["source_ids"], batch["target_input_ids"], \
            batch["target_output_ids"]
        assert tgt_in.shape == tgt_out.shape and src.shape[0] == tgt_in.shape[0]
        for s, ti, to in zip(src, tgt_in, tgt_out):
            s_len, t_len = np.count_nonzero(s), np.count_nonzero(ti)
            assert s_len > 1 and t_len > 1, "empty pairs must not reach training"
            assert (s[s_len:] == PAD_ID).all() and (ti[t_len:] == PAD_ID).all()
            assert s[s_len - 1] == EOS_ID and EOS_ID not in s[:s_len - 1]
            assert ti[0] == BOS_ID and to[t_len - 1] == EOS_ID
            np.testing.assert_array_equal(ti[1:t_len], to[:t_len - 1])
            assert BOS_ID not in ti[1:] and BOS_ID not in s and EOS_ID not in ti


def test_source_and_target_match_the_files(corpus, tokenizer, default_batches):
    lines = set(zip(open(corpus["train_source"], encoding="utf-8").read().splitlines(),
                    open(corpus["train_target"], encoding="utf-8").read().splitlines()))
    batch = default_batches[0]
    sources = [x.decode() for x in tokenizer.detokenize(batch["source_ids"]).numpy()]
    targets = [x.decode() for x in tokenizer.detokenize(batch["target_output_ids"]).numpy()]
    assert set(zip(sources, targets)) <= lines


def _check_batch_tokens(batches, batch_tokens):
    for batch in batches:
        size, src_len = batch["source_ids"].shape
        tgt_len = batch["target_input_ids"].shape[1]
        assert size * (src_len + tgt_len) <= batch_tokens or size == 1


def test_batches_respect_batch_tokens(default_batches):
    _check_batch_tokens(default_batches, BATCH_TOKENS)
    # Batches are reasonably full: at least a third of the budget on average.
    used = [b["source_ids"].size + b["target_input_ids"].size for b in default_batches]
    assert np.mean(used) >= BATCH_TOKENS / 3


@pytest.mark.parametrize("key", ["jit_compile", "static_shapes"])
def test_fixed_shape_training_pads_to_bucket_bounds(corpus, tokenizer, key):
    config = _config(corpus, **{key: True})
    bounds = pipeline.bucket_upper_bounds(64, config.data.num_buckets)
    batches = _batches(pipeline.make_train_dataset(config, tokenizer), 30)
    _check_batch_tokens(batches, BATCH_TOKENS)
    for batch in batches:  # Fixed shapes: padded to the bucket bound.
        src_len, tgt_len = batch["source_ids"].shape[1], batch["target_input_ids"].shape[1]
        assert src_len == tgt_len and src_len in bounds


def test_batch_size_multiple(corpus, tokenizer):
    dataset = pipeline.make_train_dataset(_config(corpus), tokenizer, batch_size_multiple=2)
    assert all(b["source_ids"].shape[0] % 2 == 0 for b in _batches(dataset, 10))


def test_long_pairs_are_filtered(corpus, tokenizer):
    config = _config(corpus)
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, max_source_length=20, max_target_length=22))
    for batch in _batches(pipeline.make_train_dataset(config, tokenizer), 10):
        assert batch["source_ids"].shape[1] <= 20 and batch["target_input_ids"].shape[1] <= 22


def test_bucket_helpers():
    bounds = pipeline.bucket_upper_bounds(128, 16)
    assert bounds[0] == 8 and bounds[-1] == 128 and bounds == sorted(set(bounds))
    assert pipeline.bucket_upper_bounds(3, 5) == [3]
    assert pipeline.bucket_batch_sizes([8, 100, 5000], 4096) == [256, 20, 1]
    assert pipeline.bucket_batch_sizes([8, 1000], 4096, batch_size_multiple=4) == [256, 4]


def test_deterministic_given_seed(corpus, tokenizer, default_batches):
    first = default_batches[:3]
    second = _batches(pipeline.make_train_dataset(_config(corpus), tokenizer), 3)
    other = _batches(pipeline.make_train_dataset(_config(corpus, seed=8), tokenizer), 3)
    for a, b in zip(first, second):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(a["source_ids"].shape != c["source_ids"].shape
               or (a["source_ids"] != c["source_ids"]).any() for a, c in zip(first, other))


def test_autotune_is_the_configs_choice_and_leaves_the_batches_alone(corpus, tokenizer,
                                                                       default_batches):
    """data.autotune (off by default) sets tf.data's autotuning model on the pipelines; the
    batches are the same either way."""
    config = _config(corpus)
    assert config.data.autotune is False
    on = dataclasses.replace(config, data=dataclasses.replace(config.data, autotune=True))
    for cfg, want in ((config, False), (on, True)):
        train = pipeline.make_train_dataset(cfg, tokenizer)
        dev = pipeline.make_dev_dataset(cfg, tokenizer)
        assert train.options().autotune.enabled is want
        assert dev.options().autotune.enabled is want
    for a, b in zip(default_batches[:3], _batches(pipeline.make_train_dataset(on, tokenizer), 3)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_default_autotune_fills_in_only_an_unset_choice():
    from deep_nmt_tf.training.strategy import distributed_iterator

    from deep_nmt_tf.data.options import default_autotune

    assert default_autotune(tf.data.Dataset.range(3), False).options().autotune.enabled is False
    options = tf.data.Options()
    options.autotune.enabled = True
    own = tf.data.Dataset.range(3).with_options(options)
    assert default_autotune(own, False).options().autotune.enabled is True
    # A trainer's own dataset gets the config's choice through the training iterator.
    iterator = distributed_iterator(tf.distribute.get_strategy(),
                                    lambda context: tf.data.Dataset.range(5), autotune=False)
    assert iterator._dataset.options().autotune.enabled is False  # pylint: disable=protected-access
    assert [int(x) for x in iterator] == list(range(5))


def _rows(batches):
    return [tuple(row[row != PAD_ID]) for batch in batches for row in batch["source_ids"]]


def test_sharding_gives_disjoint_shards(corpus, tokenizer):
    config = _config(corpus)
    shards = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=2)
        batches = _batches(pipeline.make_train_dataset(config, tokenizer, context), 12)
        _check_batch_tokens(batches, BATCH_TOKENS // 2)  # Per-replica batches.
        shards.append(set(_rows(batches)))
    assert shards[0] and shards[1] and not shards[0] & shards[1]


def test_distribution_strategy_paths(corpus, tokenizer):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    config = _config(corpus)
    for per_replica in (True, False):
        dataset = pipeline.distribute_train_dataset(strategy, config, tokenizer, per_replica)
        batch = next(iter(dataset))
        assert batch["source_ids"].dtype == tf.int32


def test_empty_pairs_are_dropped_and_counted(tmp_path, tokenizer):
    src = _write(tmp_path / "s", ["Ta kosa.", "", "Mi zabro.", "  ", "Ta disa.", "Ta nopo."])
    tgt = _write(tmp_path / "t", ["Dhae x.", "Dhe y.", "", "Wes z.", "\u3000", "Dhae w."])
    stats = check_parallel(src, tgt)
    assert (stats.num_lines, stats.num_empty_pairs, stats.num_pairs) == (6, 4, 2)
    config = config_from_dict({"data": {"train_source": src, "train_target": tgt},
                               "training": {"batch_tokens": 10000}})
    rows = _rows(_batches(pipeline.make_train_dataset(config, tokenizer), 4))
    expected = {tuple(tokenizer.tokenize(tf.constant(s)).numpy()) + (EOS_ID,)
                for s in ("Ta kosa.", "Ta nopo.")}
    assert set(rows) == expected


# ---------------------------------------------------------------------------------------------
# Evaluation batches
# ---------------------------------------------------------------------------------------------


def test_eval_dataset_keeps_file_order(corpus, tokenizer):
    config = _config(corpus)
    # Limits above the longest dev line, so that nothing is truncated (truncation is tested
    # below): the sentences must come back whole and in file order.
    dataset = pipeline.make_eval_dataset(config, tokenizer, corpus["dev_source"],
                                         corpus["dev_target"], batch_size=8, include_text=True,
                                         max_source_length=512, max_target_length=512)
    batches = _batches(dataset, -1)
    assert [b["source_ids"].shape[0] for b in batches] == [8, 8, 4]
    sources = [t.decode() for b in batches for t in b["source_text"]]
    assert sources == open(corpus["dev_source"], encoding="utf-8").read().splitlines()
    decoded = [t.decode() for b in batches
               for t in tokenizer.detokenize(b["target_output_ids"]).numpy()]
    assert decoded == open(corpus["dev_target"], encoding="utf-8").read().splitlines()
    assert all(b["target_input_ids"][0, 0] == BOS_ID for b in batches)


def test_eval_dataset_truncates_and_limits(corpus, tokenizer):
    config = _config(corpus)
    dataset = pipeline.make_eval_dataset(config, tokenizer, corpus["dev_source"],
                                         corpus["dev_target"], batch_size=50, max_sentences=5,
                                         max_source_length=4, max_target_length=3)
    (batch,) = _batches(dataset, -1)
    assert batch["source_ids"].shape == (5, 4) and batch["target_output_ids"].shape == (5, 3)
    assert (batch["source_ids"][:, -1] == EOS_ID).all()
    assert (batch["target_output_ids"][:, -1] == EOS_ID).all()


def test_dev_dataset_uses_max_dev_sentences(corpus, tokenizer):
    config = _config(corpus)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                  max_dev_sentences=7))
    batches = _batches(pipeline.make_dev_dataset(config, tokenizer, batch_size=4), -1)
    assert sum(b["source_ids"].shape[0] for b in batches) == 7


# ---------------------------------------------------------------------------------------------
# prepare_data
# ---------------------------------------------------------------------------------------------


def test_prepare_data_synthetic(tmp_path):
    config = config_from_dict({"data": {"corpus": "synthetic", "synthetic_train_size": 120,
                                        "synthetic_dev_size": 10, "synthetic_test_size": 10,
                                        "vocab_size": 200}})
    model_dir = str(tmp_path / "run")
    prepared = pipeline.prepare_data(config, model_dir)
    data = prepared.data
    assert data.train_source == os.path.join(model_dir, "data", "train.src")
    assert data.test_target == os.path.join(model_dir, "data", "test.tgt")
    assert data.vocab == os.path.join(model_dir, "vocab.txt")
    assert prepared.model.vocab_size == count_lines(data.vocab) <= 200
    assert config.data.train_source == ""  # The input config is not modified.
    stamp = os.stat(data.vocab).st_mtime_ns
    assert pipeline.prepare_data(config, model_dir) == prepared
    assert os.stat(data.vocab).st_mtime_ns == stamp  # Neither corpus nor vocab rewritten.


def test_prepare_data_checks_corpora_before_learning_a_vocab(tmp_path, corpus):
    bad = _write(tmp_path / "dev.tgt", ["only one line"])
    config = _config(corpus)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, vocab="",
                                                                  dev_target=bad))
    with pytest.raises(DataError, match=f"{corpus['dev_source']} has 20 lines but {bad} has 1"):
        pipeline.prepare_data(config, str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run" / "vocab.txt")


def test_prepare_data_vocab_errors(tmp_path, corpus):
    config = _config(corpus)
    missing = dataclasses.replace(config, data=dataclasses.replace(
        config.data, vocab=str(tmp_path / "missing.txt")))
    with pytest.raises(DataError, match="data.vocab: .*missing.txt: vocabulary file not found"):
        pipeline.prepare_data(missing, str(tmp_path))
    small = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=10))
    with pytest.raises(DataError, match="model.vocab_size: 10 is smaller than the vocabulary"):
        pipeline.prepare_data(small, str(tmp_path))


def test_prepare_data_logs_dropped_empty_pairs(tmp_path, corpus, caplog):
    src = _write(tmp_path / "s", ["Ta kosa.", "", "Mi zabro."])
    tgt = _write(tmp_path / "t", ["Dhae x.", "Dhe y.", "Wes z."])
    config = config_from_dict({"data": {"train_source": src, "train_target": tgt,
                                        "vocab": corpus["vocab"]}})
    with caplog.at_level("INFO"):
        pipeline.prepare_data(config, str(tmp_path))
    assert "train: 3 lines" in caplog.text and "1 empty pairs dropped, 2 kept" in caplog.text


def test_prepare_data_refuses_a_corpus_without_usable_pairs(tmp_path, corpus):
    src = _write(tmp_path / "s", ["", "x"])
    tgt = _write(tmp_path / "t", ["y", " "])
    config = config_from_dict({"data": {"train_source": src, "train_target": tgt,
                                        "vocab": corpus["vocab"]}})
    with pytest.raises(DataError, match="no usable training pairs"):
        pipeline.prepare_data(config, str(tmp_path))
