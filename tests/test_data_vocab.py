"""Tests for deep_nmt_tf.data.vocab (WordPiece vocabulary, Tokenizer) and tools/build_vocab."""

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS, UNK_ID
from deep_nmt_tf.data import synthetic
from deep_nmt_tf.data.text_io import DataError, sample_lines
from deep_nmt_tf.data.vocab import (Tokenizer, build_vocab, count_words, load_vocab,
                                    pretokenize, reattach_punctuation, vocab_size, write_vocab)

ENGLISH = [
    "Hello, world (really)!",
    'He said "hi." and left; it\'s 3.5% of $5 - e.g. U.S.A.',
    "Well-known facts: don't panic... [ok]",
    "Ünïcödé wörds, ça va?",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    paths = synthetic.write_corpus(str(directory), 200, 20, 20, seed=11)
    extra = directory / "english.txt"
    extra.write_text("\n".join(ENGLISH * 3) + "\n", encoding="utf-8")
    return {**paths, "english": str(extra), "dir": str(directory)}


@pytest.fixture(scope="module")
def vocab_path(corpus):
    path = os.path.join(corpus["dir"], "vocab.txt")
    build_vocab([corpus["train_source"], corpus["train_target"], corpus["english"]], path,
                vocab_size=400)
    return path


@pytest.fixture(scope="module")
def tokenizer(vocab_path):
    return Tokenizer(vocab_path)


def _test_lines(corpus):
    with open(corpus["test_target"], encoding="utf-8") as f:
        return f.read().splitlines()[:10] + ENGLISH


def _decode(tensor):
    return [x.decode("utf-8") for x in tensor.numpy()]


def test_reserved_tokens_come_first(vocab_path):
    tokens = load_vocab(vocab_path)
    assert tuple(tokens[:4]) == RESERVED_TOKENS
    assert (tokens.index("<pad>"), tokens.index("<s>"), tokens.index("</s>"),
            tokens.index("[UNK]")) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert vocab_size(vocab_path) == len(tokens) <= 400
    assert len(set(tokens)) == len(tokens)


@pytest.mark.parametrize("lines, message", [
    (["<s>", "<pad>", "</s>", "[UNK]", "a"], r"vocab\.txt:1: expected reserved token '<pad>'"),
    (["<pad>", "<s>", "</s>"], r"vocab\.txt:4: expected reserved token '\[UNK\]'.*end of file"),
    (list(RESERVED_TOKENS) + ["a", "", "b"], r"vocab\.txt:6: invalid token ''"),
    (list(RESERVED_TOKENS) + ["a", "b", "a"], r"vocab\.txt:7: duplicate token 'a'.*line 5"),
])
def test_load_vocab_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_vocab(str(path))


def test_load_vocab_missing_file(tmp_path):
    with pytest.raises(DataError, match="nothere.txt: vocabulary file not found"):
        load_vocab(str(tmp_path / "nothere.txt"))


def test_pretokenize_splits_punctuation_but_not_inside_words():
    words = pretokenize(tf.constant(["Hello, world.", "don't well-known 3.5 (x) <s>"]))
    assert words.to_list() == [
        [b"Hello", b",", b"world", b"."],
        [b"don't", b"well-known", b"3.5", b"(", b"x", b")", b"<", b"s", b">"],
    ]
    assert pretokenize(tf.constant("A\u3000b\u00a0c"), lowercase=True).numpy().tolist() == \
        [b"a", b"b", b"c"]


def test_reattach_punctuation():
    text = tf.constant(['Hi , you ( really ) ! He said " so . " $ 5 , 10 % . . .'])
    assert _decode(reattach_punctuation(text)) == ['Hi, you (really)! He said "so." $5, 10%...']


def test_round_trip_is_exact(corpus, tokenizer):
    lines = _test_lines(corpus)
    ids = tokenizer.tokenize(tf.constant(lines))
    assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
    flat = ids.flat_values.numpy()
    assert UNK_ID not in flat and PAD_ID not in flat and BOS_ID not in flat and EOS_ID not in flat
    assert _decode(tokenizer.detokenize(ids)) == lines


def test_round_trip_inside_tf_function(corpus, tokenizer):
    lines = _test_lines(corpus)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(text):
        ids = tokenizer.tokenize(text)
        # Model-like output: BOS, pieces, EOS, padding.
        batch = tf.shape(text)[:1]
        bos = tf.fill(tf.concat([batch, [1]], 0), BOS_ID)
        eos = tf.fill(tf.concat([batch, [1]], 0), EOS_ID)
        dense = tf.concat([bos, tf.concat([ids, eos], axis=1).to_tensor(PAD_ID)], axis=1)
        return tokenizer.detokenize(dense)

    assert _decode(round_trip(tf.constant(lines))) == lines


def test_round_trip_in_tf_data(corpus, tokenizer):
    lines = _test_lines(corpus)
    ds = tf.data.Dataset.from_tensor_slices(lines).batch(4).map(tokenizer.tokenize)
    ds = ds.map(tokenizer.detokenize).unbatch()
    assert [x.decode("utf-8") for x in ds.as_numpy_iterator()] == lines


def test_round_trip_without_reattachment(vocab_path):
    tokenizer = Tokenizer(vocab_path, reattach_punctuation=False)
    lines = ["Hello , world ( really ) !", 'He said " hi . "']
    assert _decode(tokenizer.detokenize(tokenizer.tokenize(tf.constant(lines)))) == lines


def test_detokenize_strips_special_ids(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["Hello, world."])).to_tensor().numpy()[0].tolist()
    rows = [[BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID],
            ids + [EOS_ID] + ids[:2] + [EOS_ID],  # Junk after EOS is ignored.
            [PAD_ID] * (len(ids) + 4)]
    expected = ["Hello, world.", "Hello, world.", ""]
    assert _decode(tokenizer.detokenize(tf.constant(rows))) == expected
    ragged = tf.ragged.constant([ids, [BOS_ID, EOS_ID]])
    assert _decode(tokenizer.detokenize(ragged)) == ["Hello, world.", ""]
    assert tokenizer.detokenize(tf.constant(ids)).numpy() == b"Hello, world."


def test_text_cannot_produce_reserved_ids(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["<pad> <s> </s> [UNK] x<s>"])).flat_values.numpy()
    assert PAD_ID not in ids and BOS_ID not in ids and EOS_ID not in ids


def test_unknown_characters_map_to_unk(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["Hello \u4e2d\u6587"])).to_list()[0]
    assert ids[-1] == UNK_ID and UNK_ID not in ids[:-1]
    assert tokenizer.detokenize(tf.constant([[ids[0], 10 ** 6]])).numpy()[0].endswith(b"[UNK]")


def test_lowercase_tokenizer(tmp_path, corpus):
    path = str(tmp_path / "lower.txt")
    tokens = build_vocab([corpus["english"]], path, vocab_size=200, lowercase=True)
    assert not any(t != t.lower() for t in tokens[4:])
    tokenizer = Tokenizer(path, lowercase=True)
    assert _decode(tokenizer.detokenize(tokenizer.tokenize(tf.constant(["HELLO, World!"])))) \
        == ["hello, world!"]


def test_vocabulary_sample_is_bounded_spread_and_logged(tmp_path, caplog):
    """data.vocab_sample_size: at most that many lines, spread over every file, logged."""
    for total, size in ((10, 3), (7, 7), (1000, 333)):
        keep = sample_lines(total, size)
        kept = [i for i in range(total) if keep is None or keep(i)]
        assert len(kept) == min(total, size)
    assert sample_lines(10, 0) is None and sample_lines(10, 10) is None
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("".join(f"alpha{i}\n" for i in range(100)), encoding="utf-8")
    second.write_text("".join(f"beta{i}\n" for i in range(100)), encoding="utf-8")
    paths = [str(first), str(second)]
    with caplog.at_level("INFO", logger="absl"):  # (a tool run in-process before this test
        counts = count_words(paths, max_sentences=20)  # leaves absl's logger at WARNING)
    assert sum(counts.values()) == 20
    assert sum(w.startswith("alpha") for w in counts) == 10  # both files, evenly
    assert "Vocabulary sample: 20 of the 200 lines" in caplog.text
    assert sum(count_words(paths, max_sentences=0).values()) == 200


def test_min_count_caps_a_small_corpus_vocabulary_and_is_named(tmp_path, caplog):
    """data.vocab_min_count: words seen fewer times are left out, so a small corpus falls short
    of vocab_size (a WARNING names the key); a lower value gives the larger vocabulary."""
    text = tmp_path / "small.txt"
    # 300 distinct words, each 3 times; "common" 50 times.
    text.write_text("".join(f"word{i} word{i} word{i} common\n" for i in range(300)) +
                    "common\n" * 50, encoding="utf-8")
    with caplog.at_level("INFO", logger="absl"):
        capped = build_vocab([str(text)], str(tmp_path / "v10.txt"), 300)
    assert len(capped) < 200
    assert "data.vocab_min_count" in caplog.text and "fewer than the 300" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="absl"):
        full = build_vocab([str(text)], str(tmp_path / "v2.txt"), 300, min_count=2)
    assert len(full) > len(capped) and "word123" in full
    assert "data.vocab_min_count" not in caplog.text


def test_vocab_learning_reports_invalid_utf8(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\nbad \xff line\n")
    with pytest.raises(DataError, match=r"bad\.txt:2: invalid UTF-8"):
        build_vocab([str(bad)], str(tmp_path / "v.txt"), vocab_size=100)


def test_tokenizer_from_token_list_validates_reserved():
    with pytest.raises(DataError, match="must start with"):
        Tokenizer(["a", "b", "c", "d"])


def test_saved_model_round_trip_in_fresh_process(tmp_path, tokenizer):
    class Exported(tf.Module):
        def __init__(self, tok):
            super().__init__()
            self.tok = tok

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, text):
            return self.tok.detokenize(self.tok.tokenize(text).to_tensor())

    export_dir = str(tmp_path / "saved")
    tf.saved_model.save(Exported(tokenizer), export_dir)
    code = textwrap.dedent(f"""
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the ops)
        loaded = tf.saved_model.load({export_dir!r})
        out = loaded.round_trip(tf.constant({ENGLISH!r}))
        print("\\n".join(x.decode("utf-8") for x in out.numpy()))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ENGLISH


def test_write_vocab_is_loadable(tmp_path):
    path = str(tmp_path / "sub" / "v.txt")
    write_vocab(list(RESERVED_TOKENS) + ["a", "##b"], path)
    assert load_vocab(path) == list(RESERVED_TOKENS) + ["a", "##b"]


# ---------------------------------------------------------------------------------------------
# tools/build_vocab.py
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def build_vocab_tool():
    """Imports tools/build_vocab.py; afterwards removes the flags it added to absl's global
    FLAGS, so other tools imported later in this process define their own."""
    from absl import flags

    before = set(flags.FLAGS)
    sys.modules.pop("deep_nmt_tf.tools.build_vocab", None)
    tool = importlib.import_module("deep_nmt_tf.tools.build_vocab")
    yield tool
    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - before:
        delattr(flags.FLAGS, name)
    sys.modules.pop("deep_nmt_tf.tools.build_vocab", None)


def _run_tool(tool, *args):
    from absl import flags

    flags.FLAGS.unparse_flags()
    tool.main(flags.FLAGS(["build_vocab", *args]))


def test_build_vocab_tool_explicit_files(build_vocab_tool, corpus, tmp_path):
    output = str(tmp_path / "v.txt")
    _run_tool(build_vocab_tool, f"--input={corpus['train_source']},{corpus['train_target']}",
              f"--output={output}", "--vocab_size=300")
    assert tuple(load_vocab(output)[:4]) == RESERVED_TOKENS


def test_build_vocab_tool_from_config(build_vocab_tool, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  corpus: synthetic\n  synthetic_train_size: 100\n"
                      "  synthetic_dev_size: 5\n  synthetic_test_size: 5\n")
    model_dir = tmp_path / "run"
    _run_tool(build_vocab_tool, f"--config={config}", f"--model_dir={model_dir}",
              "--override=data.vocab_size=200")
    assert (model_dir / "data" / "train.src").exists()
    assert vocab_size(str(model_dir / "vocab.txt")) <= 200


def test_build_vocab_tool_usage_errors(build_vocab_tool, tmp_path):
    from absl import app

    with pytest.raises(app.UsageError):
        _run_tool(build_vocab_tool)
    with pytest.raises(SystemExit, match=r"missing\.txt: cannot open corpus file"):
        _run_tool(build_vocab_tool, f"--input={tmp_path / 'missing.txt'}",
                  f"--output={tmp_path / 'v.txt'}")
