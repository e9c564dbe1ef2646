"""Tests for deep_nmt_tf.data.synthetic (pure Python, no TensorFlow)."""

import json
import os
import re

import pytest

from deep_nmt_tf.data import synthetic

_PUNCT = re.compile(r"[.,]")


def _words(text):
    return _PUNCT.sub("", text).lower().split()


def test_generate_pairs_is_deterministic():
    assert synthetic.generate_pairs(50, seed=3) == synthetic.generate_pairs(50, seed=3)
    assert synthetic.generate_pairs(50, seed=3) != synthetic.generate_pairs(50, seed=4)
    # A longer request extends the same stream.
    assert synthetic.generate_pairs(60, seed=3)[:50] == synthetic.generate_pairs(50, seed=3)


def test_sentence_format_and_lengths():
    for src, tgt in synthetic.generate_pairs(500, seed=0):
        assert synthetic.MIN_WORDS <= len(src.split()) <= synthetic.MAX_WORDS
        for text in (src, tgt):
            assert text == " ".join(text.split()), "single spaces, no outer whitespace"
            assert text[0].isupper() and text.endswith(".")


def test_vocabulary_is_a_few_hundred_words_per_side():
    pairs = synthetic.generate_pairs(3000, seed=0)
    src_vocab = {w for s, _ in pairs for w in _words(s)}
    tgt_vocab = {w for _, t in pairs for w in _words(t)}
    assert 200 <= len(src_vocab) <= 1000
    assert 200 <= len(tgt_vocab) <= 2000
    assert not src_vocab & tgt_vocab, "source and target words must be disjoint"


def test_copy_baseline_bleu_is_low():
    pairs = synthetic.generate_pairs(300, seed=0)
    assert synthetic.copy_baseline_bleu(pairs) < 5.0
    assert synthetic.copy_baseline_bleu([(t, t) for _, t in pairs]) == pytest.approx(100.0)


def test_translation_is_a_function_of_the_source():
    translations = {}
    for src, tgt in synthetic.generate_pairs(5000, seed=1):
        assert translations.setdefault(src, tgt) == tgt


def test_target_grammar_differs_from_source():
    pairs = synthetic.generate_pairs(2000, seed=2)
    length_differs = sum(len(s.split()) != len(t.split()) for s, t in pairs)
    assert length_differs > 100, "some words must map to two target words (or none)"
    # Agreement: the same source determiner 'ta' maps to several target determiners.
    determiners = {t.split()[0].lower() for s, t in pairs if s.split()[0] == "Ta"}
    assert len(determiners) >= 3


def test_write_corpus_splits_are_disjoint_and_sized(tmp_path):
    paths = synthetic.write_corpus(str(tmp_path), 200, 30, 40, seed=5)
    assert sorted(paths) == ["dev_source", "dev_target", "test_source", "test_target",
                             "train_source", "train_target"]
    lines = {k: open(p, encoding="utf-8").read().splitlines() for k, p in paths.items()}
    assert [len(lines[k]) for k in ("train_source", "dev_source", "test_source")] == [200, 30, 40]
    assert len(lines["train_target"]) == 200
    train, dev, test = (set(lines[f"{s}_source"]) for s in ("train", "dev", "test"))
    assert not train & dev and not train & test and not dev & test
    assert list(zip(lines["train_source"], lines["train_target"])) == \
        synthetic.generate_pairs(200, seed=5)


def test_write_corpus_is_idempotent(tmp_path):
    paths = synthetic.write_corpus(str(tmp_path), 50, 10, 10, seed=1)
    stamp = os.stat(paths["train_source"]).st_mtime_ns
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["train_size"] == 50 and manifest["seed"] == 1
    assert synthetic.write_corpus(str(tmp_path), 50, 10, 10, seed=1) == paths
    assert os.stat(paths["train_source"]).st_mtime_ns == stamp
    # Different parameters regenerate.
    synthetic.write_corpus(str(tmp_path), 60, 10, 10, seed=1)
    assert len(open(paths["train_source"]).read().splitlines()) == 60
    # A missing file regenerates even with a matching manifest.
    os.remove(paths["dev_target"])
    synthetic.write_corpus(str(tmp_path), 60, 10, 10, seed=1)
    assert len(open(paths["dev_target"]).read().splitlines()) == 10


def test_write_corpus_rejects_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="dev_size"):
        synthetic.write_corpus(str(tmp_path), 10, 0, 10, seed=1)
