"""SentencePiece as a tokenizer (deep_nmt_tf.data.spm, deep_nmt_tf.data.tokenizers), the
choice of tokenizer in configs and run directories, and the two WordPiece learners."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
import yaml

from deep_nmt_tf.config import ConfigError, config_from_dict
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS, UNK_ID
from deep_nmt_tf.data import pipeline, synthetic
from deep_nmt_tf.data.spm import SentencePieceModel, learn_sentencepiece
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.data.token_ids import SentencePieceDetokenizer, make_detokenizer
from deep_nmt_tf.data.tokenizers import SentencePieceTokenizer, build_tokenizer
from deep_nmt_tf.data.vocab import Tokenizer, count_words, learn_vocab, pretokenize
from deep_nmt_tf.run_dir import RunDir

LINES = ["Hello, world (really)!", "Ünïcödé wörds, ça va?", "Ta broku glimo vasu.", "",
         "   spaced    out  ", "<s> </s> <pad> [UNK] are just text here"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    paths = synthetic.write_corpus(str(directory), 300, 20, 20, seed=5)
    extra = directory / "english.txt"
    extra.write_text("\n".join([line for line in LINES if line.strip()] * 4) + "\n",
                     encoding="utf-8")
    return {**paths, "english": str(extra), "dir": str(directory)}


MODEL_TYPES = ["unigram", "bpe"]


def _learned(corpus, model_type):
    """The corpus' SentencePiece model of ``model_type`` (learned on first use)."""
    path = os.path.join(corpus["dir"], f"{model_type}.model")
    if not os.path.exists(path):
        learn_sentencepiece([corpus["train_source"], corpus["train_target"], corpus["english"]],
                            path, 200, model_type=model_type)
    return path


@pytest.fixture(scope="module", params=MODEL_TYPES)
def model_path(request, corpus):
    return _learned(corpus, request.param)


@pytest.fixture(scope="module")
def foreign_model(corpus):
    """A model in sentencepiece's default layout (<unk> 0, <s> 1, </s> 2, no padding), as
    other toolkits write them."""
    prefix = os.path.join(corpus["dir"], "foreign")
    sentencepiece.SentencePieceTrainer.train(
        input=[corpus["train_source"], corpus["english"]], model_prefix=prefix,
        vocab_size=120, minloglevel=2)
    return prefix + ".model"


def _text(tensor):
    return [t.decode("utf-8") for t in tensor.numpy()]


# ---------------------------------------------------------------------------------------------
# SentencePiece
# ---------------------------------------------------------------------------------------------


def test_learned_model_has_the_reserved_ids(model_path):
    model = SentencePieceModel(model_path)
    assert tuple(model.pieces[:4]) == RESERVED_TOKENS and model.identity
    sp = model.processor
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (PAD_ID, BOS_ID, EOS_ID,
                                                                    UNK_ID)
    assert 100 < model.vocab_size <= 200


def test_graph_and_python_agree_and_round_trip(model_path):
    tokenizer = SentencePieceTokenizer(model_path)
    tf.random.set_seed(3)  # clears TensorFlow's eager kernel cache: the model must survive it
    model = SentencePieceModel(model_path)
    ids = tokenizer.tokenize(tf.constant(LINES)).to_list()
    assert ids == model.encode(LINES)
    assert not any(i in (PAD_ID, BOS_ID, EOS_ID) for row in ids for i in row)
    assert ids[3] == [] and all(ids[i] for i in (0, 1, 2, 4, 5))
    text = _text(tokenizer.detokenize(tf.ragged.constant(ids)))
    assert text[:3] == LINES[:3]
    assert text[4] == "spaced out"  # sentencepiece's normalisation
    assert text == [model.decode(row) for row in ids]
    scalar = tokenizer.tokenize(tf.constant(LINES[0]))
    assert scalar.shape.rank == 1 and scalar.numpy().tolist() == ids[0]


def test_detokenize_drops_special_ids_in_graph_and_in_python(model_path):
    tokenizer = SentencePieceTokenizer(model_path)
    detok = make_detokenizer(model_path, "sentencepiece")
    assert isinstance(detok, SentencePieceDetokenizer)
    hello = tokenizer.tokenize(tf.constant(["Hello, world"])).to_list()[0]
    rows = [[BOS_ID] + hello + [EOS_ID, 7, 8], hello + [PAD_ID, PAD_ID],
            [10 ** 6, -3] + hello]
    width = max(map(len, rows))
    padded = np.array([r + [PAD_ID] * (width - len(r)) for r in rows], np.int64)
    graph = _text(tokenizer.detokenize(padded))
    assert graph[0] == graph[1] == "Hello, world"
    assert graph[2].endswith("Hello, world") and graph[2] != "Hello, world"  # [UNK]s
    assert detok.batch(padded) == graph
    assert _text(tokenizer.detokenize(tf.constant([[BOS_ID] + hello])))[0] == "Hello, world"


def test_a_foreign_model_is_used_as_it_is_through_an_id_map(foreign_model):
    model = SentencePieceModel(foreign_model)
    assert not model.identity and model.vocab_size == 121  # + <pad>
    assert tuple(model.pieces[:4]) == RESERVED_TOKENS
    sp = model.processor
    tokenizer = SentencePieceTokenizer(foreign_model)
    ids = tokenizer.tokenize(tf.constant(LINES)).to_list()
    assert ids == model.encode(LINES)
    raw = sp.encode(LINES[0])
    assert ids[0] == [int(model.to_ours[i]) for i in raw]
    assert all(0 <= i < model.vocab_size and i not in (PAD_ID, BOS_ID, EOS_ID)
               for row in ids for i in row)
    assert UNK_ID in [i for row in ids for i in row]  # "Ü" is not in this model
    text = _text(tokenizer.detokenize(tf.ragged.constant(ids)))
    assert text[2] == sp.decode(sp.encode(LINES[2])) == LINES[2]
    assert text == [model.decode(r) for r in ids]


def test_lowercase(model_path):
    upper = SentencePieceTokenizer(model_path, lowercase=True)
    assert _text(upper.detokenize(upper.tokenize(tf.constant(["TA BROKU."]))))[0] == "ta broku."
    assert SentencePieceModel(model_path, lowercase=True).encode(["TA BROKU."]) == \
        upper.tokenize(tf.constant(["TA BROKU."])).to_list()


def test_bad_model_files_are_named(tmp_path):
    with pytest.raises(DataError, match="missing.model: SentencePiece model not found"):
        SentencePieceTokenizer(str(tmp_path / "missing.model"))
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(DataError, match="bad.model: not a SentencePiece model"):
        SentencePieceModel(str(bad))


_ROUND_TRIPS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the ops)
    lines = json.loads(sys.argv[1])
    out = {}
    for model_type, path in zip(sys.argv[2::2], sys.argv[3::2]):
        round_trip = tf.saved_model.load(path).round_trip(tf.constant(lines))
        out[model_type] = [x.decode("utf-8") for x in round_trip.numpy()]
    print("RESULT" + json.dumps(out))
""")


def _round_trip(tokenizer):
    return tf.function(lambda text: tokenizer.detokenize(tokenizer.tokenize(text).to_tensor()),
                       input_signature=[tf.TensorSpec([None], tf.string)])


@pytest.fixture(scope="module")
def fresh_process_round_trips(corpus, tmp_path_factory):
    """Each model type's tokenizer, built from a copy of its model file that is deleted once
    the tokenizer is in a SavedModel (which holds the model itself), and ``LINES`` round-tripped
    by those SavedModels in a fresh process (one for both)."""
    base = tmp_path_factory.mktemp("round_trips")
    tokenizers, args = {}, []
    for model_type in MODEL_TYPES:
        copy = base / f"{model_type}.model"
        copy.write_bytes(open(_learned(corpus, model_type), "rb").read())
        tokenizer = tokenizers[model_type] = SentencePieceTokenizer(str(copy))
        exported = tf.Module()
        exported.tokenizer = tokenizer
        exported.round_trip = _round_trip(tokenizer)
        export_dir = str(base / f"saved_{model_type}")
        tf.saved_model.save(exported, export_dir)
        copy.unlink()
        args += [model_type, export_dir]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", _ROUND_TRIPS, json.dumps(LINES), *args],
                            capture_output=True, text=True, env=env, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT")][-1]
    fresh = json.loads(line[len("RESULT"):])
    return {t: (tokenizers[t], fresh[t]) for t in MODEL_TYPES}


def test_tokenizes_in_tf_data_and_in_a_saved_model_in_a_fresh_process(model_path,
                                                                       fresh_process_round_trips):
    model_type = os.path.basename(model_path).split(".")[0]
    tokenizer, fresh = fresh_process_round_trips[model_type]  # (its model file deleted)
    ds = tf.data.Dataset.from_tensor_slices(LINES).batch(3).map(tokenizer.tokenize)
    assert [row for batch in ds for row in batch.to_list()] == \
        tokenizer.tokenize(tf.constant(LINES)).to_list()
    assert tokenizer.tokenize(tf.constant(LINES)).to_list() == \
        SentencePieceTokenizer(model_path).tokenize(tf.constant(LINES)).to_list()
    want = _text(tokenizer.detokenize(tokenizer.tokenize(tf.constant(LINES)).to_tensor()))
    assert fresh == want


# ---------------------------------------------------------------------------------------------
# The choice in configs and run directories
# ---------------------------------------------------------------------------------------------


def _config(corpus, tokenizer, **data):
    return config_from_dict({"data": {
        "train_source": corpus["train_source"], "train_target": corpus["train_target"],
        "dev_source": corpus["dev_source"], "dev_target": corpus["dev_target"],
        "vocab_size": 150, "tokenizer": tokenizer, **data}})


def test_build_tokenizer_follows_the_config(corpus, model_path, tmp_path):
    sp = _config(corpus, {"type": "sentencepiece"}, vocab=model_path)
    assert isinstance(build_tokenizer(sp), SentencePieceTokenizer)
    with pytest.raises(DataError, match="data.tokenizer.type is 'sentencepiece'"):
        Tokenizer.from_config(sp)
    with pytest.raises(DataError, match="data.vocab is empty"):
        build_tokenizer(_config(corpus, {"type": "sentencepiece"}))
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.sentencepiece\.model_type: 'wp' "
                                          r"is not one of unigram, bpe"):
        _config(corpus, {"type": "sentencepiece", "sentencepiece": {"model_type": "wp"}})
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.wordpiece\.learner: set, but "
                                          r"data\.tokenizer\.type is 'sentencepiece'"):
        config_from_dict({}, overrides=["data.tokenizer.type=sentencepiece",
                                        "data.tokenizer.wordpiece.learner=sentencepiece"])


def test_prepare_data_learns_and_records_a_sentencepiece_model(corpus, tmp_path):
    run = RunDir(str(tmp_path / "run"))
    config = _config(corpus, {"type": "sentencepiece", "sentencepiece": {"model_type": "bpe"}})
    prepared = pipeline.prepare_data(config, run)
    assert prepared.data.vocab == os.path.join(run.path, "sentencepiece.model")
    assert not os.path.exists(run.default_vocab_path)
    model = SentencePieceModel(prepared.data.vocab)
    assert prepared.model.vocab_size == model.vocab_size
    run.save_config(prepared)
    meta = run.metadata()
    assert meta["tokenizer"]["kind"] == "sentencepiece"
    assert meta["tokenizer"]["file"] == "sentencepiece.model"
    assert meta["tokenizer"]["sha256"] == meta["vocab"]["sha256"]
    assert meta["vocab"]["size"] == model.vocab_size
    loaded = run.load_config()
    assert loaded.data.tokenizer.type == "sentencepiece"
    assert run.vocab_path(loaded) == prepared.data.vocab
    # A resumed run with another tokenizer type is refused before any work.
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.type: 'wordpiece', but this model "
                                          r"directory was trained with a sentencepiece"):
        run.check_config(_config(corpus, {"type": "wordpiece"}))
    # The same again: nothing re-learned.
    stamp = os.stat(prepared.data.vocab).st_mtime_ns
    assert pipeline.prepare_data(config, run) == prepared
    assert os.stat(prepared.data.vocab).st_mtime_ns == stamp


def test_a_run_without_a_tokenizer_record_is_wordpiece(corpus, tmp_path):
    run = RunDir(str(tmp_path / "old"))
    config = _config(corpus, {"type": "wordpiece"})
    prepared = pipeline.prepare_data(config, run)
    run.save_config(prepared)
    meta = run.metadata()
    del meta["tokenizer"]  # as written before the record existed
    with open(run.metadata_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    assert run.tokenizer_record() == {"kind": "wordpiece", "file": "vocab.txt",
                                      "sha256": meta["vocab"]["sha256"]}
    with open(run.config_path, encoding="utf-8") as f:
        text = yaml.safe_load(f)
    del text["data"]["tokenizer"]  # a config.yaml written before the key existed
    with open(run.config_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(text, f)
    saved = run.load_config()
    assert saved.data.tokenizer.type == "wordpiece"
    assert saved.data.tokenizer.get().learner == "tensorflow_text"  # what such runs used
    assert isinstance(build_tokenizer(saved), Tokenizer)
    run.check_config(prepared)  # still accepted
    with pytest.raises(ConfigError, match="trained with a wordpiece tokenizer"):
        run.check_config(_config(corpus, {"type": "sentencepiece"}))


def test_train_batches_with_sentencepiece(corpus, model_path):
    config = config_from_dict({
        "data": {"train_source": corpus["train_source"], "train_target": corpus["train_target"],
                 "vocab": model_path, "tokenizer": {"type": "sentencepiece"},
                 "shuffle_buffer": 100},
        "training": {"batch_tokens": 200}})
    tokenizer = build_tokenizer(config)
    batch = next(iter(pipeline.make_train_dataset(config, tokenizer)))
    src = batch["source_ids"].numpy()
    assert src.shape[0] >= 1 and (src.max() < tokenizer.vocab_size)
    rows = _text(tokenizer.detokenize(src))
    sources = set(open(corpus["train_source"], encoding="utf-8").read().splitlines())
    assert all(row in sources for row in rows)


# ---------------------------------------------------------------------------------------------
# WordPiece learners
# ---------------------------------------------------------------------------------------------


def _pieces_per_word(tokens, lines):
    words = int(tf.size(pretokenize(tf.constant(lines)).flat_values))
    pieces = int(tf.size(Tokenizer(tokens).tokenize(tf.constant(lines)).flat_values))
    return pieces / words


def test_the_two_wordpiece_learners_give_comparable_pieces_per_word(corpus, tmp_path, caplog):
    paths = [corpus["train_source"], corpus["train_target"]]
    with caplog.at_level(logging.INFO, logger="absl"):
        fast = learn_vocab(paths, 300, min_count=2)
    old = learn_vocab(paths, 300, min_count=2, learner="tensorflow_text")
    for tokens in (fast, old):
        assert tuple(tokens[:4]) == RESERVED_TOKENS and len(set(tokens)) == len(tokens)
        assert 240 <= len(tokens) <= 330
    assert set(fast) != set(old)
    sample = open(corpus["test_source"], encoding="utf-8").read().splitlines() + \
        open(corpus["test_target"], encoding="utf-8").read().splitlines()
    fast_ppw, old_ppw = _pieces_per_word(fast, sample), _pieces_per_word(old, sample)
    assert 1.0 <= fast_ppw and 1.0 <= old_ppw
    assert abs(fast_ppw - old_ppw) / old_ppw < 0.15, (fast_ppw, old_ppw)
    # FastWordpieceTokenizer reads the learned file unchanged; the round trip is exact.
    tokenizer = Tokenizer(fast)
    assert _text(tokenizer.detokenize(tokenizer.tokenize(tf.constant(sample)))) == sample
    counts = count_words(paths)
    assert all(w in fast for w, _ in counts.most_common(20))  # frequent words stay whole
    with pytest.raises(ValueError, match="unknown WordPiece learner 'bpe'"):
        learn_vocab(paths, 300, learner="bpe")


def test_the_config_selects_the_learner(corpus, tmp_path, caplog):
    for learner in ("sentencepiece", "tensorflow_text"):
        config = _config(corpus, {"type": "wordpiece", "wordpiece": {"learner": learner}})
        with caplog.at_level(logging.INFO, logger="absl"):
            pipeline.prepare_data(config, str(tmp_path / learner))
        assert f"({learner} learner)" in caplog.text
        caplog.clear()


# ---------------------------------------------------------------------------------------------
# deep-nmt-build-vocab, and a whole SentencePiece run
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def build_vocab_tool():
    """tools/build_vocab.py, its flags removed from absl's global FLAGS afterwards."""
    import importlib

    from absl import flags

    before = set(flags.FLAGS)
    sys.modules.pop("deep_nmt_tf.tools.build_vocab", None)
    tool = importlib.import_module("deep_nmt_tf.tools.build_vocab")

    def run(*args):
        flags.FLAGS.unparse_flags()
        tool.main(flags.FLAGS(["build_vocab", *args]))

    yield run
    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - before:
        delattr(flags.FLAGS, name)
    sys.modules.pop("deep_nmt_tf.tools.build_vocab", None)


def test_build_vocab_tool_learns_sentencepiece(build_vocab_tool, corpus, tmp_path):
    output = str(tmp_path / "sp.model")
    build_vocab_tool(f"--input={corpus['train_source']},{corpus['train_target']}",
                     f"--output={output}", "--vocab_size=150", "--tokenizer=sentencepiece",
                     "--model_type=bpe")
    model = SentencePieceModel(output)
    assert model.identity and 100 < model.vocab_size <= 150
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  corpus: synthetic\n  synthetic_train_size: 100\n"
                      "  synthetic_dev_size: 5\n  synthetic_test_size: 5\n"
                      "  tokenizer: {type: sentencepiece}\n")
    build_vocab_tool(f"--config={config}", f"--model_dir={tmp_path / 'run'}",
                     "--override=data.vocab_size=120")
    assert SentencePieceModel(str(tmp_path / "run" / "sentencepiece.model")).vocab_size <= 120
    assert not (tmp_path / "run" / "vocab.txt").exists()


_STACK = {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}
TINY_SP = {
    "model": {"d_model": 16, "encoder": {"transformer": dict(_STACK)},
              "decoder": {"transformer": dict(_STACK)}},
    "data": {"corpus": "synthetic", "synthetic_train_size": 300, "synthetic_dev_size": 12,
             "synthetic_test_size": 6, "vocab_size": 150, "shuffle_buffer": 64,
             "tokenizer": {"type": "sentencepiece", "sentencepiece": {"model_type": "unigram"}}},
    "training": {"train_steps": 4, "batch_tokens": 300, "log_every": 2, "checkpoint_every": 2,
                 "eval_every": 4, "seed": 3,
                 "schedule": {"type": "constant", "constant": {"learning_rate": 3e-3}}},
    "decoding": {"batch_size": 4, "beam_size": 2, "max_length_a": 1.0, "max_length_b": 3},
}

_SERVE = r'''
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops)
m = tf.saved_model.load(sys.argv[1])
out = m.signatures["serving_default"](text=tf.constant(json.loads(sys.argv[2])))
print("RESULT" + json.dumps([t.decode("utf-8") for t in out["translations"].numpy()]))
'''


@pytest.mark.slow
def test_a_sentencepiece_run_trains_translates_evaluates_and_exports(tmp_path):
    from deep_nmt_tf.data.preprocess import preprocess_run
    from deep_nmt_tf.data.token_ids import TokenIds
    from deep_nmt_tf.export import export_model_dir
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.tools.evaluate import evaluate_translator
    from deep_nmt_tf.training import Runner

    run = RunDir(str(tmp_path / "run"))
    config = config_from_dict(TINY_SP)
    results = Runner(config, run.path).run()
    assert "eval_bleu" in results and np.isfinite(results["loss"])
    assert os.path.exists(run.join("sentencepiece.model"))
    assert not os.path.exists(run.default_vocab_path)
    assert run.metadata()["tokenizer"]["kind"] == "sentencepiece"

    translator = Translator.from_model_dir(run.path, jit_compile=False)
    assert isinstance(translator.tokenizer, SentencePieceTokenizer)
    data = translator.config.data
    sources = open(data.test_source, encoding="utf-8").read().splitlines()
    ours = [h[0].text for h in translator.translate(sources)]
    scores = evaluate_translator(translator, data.test_source, data.test_target)
    assert scores["hypotheses"] == ours and 0.0 <= scores["bleu"] <= 100.0

    path = export_model_dir(run.path, jit_compile=False)
    served = subprocess.run([sys.executable, "-c", _SERVE, path, json.dumps(sources)],
                            capture_output=True, text=True, timeout=300, cwd="/",
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert served.returncode == 0, served.stderr[-3000:]
    line = [x for x in served.stdout.splitlines() if x.startswith("RESULT")][-1]
    assert json.loads(line[len("RESULT"):]) == ours

    # The Keras route: the same model's ids in data/*.npz, detokenised without TensorFlow.
    keras_run = RunDir(str(tmp_path / "fit"))
    prepared, written = preprocess_run(config, keras_run, splits=["train", "test"])
    test_ids = TokenIds.load(written["test"], vocab_sha256=keras_run.metadata()["vocab"]["sha256"])
    assert test_ids.info["tokenizer_type"] == "sentencepiece"
    detok = make_detokenizer(prepared.data.vocab, keras_run.tokenizer_record()["kind"])
    references = open(prepared.data.test_target, encoding="utf-8").read().splitlines()
    decoded = [detok(test_ids.target(i)) for i in range(len(test_ids))]
    tokenizer = build_tokenizer(prepared)
    assert decoded == _text(tokenizer.detokenize(tokenizer.tokenize(tf.constant(references))))


def test_the_sentencepiece_wordpiece_learner_is_deterministic_across_processes(corpus):
    """(Hugging Face's WordPiece trainer was not: its hash maps order ties differently in each
    process, so two runs of one config learned different vocabularies.)"""
    from deep_nmt_tf.data.spm import learn_wordpiece

    counts = dict(count_words([corpus["train_source"], corpus["train_target"]]))
    code = textwrap.dedent("""
        import json, sys
        from deep_nmt_tf.data.spm import learn_wordpiece
        print("RESULT" + json.dumps(learn_wordpiece(json.loads(sys.stdin.read()), 400, 2)))
    """)
    runs = [subprocess.run([sys.executable, "-c", code], input=json.dumps(counts), text=True,
                           capture_output=True, timeout=120) for _ in range(2)]
    learned = []
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        line = [x for x in run.stdout.splitlines() if x.startswith("RESULT")][-1]
        learned.append(json.loads(line[len("RESULT"):]))
    assert learned[0] == learned[1] == learn_wordpiece(counts, 400, 2)
    assert len(learned[0]) == 400
