"""Translating a real file: batches by length in input order restored (the translator and the
SavedModel route of deep-nmt-benchmark --mode=decode_file), and the file benchmark on a tiny
trained run (deep_nmt_tf.benchmark.decoding.benchmark_file, through the tool)."""

import json

import numpy as np
import pytest
import tensorflow as tf

from config_trees import config, transformer
from deep_nmt_tf.constants import EOS_ID, PAD_ID, RESERVED_TOKENS
from deep_nmt_tf.data.vocab import Tokenizer
from deep_nmt_tf.inference import Translator, length_batches

WORDS = [f"w{i}" for i in range(20)]


def test_length_batches_sort_by_length_and_cover_every_input_once():
    lengths = [5, 1, 3, 1, 9, 0, 3]
    batches = length_batches(lengths, 3)
    assert batches == [[5, 1, 3], [2, 6, 0], [4]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert length_batches([], 4) == []
    with pytest.raises(ValueError, match="batch_size"):
        length_batches(lengths, 0)


def test_translator_batches_by_length_and_restores_the_order():
    """A search that echoes its source: each output must come back to its own input's place,
    and each batch must hold inputs of neighbouring lengths (shuffled-length input)."""
    tokenizer = Tokenizer(list(RESERVED_TOKENS) + WORDS)
    cfg = config(transformer(len(RESERVED_TOKENS) + len(WORDS), 16, 2, 32, 1, 1),
                 decoding={"beam_size": 1, "n_best": 1})
    translator = Translator(lambda: None, tokenizer, cfg, precision="float32", jit_compile=False)
    batches = []

    def echo(source_ids, options):
        ids = source_ids.numpy()
        batches.append(sorted(int(n) for n in (ids != PAD_ID).sum(axis=1) - 1))
        ids = np.where(ids == EOS_ID, PAD_ID, ids)[:, None, :]
        return {"ids": tf.constant(ids), "scores": tf.zeros(ids.shape[:2]),
                "lengths": tf.constant((ids != PAD_ID).sum(axis=-1))}

    translator.searches.run = echo
    rng = np.random.default_rng(0)
    lengths = rng.permutation([1, 2, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 0])
    sentences = [" ".join(rng.choice(WORDS, n)) for n in lengths]
    hyps = translator.translate(sentences, batch_size=4)
    assert [h[0].text for h in hyps] == sentences
    assert batches == [[0, 1, 2, 2], [3, 5, 6, 7], [8, 9, 11, 12], [13]]


@pytest.mark.slow
def test_file_benchmark_on_a_tiny_trained_run(tmp_path, tmp_path_factory):
    """deep-nmt-benchmark --mode=decode_file: both routes translate the file alike, in input
    order, and BLEU is the translator's."""
    from deep_nmt_tf.benchmark.decoding import format_file_results
    from deep_nmt_tf.decoding.scoring import corpus_scores
    from test_decoding_helpers import trained_model_dir
    from test_training_helpers import run_tool

    model_dir = trained_model_dir(tmp_path_factory)
    translator = Translator.from_model_dir(model_dir, jit_compile=False)
    with open(translator.config.data.test_source, encoding="utf-8") as f:
        sources = [line.rstrip("\n") for line in f][:12]
    with open(translator.config.data.test_target, encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f][:12]
    order = np.random.default_rng(1).permutation(len(sources))
    shuffled, references = [sources[i] for i in order], [references[i] for i in order]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(s + "\n" for s in shuffled), encoding="utf-8")
    ref.write_text("".join(r + "\n" for r in references), encoding="utf-8")
    proc = run_tool("benchmark", "--mode=decode_file", f"--model_dir={model_dir}",
                    f"--input={src}", f"--reference={ref}", "--precision=float32",
                    "--nojit_compile", "--repeats=1", "--override=decoding.batch_size=5",
                    "--override=decoding.beam_size=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outputs_equal"] is True
    assert (result["precision"], result["jit_compile"], result["beam_size"],
            result["batch_size"]) == ("float32", False, 2, 5)
    assert "--precision=float32 --nojit_compile given" in result["inference_settings"]
    expected = [h[0].text for h in translator.translate(shuffled, beam_size=2)]
    bleu = corpus_scores(expected, references)["bleu"]
    for path in ("translator", "saved_model"):
        r = result["results"][path]
        assert r["tokens_per_second"] > 0 and r["sentences_per_second"] > 0
        assert r["bleu"] == pytest.approx(bleu)
    assert format_file_results(result) in proc.stdout


def test_pipeline_benchmark_on_a_tiny_trained_run(tmp_path_factory):
    """deep-nmt-benchmark --mode=pipeline: the run's training pipeline, timed, with overrides;
    its tokens are the run's batches' non-padding tokens (the same for either autotune)."""
    from deep_nmt_tf.benchmark.pipeline import format_pipeline_result
    from test_decoding_helpers import trained_model_dir
    from test_training_helpers import run_tool

    model_dir = trained_model_dir(tmp_path_factory)
    results = []
    for override in ("data.autotune=false", "data.autotune=true"):
        proc = run_tool("benchmark", "--mode=pipeline", f"--model_dir={model_dir}", "--steps=4",
                        "--repeats=1", "--warmup=1", f"--override={override}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        assert format_pipeline_result(results[-1]) in proc.stdout
    assert [r["autotune"] for r in results] == [False, True]
    assert results[0]["tokens"] == results[1]["tokens"] > 0
    for r in results:
        assert r["tokens_per_s"] > 0 and r["tokens_per_cpu_s"] > 0 and r["batches"] == 4
