"""SavedModel export: fresh-process reload without deep_nmt_tf, saved_model_cli, bad inputs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from deep_nmt_tf.export import export_saved_model, next_version
from deep_nmt_tf.inference import Translator
from test_decoding_helpers import trained_model_dir

# Every test needs the module's exported model (the session's tiny trained run, exported).
pytestmark = pytest.mark.slow

BAD_INPUTS = ["", "   ", "\t \u3000 ", " ".join(["word"] * 400), "😀 <s> </s> <pad> [UNK] ##",
              "a\x00b", "\u200b"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The default export (XLA in float32) of the session's tiny run, and its translator."""
    model_dir = trained_model_dir(tmp_path_factory)
    translator = Translator.from_model_dir(model_dir)
    export_dir = str(tmp_path_factory.mktemp("export"))
    path = export_saved_model(translator.module, export_dir, config=translator.config)
    with open(translator.config.data.test_source, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f][:10]
    return translator, export_dir, path, sentences


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same model's plain-graph (``--nojit_compile``) translator and export: the checks
    that are not about XLA use these (XLA compiles every new input shape, seconds each), and
    it is what TF Serving's default (XLA-disabled) server runs."""
    translator = Translator.from_model_dir(trained_model_dir(tmp_path_factory), jit_compile=False)
    path = export_saved_model(translator.module, str(tmp_path_factory.mktemp("plain")),
                              config=translator.config)
    return translator, path


def test_export_layout(exported):
    translator, export_dir, path, _ = exported
    assert path == os.path.join(export_dir, "1")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    assert os.path.exists(os.path.join(path, "assets.extra", "config.yaml"))
    assert next_version(export_dir) == 2
    assert not [n for n in os.listdir(export_dir) if n.startswith(".tmp")]
    with pytest.raises(FileExistsError):
        export_saved_model(translator.module, export_dir, version=1)


def test_export_records_its_precision_and_xla(exported):
    translator, _, path, _ = exported
    with open(os.path.join(path, "assets.extra", "deep_nmt.json"), encoding="utf-8") as f:
        assert json.load(f) == {"precision": "float32", "jit_compile": translator.jit_compile}


def test_export_tool_records_the_settings_it_chose_for_this_machine(tmp_path_factory, tmp_path,
                                                                    caplog):
    """deep-nmt-export without --precision/--jit_compile: the fastest setting here
    (deep_nmt_tf.hardware.fastest_inference_settings), logged once and recorded.  (The tool's
    main in this process; tests/test_export_ctranslate2.py runs it in its own.)"""
    import logging

    from deep_nmt_tf.hardware import fastest_inference_settings
    from deep_nmt_tf.tools import export as export_tool
    from test_robustness import _tool

    chosen = fastest_inference_settings()
    with caplog.at_level(logging.INFO, logger="absl"):  # (--verbosity: parsing the flags
        assert _tool(export_tool, f"--model_dir={trained_model_dir(tmp_path_factory)}",
                     f"--export_dir={tmp_path}", "--verbosity=0") == ""  # sets absl's level)
    logged = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Inference settings: ") for m in logged) == 1, logged
    assert any(m.startswith(f"Inference settings: {chosen.reason}") for m in logged), logged
    with open(tmp_path / "1" / "assets.extra" / "deep_nmt.json", encoding="utf-8") as f:
        assert json.load(f) == {"precision": chosen.precision,
                                "jit_compile": chosen.jit_compile,
                                "inference_settings": chosen.reason}


# The XLA export serves the batch; the plain one (the same signatures without XLA) the other
# requests, each of which the XLA export would compile for its own shape.
_FRESH = r'''
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops)
m, plain = tf.saved_model.load(sys.argv[1]), tf.saved_model.load(sys.argv[2])
batch, bad = json.loads(sys.argv[3]), json.loads(sys.argv[4])
out = m.signatures["serving_default"](text=tf.constant(batch))
res = {"translations": [t.decode("utf-8") for t in out["translations"].numpy()],
       "scores": out["scores"].numpy().tolist(),
       "nbest": [[t.decode("utf-8") for t in row] for row in out["nbest_translations"].numpy()],
       "nbest_scores": out["nbest_scores"].numpy().tolist()}
m = plain
serve = m.signatures["serving_default"]
out = serve(text=tf.constant(batch))
res["plain_translations"] = [t.decode("utf-8") for t in out["translations"].numpy()]
res["plain_nbest"] = [[t.decode("utf-8") for t in row]
                      for row in out["nbest_translations"].numpy()]
bad_out = serve(text=tf.constant(bad))
res["bad"] = [t.decode("utf-8") for t in bad_out["translations"].numpy()]
res["empty_batch"] = serve(text=tf.constant([], tf.string))["translations"].shape.as_list()
opts = m.signatures["translate_with_options"](text=tf.constant(batch[:3]),
                                               beam_size=tf.constant(1),
                                               length_penalty=tf.constant(0.0))
res["options"] = [t.decode("utf-8") for t in opts["translations"].numpy()]
ids = m.signatures["translate_ids"](source_ids=tf.constant(
    [[5, 6, 7, 0], [0, 0, 0, 0], [2, 1, 99999, -5]], tf.int32))
res["ids_lengths"] = ids["lengths"].numpy().tolist()
res["ids_shape"] = ids["ids"].shape.as_list()
res["modules"] = sorted(k for k in sys.modules if k.split(".")[0] == "deep_nmt_tf")
print("RESULT" + json.dumps(res))
'''


@pytest.fixture(scope="module")
def fresh_results(exported, plain):
    _, _, path, sentences = exported
    proc = subprocess.run([sys.executable, "-c", _FRESH, path, plain[1], json.dumps(sentences),
                           json.dumps(BAD_INPUTS)], cwd="/", capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_fresh_process_without_deep_nmt_tf_matches_translator(exported, plain, fresh_results):
    translator, _, _, sentences = exported
    assert fresh_results["modules"] == []
    local = translator.translate_batch(sentences)
    assert fresh_results["translations"] == [t.decode("utf-8") for t in local["translations"]]
    np.testing.assert_allclose(fresh_results["scores"], local["scores"], rtol=1e-6, atol=1e-6)
    assert fresh_results["nbest"] == [[t.decode("utf-8") for t in row]
                                      for row in local["nbest_translations"]]
    np.testing.assert_allclose(fresh_results["nbest_scores"], local["nbest_scores"], atol=1e-6)
    # The host-side path (length-sorted batches) gives the same translations (both on the
    # plain graph: no XLA compile per batch shape).
    hyps = plain[0].translate(sentences, batch_size=4)
    assert [h[0].text for h in hyps] == fresh_results["plain_translations"]
    assert [h.text for h in hyps[0]] == fresh_results["plain_nbest"][0]


def test_bad_inputs_do_not_crash_and_output_is_bounded(plain, fresh_results):
    translator = plain[0]
    assert len(fresh_results["bad"]) == len(BAD_INPUTS)
    assert fresh_results["empty_batch"] == [0]
    d = translator.config.decoding
    bound = int(d.max_length_a * (d.max_input_length + 8) + d.max_length_b)
    out = translator.module.translate_ids(tf.constant([[7] * 500, [0] * 500], tf.int32))
    assert out["ids"].shape[-1] <= bound
    assert (out["lengths"].numpy() <= bound).all()
    # ids outside the vocabulary, <s>, </s> and padding are tolerated.
    assert fresh_results["ids_shape"][:2] == [3, d.n_best]
    assert len(fresh_results["ids_lengths"]) == 3


def test_translate_with_options_signature(exported, plain, fresh_results):
    sentences = exported[3]
    greedy = plain[0].translate(sentences[:3], beam_size=1, length_penalty=0.0)
    assert fresh_results["options"] == [h[0].text for h in greedy]


def _clean_env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def test_saved_model_cli_show(exported):
    path = exported[2]
    # The console script of this Python's TensorFlow (found whether or not its bin/ is on PATH).
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli if os.path.exists(cli) else "saved_model_cli", "show", "--dir",
                           path, "--all"],
                          capture_output=True, text=True, timeout=300, env=_clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("serving_default", "translate_with_options", "translate_ids",
                 "inputs['text']", "outputs['translations']", "outputs['scores']",
                 "inputs['beam_size']", "inputs['source_ids']"):
        assert name in proc.stdout, name


# saved_model_cli itself, with the tensorflow-text ops registered first (the plain console
# script cannot load any SavedModel that uses tensorflow-text ops).
SAVED_MODEL_CLI = ("import sys, tensorflow_text; from tensorflow.python.tools import "
                   "saved_model_cli; sys.argv[0] = 'saved_model_cli'; saved_model_cli.main()")


def test_saved_model_cli_run(plain, tmp_path):
    path = plain[1]  # (the plain graph: no XLA compile in the command)
    proc = subprocess.run(
        [sys.executable, "-c", SAVED_MODEL_CLI, "run", "--dir", path, "--tag_set", "serve",
         "--signature_def", "serving_default",
         "--input_exprs", 'text=["Ta broku glimo vasu.", ""]', "--outdir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=_clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = {f: np.load(tmp_path / f, allow_pickle=True) for f in os.listdir(tmp_path)}
    assert set(saved) >= {"translations.npy", "scores.npy"}
    assert saved["translations.npy"].shape == (2,)


def _assert_plain_graph(path):
    """No XLA cluster and no XLA-only op anywhere in the SavedModel's graph."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    ops = {n.op for n in graph.node}
    for function in graph.library.function:
        ops.update(n.op for n in function.node_def)
        assert not function.attr["_XlaMustCompile"].b, function.signature.name
    assert not {op for op in ops if op.startswith("Xla")}, sorted(ops)


def test_plain_graph_export_has_no_xla_ops(exported, plain):
    """A --nojit_compile export must run on TF Serving's default (XLA-disabled) server."""
    sentences = exported[3]
    path = plain[1]
    _assert_plain_graph(path)
    reloaded = tf.saved_model.load(path)
    out = reloaded.signatures["serving_default"](text=tf.constant(sentences[:2]))
    assert out["translations"].shape == (2,)


def test_bfloat16_export_takes_and_returns_strings(exported, plain, tmp_path, tmp_path_factory):
    """--precision=bfloat16: bfloat16 weights in the SavedModel, strings in and out, float32
    scores, no XLA-only op (plain graph), the in-process bfloat16 translations; close to the
    float32 model's."""
    translator32, sentences = plain[0], exported[3]
    translator = Translator.from_model_dir(trained_model_dir(tmp_path_factory), jit_compile=False,
                                           precision="bfloat16")
    assert {v.dtype for v in translator.module.model_variables
            if v.dtype.is_floating} == {tf.bfloat16}
    path = export_saved_model(translator.module, str(tmp_path), config=translator.config)
    _assert_plain_graph(path)
    reloaded = tf.saved_model.load(path)
    out = reloaded.signatures["serving_default"](text=tf.constant(sentences))
    assert out["translations"].dtype == tf.string and out["scores"].dtype == tf.float32
    local = translator.translate_batch(sentences)
    assert out["translations"].numpy().tolist() == local["translations"].tolist()
    same = sum(a == b for a, b in zip(local["translations"],
                                      translator32.translate_batch(sentences)["translations"]))
    assert same >= len(sentences) // 2, same


def test_xla_is_chosen_by_precision_and_device(exported, monkeypatch, tmp_path_factory):
    """jit_compile=None (the tools' default): XLA in float32; in bfloat16 only with a GPU or
    TPU (XLA's CPU backend runs bfloat16 matmuls at the float32 rate); an explicit choice wins."""
    from deep_nmt_tf.export.module import default_jit_compile

    assert exported[0].jit_compile is True and exported[0].module.jit_compile is True
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        pytest.skip("the CPU-only choice needs a machine without GPU and TPU")
    model_dir = trained_model_dir(tmp_path_factory)
    bf16 = Translator.from_model_dir(model_dir, precision="bfloat16")
    assert bf16.jit_compile is False and bf16.module.jit_compile is False
    forced = Translator.from_model_dir(model_dir, precision="bfloat16", jit_compile=True)
    assert forced.module.jit_compile is True
    assert default_jit_compile("float32") and default_jit_compile("float16")
    assert not default_jit_compile(tf.bfloat16)
    real = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: ["/device:GPU:0"] if kind == "GPU" else real(kind))
    assert default_jit_compile("bfloat16")
