"""The search cache: traced searches reused without the Keras model, in-process and in a fresh
process; damaged or non-fitting entries fall back to tracing; keys change with the search."""

import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest

from deep_nmt_tf.inference import Translator
from deep_nmt_tf.export.search_cache import search_key
from deep_nmt_tf.run_dir import RunDir
from test_decoding_helpers import trained_model_dir

pytestmark = pytest.mark.slow

SENTENCES = ["", "a b c", "the house is blue and the house is small"]


def _sources(model_dir):
    with open(RunDir(model_dir).load_config().data.test_source, encoding="utf-8") as f:
        return SENTENCES + [line.rstrip("\n") for line in f][:6]


def _summary(hypotheses):
    return [[(h.text, h.ids, round(h.score, 4)) for h in nbest] for nbest in hypotheses]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return trained_model_dir(tmp_path_factory)


def _entries(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".functions.pb"))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_cached_search_runs_without_the_model(model_dir, tmp_path, precision):
    """The same n-best lists as the traced search (bfloat16 included: its numerics depend on
    the graph optimisations, which the cached call must get as a tf.function call does)."""
    cache = str(tmp_path / "searches")
    sources = _sources(model_dir)
    options = dict(jit_compile=False, precision=precision)
    plain = Translator.from_model_dir(model_dir, **options)
    expected = _summary(plain.translate(sources, batch_size=4, n_best=2))

    first = Translator.from_model_dir(model_dir, search_cache=cache, **options)
    assert first._model is None  # Not built until a search has to be traced.
    assert _summary(first.translate(sources, batch_size=4, n_best=2)) == expected
    assert first._model is not None
    entries = _entries(cache)
    assert len(entries) >= 2  # Batches of two padded widths at least.

    second = Translator.from_model_dir(model_dir, search_cache=cache, **options)
    assert _summary(second.translate(sources, batch_size=4, n_best=2)) == expected
    assert second._model is None, "the cached searches should not need the model"
    assert _entries(cache) == entries

    # Another beam size is another search: traced (building the model), then cached.
    third = Translator.from_model_dir(model_dir, search_cache=cache, **options)
    third.translate(sources[:2], beam_size=1)
    assert third._model is not None and len(_entries(cache)) > len(entries)


def test_damaged_or_unfitting_entries_fall_back_to_tracing(model_dir, tmp_path, caplog):
    cache = str(tmp_path / "searches")
    sources = _sources(model_dir)[:4]
    expected = _summary(Translator.from_model_dir(model_dir, jit_compile=False,
                                                  search_cache=cache).translate(sources))
    (entry,) = _entries(cache)
    functions = os.path.join(cache, entry)
    with open(functions, "wb") as f:
        f.write(b"not a function library")
    with caplog.at_level(logging.WARNING):
        damaged = Translator.from_model_dir(model_dir, jit_compile=False, search_cache=cache)
        assert _summary(damaged.translate(sources)) == expected
    assert damaged._model is not None
    assert any("Search cache: ignoring" in r.getMessage() for r in caplog.records)

    # The entry was written again; now make its recorded variable shapes disagree with the
    # checkpoint (as a checkpoint of another model would).
    meta_path = functions.replace(".functions.pb", ".json")
    with open(meta_path) as f:
        meta = json.load(f)
    first = sorted(meta["variables"], key=int)[0]
    meta["variables"][first][0] = [s + 1 for s in meta["variables"][first][0]]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    unfitting = Translator.from_model_dir(model_dir, jit_compile=False, search_cache=cache)
    assert _summary(unfitting.translate(sources)) == expected
    assert unfitting._model is not None


def test_fresh_process_uses_the_entries_with_xla(model_dir, tmp_path):
    """The tool's route: XLA (the float32 default), entries written by one process and run
    by the next without building the model."""
    cache = str(tmp_path / "searches")
    code = ("import json, sys\n"
            "from deep_nmt_tf.inference import Translator\n"
            f"t = Translator.from_model_dir({model_dir!r}, search_cache={cache!r})\n"
            "assert t.jit_compile\n"
            f"h = t.translate({SENTENCES!r})\n"
            "print(json.dumps({'built': t._model is not None,"
            " 'out': [[x.text, list(x.ids), round(x.score, 4)] for nb in h for x in nb]}))\n")
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["built"] and not runs[1]["built"]
    assert runs[1]["out"] == runs[0]["out"]


def test_search_key_follows_what_shapes_the_search(model_dir):
    config = RunDir(model_dir).load_config()  # (what Translator.from_model_dir reads)
    d = config.decoding
    key = search_key(config.model, d, "float32", True, 0, (1, 8))
    assert key == search_key(config.model, d, "float32", True, 0, (1, 8))
    others = [search_key(config.model, d, "float32", True, 0, (2, 8)),
              search_key(config.model, d, "bfloat16", True, 0, (1, 8)),
              search_key(config.model, d, "float32", False, 0, (1, 8)),
              search_key(config.model, dataclasses.replace(d, beam_size=d.beam_size + 1),
                         "float32", True, 0, (1, 8)),
              search_key(dataclasses.replace(config.model, vocab_size=config.model.vocab_size
                                             + 1), d, "float32", True, 0, (1, 8))]
    assert len({key, *others}) == 6


def test_host_source_preparation_matches_the_graph_one(model_dir, tmp_path):
    """Translator's numpy source preparation (the cached route) and prepare_source (the
    SavedModel's, in the graph) agree: out-of-vocabulary ids, special tokens, truncation, empty
    rows, padding to a multiple."""
    import tensorflow as tf

    from deep_nmt_tf.export.module import prepare_source

    translator = Translator.from_model_dir(model_dir, jit_compile=False,
                                           search_cache=str(tmp_path / "searches"))
    config = translator.config
    vocab = config.model.vocab_size
    rows = [[], [5, 0, 1, 2, 7], [vocab, vocab + 5, -3, 4], list(range(3, 3 + 3 * 64)), [1, 2]]
    host = translator._prepare_rows(rows)
    graph = prepare_source(tf.ragged.constant(rows, dtype=tf.int32), vocab,
                           config.decoding.max_input_length, translator.pad_to_multiple)
    assert host.numpy().tolist() == graph.numpy().tolist()
    assert translator._model is None


def test_cache_keeps_the_most_recently_used_entries(tmp_path):
    """Saving beyond max_entries removes the least recently used entry; a load counts as a
    use; the entry just written is never the one removed."""
    import tensorflow as tf

    from deep_nmt_tf.export.search_cache import SearchCache

    variable = tf.Variable([1.0, 2.0])
    fn = tf.function(lambda source_ids, length_penalty: {
        "scores": tf.cast(source_ids, tf.float32) * variable * length_penalty})
    concrete = fn.get_concrete_function(tf.TensorSpec([2], tf.int32),
                                        tf.TensorSpec([], tf.float32))
    cache = SearchCache(str(tmp_path), max_entries=2)
    assert cache.save("a" * 64, concrete, [variable]) and cache.save("b" * 64, concrete, [variable])
    for key, when in (("a" * 64, 1), ("b" * 64, 2)):  # a older than b
        for path in cache._paths(key):
            os.utime(path, (when, when))
    loaded = cache.load("a" * 64)  # a is now the most recently used
    out = loaded(tf.constant([3, 4]), tf.constant(2.0), {0: variable})
    assert out["scores"].numpy().tolist() == [6.0, 16.0]
    assert cache.save("c" * 64, concrete, [variable])
    assert _entries(str(tmp_path)) == ["a" * 64 + ".functions.pb", "c" * 64 + ".functions.pb"]
    with pytest.raises(ValueError, match="max_entries"):
        SearchCache(str(tmp_path), max_entries=0)


def test_eviction_removes_oldest_first_within_the_budget(tmp_path):
    """Both caches' eviction: the least recently used entries go first, all their files, until
    the rest fit the budget; a file another process removed meanwhile is no error."""
    from deep_nmt_tf.eviction import remove_oldest

    entries = []
    for key, when, cost in (("new", 30, 5), ("old", 10, 5), ("mid", 20, 5)):
        paths = [str(tmp_path / f"{key}.{i}") for i in range(2)]
        for path in paths:
            open(path, "w").close()
        entries.append((key, when, cost, paths))
    os.remove(tmp_path / "mid.1")  # gone already
    assert remove_oldest(entries, budget=15) == []
    assert remove_oldest(entries, budget=6) == ["old", "mid"]
    assert sorted(os.listdir(tmp_path)) == ["new.0", "new.1"]
    assert remove_oldest(entries[:1], budget=0) == ["new"] and not os.listdir(tmp_path)
