"""Several weighted training corpora (data.train) in both training routes, the per-corpus and
sampled pair counts of data_stats.json, and resuming the input pipeline from a checkpoint."""

import json
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.config import ConfigError, config_from_dict
from deep_nmt_tf.constants import RESERVED_TOKENS
from deep_nmt_tf.data import pipeline
from deep_nmt_tf.data.batching import TokenBatches
from deep_nmt_tf.data.preprocess import preprocess_run
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.data.token_ids import TokenIds
from deep_nmt_tf.data.tokenizers import build_tokenizer
from deep_nmt_tf.data.vocab import write_vocab
from deep_nmt_tf.run_dir import RunDir

WORDS = ["aa", "bb", "cc", "dd"]
AA, BB = len(RESERVED_TOKENS), len(RESERVED_TOKENS) + 1  # the ids of "aa" and "bb"


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Corpus "clean": 200 pairs of "aa ..." lines; "crawl": 300 pairs of "bb ..." lines, of
    which every third is too long for the limits below and one is empty."""
    d = tmp_path_factory.mktemp("corpora")
    clean = [" ".join(["aa"] * (1 + i % 5)) for i in range(200)]
    crawl = [" ".join(["bb"] * (1 + i % 4 + (20 if i % 3 == 0 else 0))) for i in range(300)]
    crawl[4] = ""
    vocab = str(d / "vocab.txt")
    write_vocab(list(RESERVED_TOKENS) + WORDS, vocab)
    return {"clean_src": _write(d / "clean.src", clean),
            "clean_tgt": _write(d / "clean.tgt", [s.replace("aa", "cc") for s in clean]),
            "crawl_src": _write(d / "crawl.src", crawl),
            "crawl_tgt": _write(d / "crawl.tgt", [s.replace("bb", "dd") or "dd"
                                                  for s in crawl]),
            "vocab": vocab, "dir": str(d)}


def _config(files, weights=(3.0, 1.0), **data):
    corpora = [{"source": files["clean_src"], "target": files["clean_tgt"], "weight": weights[0],
                "name": "clean"},
               {"source": files["crawl_src"], "target": files["crawl_tgt"], "weight": weights[1],
                "name": "crawl"}]
    return config_from_dict({
        "data": {"train": corpora, "vocab": files["vocab"], "max_source_length": 12,
                 "max_target_length": 12, "shuffle_buffer": 100, "num_buckets": 2, **data},
        "training": {"batch_tokens": 400, "seed": 5}})


def _share_of_clean(rows):
    rows = [r for r in rows if len(r)]
    return sum(r[0] == AA for r in rows) / len(rows)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


def test_config_checks_name_the_key(files):
    with pytest.raises(ConfigError, match=r"data\.train\[1\]\.weight: -1\.0 is out of range"):
        _config(files, weights=(1.0, -1.0))
    with pytest.raises(ConfigError, match=r"data\.train_source: set together with data\.train"):
        _config(files, train_source=files["clean_src"])
    with pytest.raises(ConfigError, match=r"data\.train\[0\]\.weigth: unknown key"):
        config_from_dict({"data": {"train": [{"source": "a", "target": "b", "weigth": 2}]}})
    with pytest.raises(ConfigError, match=r"data\.train\[0\]\.target: required"):
        config_from_dict({"data": {"train": [{"source": "a"}]}})
    with pytest.raises(ConfigError, match=r"data\.train: set, but data\.corpus is 'synthetic'"):
        config_from_dict({}, overrides=["data.corpus=synthetic",
                                        "data.train=[{source: a, target: b}]"])
    single = config_from_dict({"data": {"train_source": "a", "train_target": "b"}})
    (corpus,) = single.data.training_corpora()
    assert (corpus.source, corpus.target, corpus.weight, corpus.name) == ("a", "b", 1.0, "train")


def test_run_directory_stores_corpus_paths_like_the_others(files, tmp_path):
    run = RunDir(str(tmp_path / "run"))
    inside = os.path.join(run.path, "data")
    os.makedirs(inside)
    moved = {k: os.path.join(inside, os.path.basename(v)) for k, v in files.items()
             if k.endswith(("src", "tgt"))}
    for key, path in moved.items():
        with open(files[key], encoding="utf-8") as f, open(path, "w", encoding="utf-8") as g:
            g.write(f.read())
    config = _config({**files, **moved})
    run.write_config(config)
    saved = open(run.config_path, encoding="utf-8").read()
    assert "source: data/clean.src" in saved and "target: data/crawl.tgt" in saved
    loaded = run.load_config()
    assert [c.source for c in loaded.data.train] == [moved["clean_src"], moved["crawl_src"]]
    assert [c.weight for c in loaded.data.train] == [3.0, 1.0]


# ---------------------------------------------------------------------------------------------
# Preparation: per-corpus counts, sampled counts
# ---------------------------------------------------------------------------------------------


def test_prepare_data_counts_each_corpus(files, tmp_path, caplog):
    run = RunDir(str(tmp_path / "run"))
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline.prepare_data(_config(files), run)
    text = caplog.text
    assert re.search(r"clean: 200 pairs; 0 empty and 0 over the length limits .* 200 kept "
                     r"\(weight 3: 75\.0% of the training pairs\)", text), text
    assert re.search(r"crawl: 300 pairs; 1 empty and 100 over the length limits .* 199 kept "
                     r"\(weight 1: 25\.0%", text), text
    assert re.search(r"train: 500 pairs; 1 empty and 100 over .* 399 kept in 2 corpora", text)
    with open(run.data_stats_path, encoding="utf-8") as f:
        saved = json.load(f)["stats"]
    assert [(c["name"], c["pairs"], c["empty"], c["too_long"], c["sampled"])
            for c in saved["corpora"]] == [("clean", 200, 0, 0, 0), ("crawl", 300, 1, 100, 0)]
    assert saved["total"]["pairs"] == 500 and saved["total"]["too_long"] == 100
    # A second preparation reads no corpus: every count comes from data_stats.json.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline.prepare_data(_config(files), run)
    assert "lines in" not in caplog.text  # no check_parallel pass over the training files
    assert "crawl: 300 pairs; 1 empty and 100 over" in caplog.text


def test_a_corpus_without_usable_pairs_is_named(files, tmp_path):
    with pytest.raises(DataError, match=r"no usable training pairs in .*clean\.src / "
                                        r".*clean\.tgt: 200 pairs; 0 empty and 200 over"):
        pipeline.prepare_data(_config(files, max_source_length=1, max_target_length=50),
                              str(tmp_path / "run"))


def test_length_counts_of_a_large_corpus_are_sampled_and_marked(files, tmp_path, caplog):
    config = _config(files, length_stats_sample_size=60)
    with caplog.at_level(logging.INFO, logger="absl"):
        stats = pipeline.check_lengths(config, str(tmp_path / "run"))
    clean, crawl = stats
    assert (clean.sampled, crawl.sampled) == (60, 60)
    assert clean.too_long == 0 and crawl.empty == 1 and crawl.pairs == 300
    assert 85 <= crawl.too_long <= 115  # 100 exactly, estimated from 60 pairs
    assert "estimated from 60 pairs spread over the corpus" in caplog.text
    exact = pipeline.length_stats(config, build_tokenizer(config), config.data.train[1])
    assert (exact.too_long, exact.sampled) == (100, 0)


# ---------------------------------------------------------------------------------------------
# Drawn proportions: tf.data and the Keras batcher
# ---------------------------------------------------------------------------------------------


def _pipeline_rows(config, n):
    rows = []
    for batch in pipeline.make_train_dataset(config, build_tokenizer(config)):
        rows.extend(r[r != 0] for r in batch["source_ids"].numpy())
        if len(rows) >= n:
            return rows


@pytest.mark.parametrize("weights,share", [((3.0, 1.0), 0.75), ((1.0, 4.0), 0.2)])
def test_pipeline_draws_the_weighted_proportions(files, weights, share):
    rows = _pipeline_rows(_config(files, weights), 3000)
    assert abs(_share_of_clean(rows) - share) < 0.035, _share_of_clean(rows)
    crawl = [r for r in rows if r[0] == BB]
    assert all(len(r) <= 12 for r in crawl)  # over-long crawl pairs dropped before the draw


def test_pipeline_weights_are_deterministic_and_sharded(files):
    config = _config(files)
    first = _pipeline_rows(config, 200)
    again = _pipeline_rows(config, 200)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                         num_replicas_in_sync=2)
    batch = next(iter(pipeline.make_train_dataset(config, build_tokenizer(config), context)))
    assert int(np.count_nonzero(batch["source_ids"])) + int(
        np.count_nonzero(batch["target_input_ids"])) <= 200


@pytest.fixture(scope="module")
def token_ids(files, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("preprocessed"))
    config, written = preprocess_run(_config(files), run, splits=["train"])
    return config, TokenIds.load(written["train"])


def test_preprocess_lists_the_corpora(token_ids):
    _, ids = token_ids
    assert len(ids) == 500
    assert [(c["name"], c["weight"], c["pairs"]) for c in ids.info["corpora"]] == [
        ("clean", 3.0, 200), ("crawl", 1.0, 300)]
    assert ids.info["tokenizer_type"] == "wordpiece"
    assert ids.source(0)[0] == AA and ids.source(200)[0] == BB


def _batcher_rows(batches, n):
    rows, i = [], 0
    while len(rows) < n:
        x, _ = batches[i % len(batches)]
        rows.extend(r[r != 0] for r in x["source_ids"])
        i += 1
        if i % len(batches) == 0:
            batches.on_epoch_end()
    return rows


@pytest.mark.parametrize("weights,share", [((3.0, 1.0), 0.75), ((1.0, 4.0), 0.2)])
def test_keras_batcher_draws_the_weighted_proportions(files, token_ids, weights, share, caplog):
    config, ids = token_ids
    config = _config(files, weights)  # the config's weights override the file's
    with caplog.at_level(logging.INFO, logger="absl"):
        batches = TokenBatches.from_config(config, ids, num_batches=50, static_shapes=False)
    assert "corpus crawl: 300 pairs, 101 dropped" in caplog.text
    assert [c[:2] for c in batches.corpora] == [("clean", weights[0]), ("crawl", weights[1])]
    rows = _batcher_rows(batches, 3000)
    assert abs(_share_of_clean(rows) - share) < 0.035, _share_of_clean(rows)
    assert all(len(r) <= 12 for r in rows)
    # Deterministic, and a resumed stream (start) continues the same batches.
    again = TokenBatches.from_config(config, ids, num_batches=50, static_shapes=False)
    later = TokenBatches.from_config(config, ids, num_batches=50, start=7, static_shapes=False)
    np.testing.assert_array_equal(again[7][0]["source_ids"], later[0][0]["source_ids"])


def test_keras_batcher_names_an_unusable_corpus(token_ids):
    _, ids = token_ids
    with pytest.raises(ValueError, match="no training pair of corpus 'clean' has at most 1 "):
        TokenBatches(ids, 400, 1, 50, 2, 0, 10)


# ---------------------------------------------------------------------------------------------
# Resume: the input pipeline's iterator in a checkpoint
# ---------------------------------------------------------------------------------------------


def test_a_checkpointed_pipeline_iterator_resumes_exactly(files, tmp_path):
    config = _config(files)
    tokenizer = build_tokenizer(config)
    iterator = iter(pipeline.make_train_dataset(config, tokenizer))
    for _ in range(6):
        next(iterator)
    path = tf.train.Checkpoint(data_iterator=iterator).save(str(tmp_path / "ckpt"))
    want = [next(iterator)["source_ids"].numpy() for _ in range(8)]
    resumed = iter(pipeline.make_train_dataset(config, tokenizer))
    tf.train.Checkpoint(data_iterator=resumed).restore(path).assert_consumed()
    got = [next(resumed)["source_ids"].numpy() for _ in range(8)]
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_sampled_lines_are_read_by_number_across_block_boundaries(tmp_path, monkeypatch):
    from deep_nmt_tf.data import text_io

    lines = [f"line {i} " + "x" * (i % 7) for i in range(103)] + ["crlf\r", "last"]
    path = tmp_path / "t.txt"
    path.write_bytes("\n".join(lines).encode("utf-8"))  # no line break after the last line
    for total, size in ((105, 10), (105, 0), (105, 105), (4993650, 1000)):
        keep = text_io.sample_lines(total, size)
        numbers = text_io.sampled_line_numbers(total, size)
        assert len(numbers) == (min(size, total) or total)
        assert numbers[:50] == [i for i in range(numbers[min(49, len(numbers) - 1)] + 1)
                                if keep is None or keep(i)][:50]
    monkeypatch.setattr(text_io, "_BLOCK", 16)  # many blocks, lines split across them
    numbers = [0, 1, 15, 16, 50, 102, 103, 104]
    want = [lines[i].rstrip("\r") for i in numbers]
    assert text_io.read_line_numbers(str(path), numbers) == want
    assert text_io.read_line_numbers(str(path), text_io.sampled_line_numbers(105, 10)) == [
        lines[i].rstrip("\r") for i in text_io.sampled_line_numbers(105, 10)]
