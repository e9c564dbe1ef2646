"""CTranslate2 conversion (deep_nmt_tf/export/ctranslate2.py, ctranslate2_translator.py and
``deep-nmt-export --format=ctranslate2``): CTranslate2's outputs against ours.

The tests that run CTranslate2 are skipped where the optional ``ctranslate2`` package is not
installed; the refusals and the missing-package message are checked without it.
"""

import json
import os
import sys

import keras
import numpy as np
import pytest

from deep_nmt_tf.config import config_from_dict
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS
from deep_nmt_tf.decoding.search import beam_search, greedy_search
from deep_nmt_tf.export.ctranslate2 import (UnsupportedModelError, check_convertible,
                                            require_ctranslate2, unsupported_features)
from deep_nmt_tf.models import build_model

try:
    import ctranslate2  # noqa: F401
    HAVE_CTRANSLATE2 = True
except ImportError:
    HAVE_CTRANSLATE2 = False
needs_ctranslate2 = pytest.mark.skipif(not HAVE_CTRANSLATE2,
                                       reason="the optional ctranslate2 package is not installed")

V = 60
VOCAB = list(RESERVED_TOKENS) + [f"w{i}" for i in range(V - len(RESERVED_TOKENS))]
MAX_LEN = 14


def _config(norm="post", tied=True, method="none", epsilon=1e-6, enc_layers=2, dec_layers=3,
            **extra):
    stack = dict(num_heads=2, ffn_dim=32, norm=norm, residual_scaling={"method": method})
    model = {"vocab_size": V, "d_model": 16, "layer_norm_epsilon": epsilon,
             "tie_source_target_embeddings": tied,
             "encoder": {"transformer": dict(stack, num_layers=enc_layers)},
             "decoder": {"transformer": dict(stack, num_layers=dec_layers, num_heads=4,
                                             tie_softmax=tied)}}
    for key, value in extra.items():
        model[key] = value
    return config_from_dict({"model": model}, source="<ctranslate2 test>")


def _model(config, seed=0, no_pad_bos=False):
    """A built model with random weights; LayerNorm parameters, biases and Admin's omega are
    perturbed too (their initial values, ones and zeros, would hide a wrong mapping)."""
    keras.utils.set_random_seed(seed)
    model = build_model(config)
    rng = np.random.RandomState(seed)
    for v in model.variables:
        if any(part in v.path for part in ("gamma", "beta", "bias", "omega")):
            v.assign(v.numpy() + rng.normal(0.0, 0.3, v.shape).astype("float32"))
    if no_pad_bos:  # A trained model gives <pad>/<s> no probability: bias them away.
        bias = model.decoder.softmax_bias.numpy()
        bias[[PAD_ID, BOS_ID]] = -40.0
        model.decoder.softmax_bias.assign(bias)
    return model


def _sources(seed, n=8):
    rng = np.random.RandomState(100 + seed)
    return [list(rng.randint(len(RESERVED_TOKENS), V, size=rng.randint(2, 10))) for _ in range(n)]


def _batch(sources):
    ids = np.zeros((len(sources), max(map(len, sources)) + 1), "int32")
    for i, s in enumerate(sources):
        ids[i, :len(s)] = s
        ids[i, len(s)] = EOS_ID
    return ids


def _tokens(ids):
    return [VOCAB[i] for i in ids]


def _convert(model, tmp_path, **kwargs):
    from deep_nmt_tf.export.ctranslate2 import convert_model

    tmp_path.mkdir(parents=True, exist_ok=True)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return convert_model(model, str(vocab), str(tmp_path / "ct2"), **kwargs)


def _ct2_translate(path, sources, **options):
    import ctranslate2

    translator = ctranslate2.Translator(path, intra_threads=1)
    return translator.translate_batch(
        [_tokens(s) for s in sources], max_decoding_length=MAX_LEN, min_decoding_length=0,
        suppress_sequences=[["<pad>"], ["<s>"]], return_scores=True, **options)


def _log_probs(model, sources, targets):
    """Our teacher-forced token log-probabilities of ``targets`` (each ending where it ends,
    ``</s>`` included if it has one), one padded batch: a list of arrays."""
    width = max(map(len, targets))
    target_in = np.zeros((len(targets), width), "int32")
    for i, t in enumerate(targets):
        target_in[i, :len(t)] = [BOS_ID] + [x for x in t[:-1]]
    logits = model({"source_ids": _batch(sources), "target_input_ids": target_in})
    logp = keras.ops.convert_to_numpy(keras.ops.log_softmax(logits, axis=-1))
    return [logp[i, np.arange(len(t)), t] for i, t in enumerate(targets)]


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    with pytest.raises(ImportError, match=r"pip install ctranslate2"):
        require_ctranslate2()


CASES = {
    "post_norm_tied": dict(norm="post", tied=True),
    "pre_norm_untied": dict(norm="pre", tied=False, epsilon=0.5),
    "deepnorm": dict(norm="post", tied=True, method="deepnorm", epsilon=1e-3),
    "admin_untied": dict(norm="post", tied=False, method="admin", enc_layers=3, dec_layers=1),
}


@needs_ctranslate2
@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_ids_and_scores_equal_ours(case, tmp_path):
    """CTranslate2's greedy ids are our greedy search's; its token log-probabilities
    (score_batch) our teacher-forced ones, to float32 rounding."""
    import ctranslate2

    model = _model(_config(**CASES[case]))
    path = _convert(model, tmp_path)
    sources = _sources(0)
    ours = greedy_search(model, _batch(sources), max_length_a=0.0, max_length_b=MAX_LEN)
    ours_ids = keras.ops.convert_to_numpy(ours["ids"])[:, 0]
    results = _ct2_translate(path, sources, beam_size=1)
    for i, result in enumerate(results):
        expected = [int(t) for t in ours_ids[i] if t != PAD_ID]
        assert result.hypotheses[0] == _tokens(expected), f"sentence {i}"
    assert any(len(r.hypotheses[0]) > 2 for r in results)  # Not all trivially short.
    targets = _sources(1)
    scored = ctranslate2.Translator(path).score_batch([_tokens(s) for s in sources],
                                                       [_tokens(t) for t in targets])
    expected = _log_probs(model, sources, [t + [EOS_ID] for t in targets])
    for result, want in zip(scored, expected):
        np.testing.assert_allclose(result.log_probs, want, atol=1e-4)


@needs_ctranslate2
def test_wrong_epsilon_would_show(tmp_path):
    """The score comparison above would see CTranslate2's default LayerNorm epsilon."""
    import ctranslate2

    model = _model(_config(**CASES["pre_norm_untied"]))
    path = _convert(model, tmp_path)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["layer_norm_epsilon"] == pytest.approx(0.5)
    del config["layer_norm_epsilon"]
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    source, target = _sources(0)[0], _sources(1)[0]
    got = ctranslate2.Translator(path).score_batch([_tokens(source)],
                                                    [_tokens(target)])[0].log_probs
    expected = _log_probs(model, [source], [target + [EOS_ID]])[0]
    assert np.max(np.abs(np.asarray(got) - expected)) > 1e-3


@needs_ctranslate2
def test_positions_start_at_zero_in_our_layout(tmp_path):
    """CTranslate2's built-in sinusoids start at position 1; the converter writes ours."""
    from deep_nmt_tf.export.ctranslate2 import build_spec

    spec = build_spec(_model(_config()), VOCAB, max_positions=50)
    table = np.asarray(spec.encoder.position_encodings.encodings)
    assert table.shape == (50, 16)
    np.testing.assert_allclose(table[0], [0.0] * 8 + [1.0] * 8)  # sin(0) | cos(0)
    np.testing.assert_allclose(table[3, :8], np.sin(3.0 * 10000.0 ** (-np.arange(8) / 7.0)),
                               rtol=1e-5)


@needs_ctranslate2
def test_beam_search_against_ours(tmp_path):
    """Beam 4, no length penalty.  Each CTranslate2 hypothesis scores what our model gives it,
    and the best one is ours except where CTranslate2 found a better one (both keep finished
    hypotheses aside, but stop at different steps: docs/SERVING.md)."""
    model = _model(_config(norm="pre", tied=False), seed=3, no_pad_bos=True)
    path = _convert(model, tmp_path)
    sources = _sources(3, n=10)
    ours = beam_search(model, _batch(sources), beam_size=4, length_penalty=0.0, n_best=1,
                       max_length_a=0.0, max_length_b=MAX_LEN)
    ours_ids = keras.ops.convert_to_numpy(ours["ids"])[:, 0]
    ours_logp = keras.ops.convert_to_numpy(ours["log_probs"])[:, 0]
    results = _ct2_translate(path, sources, beam_size=4, length_penalty=0.0, num_hypotheses=2)
    pairs = [(source, [VOCAB.index(t) for t in tokens])
             for source, result in zip(sources, results) for tokens in result.hypotheses]
    rescored = _log_probs(model, [s for s, _ in pairs],
                          [ids + [EOS_ID] if len(ids) < MAX_LEN else ids for _, ids in pairs])
    scores = [score for result in results for score in result.scores]
    np.testing.assert_allclose(scores, [np.sum(x) for x in rescored], atol=1e-4)
    same = 0
    for i, result in enumerate(results):
        expected = [int(t) for t in ours_ids[i] if t != PAD_ID]
        if result.hypotheses[0] == _tokens(expected):
            same += 1
        else:
            assert result.scores[0] > ours_logp[i] + 1e-4, f"sentence {i}: ours is better"
    assert same >= len(sources) - 2


@needs_ctranslate2
def test_int8_quantization(tmp_path):
    model = _model(_config())
    path = _convert(model, tmp_path / "f32", max_positions=MAX_LEN + 10)
    int8 = _convert(model, tmp_path / "int8", quantization="int8", max_positions=MAX_LEN + 10)
    assert os.path.getsize(os.path.join(int8, "model.bin")) < \
        0.6 * os.path.getsize(os.path.join(path, "model.bin"))
    assert len(_ct2_translate(int8, _sources(0), beam_size=1)) == 8


@needs_ctranslate2
def test_output_directory(tmp_path):
    model = _model(_config())
    path = _convert(model, tmp_path)
    files = set(os.listdir(path))
    assert {"model.bin", "config.json", "shared_vocabulary.json", "vocab.txt",
            "deep_nmt.json"} <= files
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert (config["unk_token"], config["bos_token"], config["eos_token"],
            config["decoder_start_token"], config["add_source_eos"],
            config["add_source_bos"]) == ("[UNK]", "<s>", "</s>", "<s>", True, False)
    with open(os.path.join(path, "shared_vocabulary.json"), encoding="utf-8") as f:
        assert json.load(f) == VOCAB
    with pytest.raises(FileExistsError):
        _convert(model, tmp_path)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


REFUSED = {
    "transparent attention": (dict(transparent_attention={"enabled": True}),
                              "model.transparent_attention"),
    "dlcl": (dict(encoder={"transformer": {"num_layers": 2, "num_heads": 2, "ffn_dim": 32,
                                           "dlcl": {"enabled": True}}}),
             "model.encoder.transformer.dlcl"),
    "lexical shortcuts": (dict(decoder={"transformer": {
        "num_layers": 1, "num_heads": 2, "ffn_dim": 32,
        "lexical_shortcuts": {"enabled": True, "placement": "cross"}}}),
        "model.decoder.transformer.lexical_shortcuts"),
    "rnmt+": (dict(encoder={"type": "rnmt_plus", "rnmt_plus": {"num_layers": 1, "units": 8}}),
              "model.encoder.type is 'rnmt_plus'"),
    "rnmt+ decoder": (dict(decoder={"type": "rnmt_plus", "rnmt_plus": {
        "num_layers": 1, "units": 16, "attention_heads": 2}}), "model.decoder.type is 'rnmt_plus'"),
    "cascaded": (dict(encoder={"type": "cascaded", "cascaded": {"stages": [
        {"type": "rnmt_plus", "rnmt_plus": {"num_layers": 1, "units": 8}},
        {"type": "transformer", "transformer": {"num_layers": 1, "num_heads": 2,
                                                "ffn_dim": 32}}]}}),
        "model.encoder.type is 'cascaded'"),
    "multi_column": (dict(encoder={"type": "multi_column", "multi_column": {"columns": [
        {"type": "rnmt_plus", "rnmt_plus": {"num_layers": 1, "units": 8}},
        {"type": "transformer", "transformer": {"num_layers": 1, "num_heads": 2,
                                                "ffn_dim": 32}}]}}),
        "model.encoder.type is 'multi_column'"),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_refusals_name_the_feature(feature):
    changes, key = REFUSED[feature]
    model = {"vocab_size": V, "d_model": 16, "tie_source_target_embeddings": False,
             "encoder": {"transformer": {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}},
             "decoder": {"transformer": {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}}}
    model.update(changes)
    built = build_model(config_from_dict({"model": model}, source="<refusal test>"))
    problems = unsupported_features(built)
    assert len(problems) == 1 and key in problems[0], problems
    with pytest.raises(UnsupportedModelError, match="cannot convert this model to CTranslate2"):
        check_convertible(built)


def test_plain_transformers_are_convertible():
    for case in CASES.values():
        assert unsupported_features(_model(_config(**case))) == []


# -- run directories, the tool and the text translator -----------------------------------------


def _unsupported_run_dir(tmp_path):
    """A run directory (config and vocabulary, no checkpoint) of a DLCL model."""
    from deep_nmt_tf.run_dir import RunDir

    stack = {"num_layers": 2, "num_heads": 2, "ffn_dim": 32}
    config = config_from_dict({"model": {
        "vocab_size": V, "d_model": 16,
        "encoder": {"transformer": dict(stack, dlcl={"enabled": True})},
        "decoder": {"transformer": stack}}, "data": {"corpus": "synthetic"}},
        source="<dlcl run>")
    run = RunDir(str(tmp_path / "run"))
    run.write_config(config)
    (tmp_path / "run" / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return run.path


def test_tool_refuses_an_unsupported_model(tmp_path, capfd):
    """The tool's main in this process (its error is what the process prints before it exits
    non-zero; the ``converted`` fixture below runs the tool's own process)."""
    from deep_nmt_tf.tools import export as export_tool
    from test_robustness import _tool

    run = _unsupported_run_dir(tmp_path)
    capfd.readouterr()
    error = _tool(export_tool, f"--model_dir={run}", "--format=ctranslate2")
    error += capfd.readouterr().err
    assert error  # a non-zero exit
    assert "model.encoder.transformer.dlcl" in error, error[-2000:]
    assert "cannot convert this model to CTranslate2" in error
    assert not os.path.exists(os.path.join(run, "ctranslate2"))
    error = _tool(export_tool, f"--model_dir={run}", "--format=ctranslate2", "--version=2")
    error += capfd.readouterr().err
    assert error and "--version applies to the SavedModel" in error


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The session's tiny trained model, converted by the tool."""
    from test_decoding_helpers import trained_model_dir
    from test_training_helpers import run_tool

    model_dir = trained_model_dir(tmp_path_factory)
    out = str(tmp_path_factory.mktemp("ct2") / "model")
    proc = run_tool("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                    f"--export_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == out
    return model_dir, out


@needs_ctranslate2
@pytest.mark.slow
def test_text_translations_equal_ours(converted):
    """Text in, text out: CTranslate2Translator's greedy translations of the test set are our
    Translator's (the run's tokenizer, source truncation and length limits); a blank input
    gives an empty translation without decoding (CTranslate2's rule; ours decodes ``</s>``)."""
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.export.ctranslate2_translator import CTranslate2Translator

    model_dir, path = converted
    ours = Translator.from_model_dir(model_dir, jit_compile=False)  # (XLA: not the subject)
    with open(ours.config.data.test_source, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f] + [" ".join(["word"] * 60)]
    ct2 = CTranslate2Translator(path, intra_threads=1)
    with open(os.path.join(path, "deep_nmt.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["decoding"]["max_input_length"] == ours.config.decoding.max_input_length
    assert meta["vocab"]["sha256"]
    ours_out = ours.translate(sentences, beam_size=1)
    assert sum(bool(h[0].text) for h in ours_out) >= 3  # Some translations are not empty.
    ct2_out = ct2.translate_hypotheses(sentences, beam_size=1)
    assert [h[0].text for h in ct2_out] == [h[0].text for h in ours_out]
    assert [tuple(ct2._ids[t] for t in h[0].tokens) for h in ct2_out] == \
        [h[0].ids for h in ours_out]
    assert ct2.translate(sentences[:2], beam_size=1) == [h[0].text for h in ours_out[:2]]
    assert ct2.translate(["", "  "], beam_size=1) == ["", ""]
    with pytest.raises(ValueError, match="n_best"):
        ct2.translate_tokens([["w1"]], beam_size=2, n_best=3)
    with pytest.raises(FileNotFoundError, match="deep_nmt.json"):
        CTranslate2Translator(model_dir)


# -- SentencePiece runs ---------------------------------------------------------------------------

needs_sentencepiece = pytest.mark.skipif(
    __import__("importlib").util.find_spec("sentencepiece") is None,
    reason="the sentencepiece package is not installed")

SP_SENTENCES = ["Ta broku glimo vasu.", "MOKA mi Mopa balapa, ko paglagli!", "vasu",
                "Ωmega 漢字 glimo", "Ta kagugus ko paglagli moka mi mopa balapa."]


@pytest.fixture(scope="module")
def sp_converted(tmp_path_factory):
    """A lower-casing SentencePiece run (a unigram model learned on the synthetic corpus, a
    random-weight model saved as its checkpoint), converted by export_model_dir."""
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.data import synthetic
    from deep_nmt_tf.data.spm import learn_sentencepiece
    from deep_nmt_tf.export.ctranslate2 import export_model_dir
    from deep_nmt_tf.run_dir import RunDir

    directory = tmp_path_factory.mktemp("sp_run")
    paths = synthetic.write_corpus(str(directory / "corpus"), 200, 10, 10, seed=5)
    run = RunDir(str(directory / "run"))
    model_path = run.join("sentencepiece.model")
    sp = learn_sentencepiece([paths["train_source"], paths["train_target"]], model_path, 120,
                             lowercase=True)
    stack = {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}
    config = config_from_dict({
        "model": {"vocab_size": sp.vocab_size, "d_model": 16, "encoder": {"transformer": stack},
                  "decoder": {"transformer": dict(stack, tie_softmax=False)},
                  "tie_source_target_embeddings": False},  # (untied: varied outputs)
        "data": {"vocab": model_path, "lowercase": True, "tokenizer": {"type": "sentencepiece"}},
        "decoding": {"beam_size": 1, "max_length_a": 1.0, "max_length_b": 4}},
        source="<sentencepiece ctranslate2 run>")
    run.write_config(config)
    CheckpointStore(run).save(_model(config, seed=1), 1, 1)
    return run.path, export_model_dir(run.path, str(directory / "ct2")), sp


@needs_ctranslate2
@needs_sentencepiece
def test_a_sentencepiece_run_converts_and_translates_as_ours(sp_converted):
    """CTranslate2Translator's greedy text of a SentencePiece run is our Translator's: the
    pieces in our id order, lower-casing, an unknown character as [UNK], decoding by the
    model."""
    from deep_nmt_tf.constants import UNK_TOKEN
    from deep_nmt_tf.export.ctranslate2_translator import CTranslate2Translator
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.run_dir import file_sha256

    run_path, path, sp = sp_converted
    assert {"sentencepiece.model", "vocab.txt", "shared_vocabulary.json"} <= set(os.listdir(path))
    with open(os.path.join(path, "deep_nmt.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["tokenizer"] == {"kind": "sentencepiece", "file": "sentencepiece.model",
                                 "sha256": file_sha256(sp.path), "lowercase": True}
    with open(os.path.join(path, "shared_vocabulary.json"), encoding="utf-8") as f:
        assert json.load(f) == sp.pieces
    with open(os.path.join(path, "vocab.txt"), encoding="utf-8") as f:
        assert f.read().splitlines() == sp.pieces

    ours = Translator.from_model_dir(run_path, jit_compile=False)
    ct2 = CTranslate2Translator(path, intra_threads=1)
    assert ct2.kind == "sentencepiece" and ct2.lowercase
    tokens = ct2.tokenize(SP_SENTENCES)  # plain Python: the in-graph tokenizer's ids
    assert [[ct2._ids[t] for t in row] for row in tokens] == ours.tokenize(SP_SENTENCES)
    assert UNK_TOKEN in tokens[3] and tokens[1] == ct2.tokenize([SP_SENTENCES[1].lower()])[0]
    ours_out = ours.translate(SP_SENTENCES, beam_size=1)
    ct2_out = ct2.translate_hypotheses(SP_SENTENCES, beam_size=1)
    assert len({t for h in ct2_out for t in h[0].tokens}) >= 10  # Not one piece repeated.
    assert [h[0].text for h in ct2_out] == [h[0].text for h in ours_out]
    assert [tuple(ct2._ids[t] for t in h[0].tokens) for h in ct2_out] == \
        [h[0].ids for h in ours_out]
    assert ct2.detokenize([UNK_TOKEN, "</s>", "\u2581x"]) == " \u2047 "  # sentencepiece's


@needs_ctranslate2
@needs_sentencepiece
def test_a_changed_sentencepiece_model_is_refused(sp_converted, tmp_path):
    import shutil

    from deep_nmt_tf.export.ctranslate2_translator import CTranslate2Translator

    path = str(tmp_path / "ct2")
    shutil.copytree(sp_converted[1], path)
    with open(os.path.join(path, "sentencepiece.model"), "ab") as f:
        f.write(b"\n")
    with pytest.raises(ValueError, match=r"sentencepiece\.model .* is not the sentencepiece file"):
        CTranslate2Translator(path)
    meta_path = os.path.join(path, "deep_nmt.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    meta["tokenizer"]["kind"] = "bpe"
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    with pytest.raises(ValueError, match=r"tokenizer.kind 'bpe' is unknown"):
        CTranslate2Translator(path)


@needs_sentencepiece
def test_sentencepiece_pieces_must_be_distinct_tokens(tmp_path):
    """A model whose own piece repeats a reserved token (a user-defined ``<pad>`` where the
    model has no padding id) cannot be looked up by string: refused, naming the file."""
    import sentencepiece

    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.export.ctranslate2 import read_tokens

    text = tmp_path / "text.txt"
    text.write_text("\n".join(["ta broku glimo vasu", "moka mi mopa balapa"] * 20) + "\n",
                    encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "dup"), vocab_size=30, minloglevel=2,
        user_defined_symbols=["<pad>"], hard_vocab_limit=False)
    with pytest.raises(DataError, match=r"dup\.model: the piece '<pad>' .* repeats the token"):
        read_tokens(str(tmp_path / "dup.model"), "sentencepiece")
    with pytest.raises(ValueError, match="unknown tokenizer kind 'bpe'"):
        read_tokens(str(text), "bpe")


@needs_ctranslate2
def test_an_old_directory_without_a_tokenizer_kind_is_wordpiece(tmp_path):
    from deep_nmt_tf.export.ctranslate2_translator import CTranslate2Translator

    path = _convert(_model(_config(), seed=1), tmp_path,
                    max_positions=MAX_LEN + 10)
    meta_path = os.path.join(path, "deep_nmt.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["tokenizer"]["kind"] == "wordpiece" and meta["tokenizer"]["file"] == "vocab.txt"
    meta["tokenizer"] = {"lowercase": False}  # as the first converter wrote it (no kind)
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    ct2 = CTranslate2Translator(path, intra_threads=1)
    assert ct2.kind == "wordpiece" and ct2.vocab == VOCAB
    out = ct2.translate_tokens([_tokens(s) for s in _sources(0, n=3)], beam_size=1,
                               max_length_a=0.0, max_length_b=MAX_LEN)
    assert [h[0].text for h in out] == [" ".join(h[0].tokens) for h in out]
