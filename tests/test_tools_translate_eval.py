"""deep-nmt-translate, deep-nmt-evaluate and deep-nmt-average-checkpoints (tools/translate.py,
tools/evaluate.py, tools/average_checkpoints.py), imported as ``deep_nmt_tf.tools``."""

import os

import numpy as np
import pytest
import sacrebleu

from deep_nmt_tf.decoding.scoring import checkpoint_window, corpus_scores, mean_std
from test_decoding_helpers import STEPS, trained_model_dir
from test_training_helpers import run_tool

HYPOTHESES = [
    "The cat sat on the mat.",
    "Dogs, however, don't like rain!",
    "It costs $3.50 (roughly).",
    "",
    "A completely different sentence here",
]
REFERENCES = [
    "The cat sat on a mat.",
    "Dogs, however, do not like the rain!",
    "It costs $3.50 (approximately).",
    "Nothing.",
    "A completely different sentence is here.",
]


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return str(path)


def test_evaluator_reproduces_sacrebleu_on_fixed_files(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.txt", HYPOTHESES)
    ref = _write(tmp_path / "ref.txt", REFERENCES)
    from deep_nmt_tf.tools.evaluate import format_scores, score_files

    scores = score_files(hyp, ref)
    assert scores["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-9)
    assert scores["tok_bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], tokenize="intl").score, abs=1e-9)
    assert scores["bleu_lc"] == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True).score, abs=1e-9)
    assert "case:lc" in scores["bleu_lc_signature"] and "tok:13a" in scores["bleu_lc_signature"]
    assert "tok:13a" in scores["bleu_signature"] and "nrefs:1" in scores["bleu_signature"]
    assert "tok:intl" in scores["tok_bleu_signature"]
    assert "nc:6" in scores["chrf_signature"]
    text = format_scores(scores)
    assert f"BLEU = {scores['bleu']:.2f} (nrefs:1" in text
    # The command line prints the same (and needs no model for --hypotheses); its main in this
    # process (test_evaluate_refuses_flags_its_mode_ignores runs the tool's own process).
    from deep_nmt_tf.tools import evaluate as evaluate_tool
    from test_robustness import _tool

    capsys.readouterr()
    assert _tool(evaluate_tool, f"--hypotheses={hyp}", f"--reference={ref}") == ""
    assert text in capsys.readouterr().out
    with pytest.raises(ValueError):
        corpus_scores(["a"], ["a", "b"])


@pytest.mark.parametrize("args, message", [
    (("--hypotheses=h.txt", "--reference=r.txt", "--model_dir=m", "--beam_size=2"),
     "--model_dir, --beam_size: not used with --hypotheses"),
    (("--hypotheses=h.txt", "--reference=r.txt", "--output=o.txt"),
     "--output: not used with --hypotheses"),
    (("--model_dir=m", "--checkpoint_window=3", "--output=o.txt"),
     "--output is not used with --checkpoint_window"),
    (("--model_dir=m", "--checkpoint_window=3", "--checkpoint=m/ckpt-1"),
     "--checkpoint is not used with --checkpoint_window"),
    (("--model_dir=m", "--dev_source=d.en"), "--dev_source is only read with --checkpoint_window"),
])
def test_evaluate_refuses_flags_its_mode_ignores(args, message, tmp_path):
    # Refused before any file is read or written: none of these paths exists.
    proc = run_tool("evaluate", *args, cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert message in proc.stderr
    assert os.listdir(tmp_path) == []


def test_scores_of_a_lowercased_model_are_case_insensitive():
    """deep-nmt-evaluate and the dev BLEU of training score a model trained on lowercased
    text (data.lowercase) case-insensitively, and the signature says so."""
    from deep_nmt_tf.decoding.scoring import corpus_bleu

    lowered = [r.lower() for r in REFERENCES]
    scores = corpus_scores(lowered, REFERENCES, lowercase=True)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert "case:lc" in scores["bleu_signature"] and "case:lc" in scores["tok_bleu_signature"]
    cased = corpus_scores(lowered, REFERENCES)
    assert cased["bleu"] < 100.0 and cased["bleu_lc"] == pytest.approx(100.0)
    assert corpus_bleu(lowered, REFERENCES, lowercase=True) == pytest.approx(100.0)
    assert corpus_bleu(lowered, REFERENCES) < 100.0


def test_checkpoint_window_and_stats():
    # Best dev at index 4; a window of 3 is centred on it, shifted inwards at the ends.
    dev = [1.0, 2.0, 3.0, 3.5, 4.0, 3.9, 1.0]
    assert checkpoint_window(dev, 3) == (3, 6, 4)
    assert checkpoint_window(dev, 21) == (0, 7, 4)
    assert checkpoint_window([5.0, 1.0, 1.0, 1.0], 3) == (0, 3, 0)
    assert checkpoint_window([1.0, 1.0, 1.0, 5.0], 2) == (2, 4, 3)
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(1.0)
    assert mean_std([4.0]) == (4.0, 0.0)


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    from deep_nmt_tf.inference import Translator

    # The plain graph (no XLA): the tools' logic does not depend on it, and it saves compiling
    # each new shape (the export tests cover the XLA default).
    return Translator.from_model_dir(trained_model_dir(tmp_path_factory), jit_compile=False)


def _test_split(translator):
    with open(translator.config.data.test_source, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def test_translate_file_keeps_input_order_and_blank_lines(translator, tmp_path):
    from deep_nmt_tf.tools.translate import read_lines, translate_file

    sources = _test_split(translator)
    lines = sources[:6] + ["", sources[0], "   "] + sources[6:]
    src = _write(tmp_path / "in.txt", lines)
    out = str(tmp_path / "out.txt")
    assert translate_file(translator, src, out, batch_size=4, progress=True) == len(lines)
    got = read_lines(out)
    assert len(got) == len(lines)
    one_batch = translator.translate_batch(lines)["translations"]
    assert got == [t.decode("utf-8") for t in one_batch]
    assert got[7] == got[0]
    # n-best output: Moses format, best first, 2 per sentence (decoding.n_best = 2).
    nbest = str(tmp_path / "nbest.txt")
    translate_file(translator, src, nbest, n_best=2, progress=False)
    rows = [line.split(" ||| ") for line in read_lines(nbest)]
    assert len(rows) == 2 * len(lines)
    assert [int(r[0]) for r in rows[:4]] == [0, 0, 1, 1]
    assert rows[0][1] == got[0]
    assert float(rows[0][2]) >= float(rows[1][2])


@pytest.mark.slow
def test_translate_cli_reads_stdin(translator):
    sources = _test_split(translator)[:5]
    model_dir = os.path.dirname(translator.checkpoint_path)
    proc = run_tool("translate", f"--model_dir={model_dir}", "--beam_size=2",
                    "--length_penalty=1.0", "--nojit_compile", input="\n".join(sources) + "\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [h[0].text for h in translator.translate(sources, beam_size=2,
                                                        length_penalty=1.0)]
    assert proc.stdout.splitlines() == expected
    assert "translating [" not in proc.stderr  # No progress bar for stdin.


def test_evaluate_and_checkpoint_window(translator):
    from deep_nmt_tf.checkpointing import list_checkpoints
    from deep_nmt_tf.tools.evaluate import evaluate_translator, evaluate_window

    data = translator.config.data
    scores = evaluate_translator(translator, data.test_source, data.test_target)
    refs = _test_split_refs(data.test_target)
    assert scores["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(scores["hypotheses"], [refs]).score)
    checkpoints = list_checkpoints(os.path.dirname(translator.checkpoint_path))
    assert len(checkpoints) == 3
    result = evaluate_window(translator, checkpoints, 2, (data.dev_source, data.dev_target),
                             (data.test_source, data.test_target))
    rows = result["checkpoints"]
    start, stop, best = checkpoint_window([r["dev_bleu"] for r in rows], 2)
    assert (result["window_start"], result["window_stop"]) == (start, stop)
    assert result["best_dev"] == rows[best]["checkpoint"]
    window = [r["test_bleu"] for r in rows[start:stop]]
    assert result["test_bleu_mean"] == pytest.approx(np.mean(window))
    assert result["test_bleu_std"] == pytest.approx(np.std(window, ddof=1))
    translator.restore(checkpoints[-1])


def _test_split_refs(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def test_average_checkpoints(translator, tmp_path):
    import tensorflow as tf

    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.checkpoints.averaging import average_checkpoints
    from deep_nmt_tf.checkpointing import list_checkpoints
    from deep_nmt_tf.checkpointing import restore_model_weights as restore_model
    from deep_nmt_tf.models import build_model

    model_dir = os.path.dirname(translator.checkpoint_path)
    out_dir = str(tmp_path / "avg")
    path = average_checkpoints(model_dir, out_dir, last=2)
    assert os.path.basename(path) == f"ckpt-{STEPS[-1]}"
    assert tf.train.latest_checkpoint(out_dir) == path
    last_two = list_checkpoints(model_dir)[-2:]
    values = []
    for ckpt in last_two:
        model = build_model(translator.config)
        restore_model(model, ckpt)
        values.append([v.numpy() for v in model.variables])
    averaged = Translator.from_model_dir(out_dir, jit_compile=False)
    assert averaged.checkpoint_path == path
    for i, v in enumerate(averaged.model.variables):
        if tf.as_dtype(v.dtype).is_floating:
            np.testing.assert_allclose(v.numpy(), (values[0][i] + values[1][i]) / 2,
                                       rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(v.numpy(), values[1][i])
    assert len(averaged.translate(["Hello."])) == 1
    with pytest.raises(ValueError):
        average_checkpoints(model_dir, model_dir)


@pytest.mark.parametrize("tool", ["translate", "evaluate"])
def test_compilation_cache_is_set_before_tensorflow_starts(tool, tmp_path):
    """--compilation_cache reaches TF_XLA_FLAGS while the flags are parsed, before TensorFlow
    is imported (set later, inside main, TensorFlow ignored it); --nojit_compile leaves it."""
    import subprocess
    import sys

    code = ("import os, sys\n"
            f"from deep_nmt_tf.tools import {tool} as tool\n"
            "from deep_nmt_tf.cli import parse_flags_with_compilation_cache as parse\n"
            "parse(sys.argv)\n"
            "assert 'tensorflow' not in sys.modules\n"
            "print('XLA', os.environ.get('TF_XLA_FLAGS', ''))\n")
    cache = str(tmp_path / "xla")
    env = {k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"}
    for extra, expected in (([], f"--tf_xla_persistent_cache_directory={cache}"),
                            (["--nojit_compile"], None)):
        proc = subprocess.run([sys.executable, "-c", code, f"--compilation_cache={cache}"] +
                              extra, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = proc.stdout.strip().splitlines()[-1]
        if expected:
            assert expected in line
        else:
            assert line == "XLA"


def test_compilation_cache_keeps_the_newest_entries_within_its_budget(tmp_path):
    """TensorFlow never evicts its persistent XLA entries: enabling the cache removes the
    oldest beyond the budget, and only XLA's own entry files."""
    from deep_nmt_tf.cli import prune_compilation_cache

    names = [f"xla_compile_cache__{i}__0__XLA_CPU_JIT.pb" for i in range(4)]
    for age, name in enumerate(names):  # names[0] newest, names[3] oldest
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 - age, 1000 - age))
    (tmp_path / "searches").mkdir()
    (tmp_path / "notes.txt").write_bytes(b"y" * 1000)
    assert prune_compilation_cache(str(tmp_path), max_bytes=250) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        names[:2] + ["searches", "notes.txt"])
    assert prune_compilation_cache(str(tmp_path), max_bytes=250) == 0
    assert prune_compilation_cache(str(tmp_path / "missing"), max_bytes=0) == 0
