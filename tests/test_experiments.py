"""deep-nmt-experiment: the Multi30k suite file, and a short run of it on tiny synthetic data
(train, average, tune the length penalty on dev, decode, score, results.json, resume)."""

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from deep_nmt_tf.config import ConfigError
from deep_nmt_tf.experiments import (RESERVED_KEYS, find_suite, load_suite, planned_runs,
                                     score)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "configs", "multi30k", "suite.yaml")
# The baseline made tiny (the recipe otherwise as configured): a smoke test of the tool.  One
# traced step for every batch shape (the recipe's static shapes trace one step per length
# bucket: most of a 50-update run's time; they have their own trainer tests).
TINY = ["model.d_model=16", "data.vocab_size=200", "training.batch_tokens=600",
        "training.static_shapes=false",
        "training.checkpoint_every=100", "training.eval_every=0", "decoding.batch_size=16"] + [
    f"model.{stack}.transformer.{key}" for stack in ("encoder", "decoder")
    for key in ("num_layers=1", "num_heads=2", "ffn_dim=32")]


def _corpus(directory, sizes=(("train", 400), ("valid", 12), ("test2016", 10))):
    """The synthetic language pair under Multi30k's file names."""
    from deep_nmt_tf.data.synthetic import generate_pairs

    os.makedirs(directory, exist_ok=True)
    pairs = generate_pairs(sum(n for _, n in sizes), seed=5)
    start = 0
    for split, n in sizes:
        for side, index in (("en", 0), ("de", 1)):
            with open(os.path.join(directory, f"{split}.{side}"), "w", encoding="utf-8") as f:
                f.writelines(p[index] + "\n" for p in pairs[start:start + n])
        start += n
    return str(directory)


def _without_xla(monkeypatch):
    """Translators of this process built without XLA: the compiled search has its own tests
    (test_export_saved_model.py), and its compile, per shape and per translator, costs more
    than the tiny runs here take to train."""
    from deep_nmt_tf.inference import translator as translator_lib

    real = translator_lib.Translator.from_model_dir.__func__
    monkeypatch.setattr(translator_lib.Translator, "from_model_dir", classmethod(
        lambda cls, *args, **kwargs: real(cls, *args, **dict(kwargs, jit_compile=False))))


def _experiment_here(args):
    """deep-nmt-experiment's ``main`` in this process (its flags parsed as on the command line);
    returns its log lines."""
    from absl import flags

    from deep_nmt_tf.tools import experiment as tool
    from test_training_helpers import captured_logs

    flags.FLAGS.unparse_flags()
    argv = flags.FLAGS(["experiment", *args])
    with captured_logs() as messages:
        tool.main(argv)
    return messages


def test_the_multi30k_suite_resolves_every_run():
    suite = load_suite(find_suite(SUITE))
    runs = planned_runs(suite)
    names = [r.name for r in runs]
    assert names[0] == "baseline" and "deep_post-seed2" in names and len(names) == 33
    for system in ("deep_post", "deep_post_transparent", "deep_post_deepnorm",
                   "deep_post_deepnorm_lr1e-3", "deep_post_admin"):  # three seeds (issue 35)
        assert [n for n in names if n.startswith(system + "-")] == [
            f"{system}-seed{s}" for s in (1, 2, 3)]
    assert "deep_pre_30l" in names
    assert "sentencepiece" in names  # the baseline with a SentencePiece vocabulary
    from deep_nmt_tf.config import config_to_dict, load_config

    configs = {run.name: load_config(run.config) for run in runs}  # every run's config loads
    # The low-rate DeepNorm probe differs from DeepNorm in its peak learning rate only.
    low, deepnorm = (config_to_dict(configs[n]) for n in
                     ("deep_post_deepnorm_lr1e-3-seed1", "deep_post_deepnorm-seed1"))
    rates = [c["training"]["schedule"]["inverse_sqrt"].pop("learning_rate")
             for c in (low, deepnorm)]
    assert rates == [1e-3, 5e-3] and low == deepnorm
    # The shallow-decoder runs differ from deep_pre in the decoder's depth only.
    deep_pre = config_to_dict(configs["deep_pre"])
    for name, layers in (("deep_pre_dec2", 2), ("deep_pre_dec1", 1)):
        shallow = config_to_dict(configs[name])
        decoder = shallow["model"]["decoder"]["transformer"]
        assert decoder["num_layers"] == layers
        decoder["num_layers"] = 4
        assert shallow == deep_pre, name
    # The larger-vocabulary run differs from deep_pre in its vocabulary only.
    larger = config_to_dict(configs["deep_pre_vocab10k"])
    assert (larger["data"].pop("vocab_size"), larger["data"].pop("vocab_min_count")) == (10000, 3)
    for key in ("vocab_size", "vocab_min_count"):
        deep_pre["data"].pop(key)
    assert larger == deep_pre
    # The longer run differs from deep_pre in its train length only (an operational key, so a
    # copy of a deep_pre run directory resumes as it: configs/multi30k/deep_pre_12k.yaml).
    longer, base = (config_to_dict(configs[n]) for n in ("deep_pre_12k", "deep_pre"))
    assert [c["training"].pop("train_steps") for c in (longer, base)] == [12000, 6000]
    assert longer == base
    # The anchor's batch differs from the baseline in its batch only.
    b16k, baseline = (config_to_dict(configs[n]) for n in ("baseline_b16k", "baseline"))
    assert [c["training"].pop("batch_tokens") for c in (b16k, baseline)] == [16384, 8192]
    assert b16k == baseline
    # The anchor's batch with the larger vocabulary differs from baseline_b16k in its
    # vocabulary only.
    both = config_to_dict(configs["baseline_b16k_vocab10k"])
    assert (both["data"].pop("vocab_size"), both["data"].pop("vocab_min_count")) == (10000, 3)
    b16k["training"]["batch_tokens"] = 16384
    for key in ("vocab_size", "vocab_min_count"):
        b16k["data"].pop(key)
    assert both == b16k
    # And so does its deep pre-norm run from deep_pre.
    deep_b16k, deep = (config_to_dict(configs[n]) for n in ("deep_pre_b16k", "deep_pre"))
    assert [c["training"].pop("batch_tokens") for c in (deep_b16k, deep)] == [16384, 8192]
    assert deep_b16k == deep
    _check_wide(configs["wide"], configs["baseline"], configs["deep_pre"], vocab_size=6453)
    with pytest.raises(ValueError, match="no run named 'nope'"):
        planned_runs(suite, only=["nope"])
    # --only takes a suite run (all its seeds) or one seeded run by its name.
    assert [r.name for r in planned_runs(suite, only=["deep_post"])] == [
        "deep_post-seed1", "deep_post-seed2", "deep_post-seed3"]
    picked = planned_runs(suite, only=["deep_post_transparent-seed1", "baseline"])
    assert [(r.name, r.seed) for r in picked] == [("baseline", 1),
                                                   ("deep_post_transparent-seed1", 1)]


def _check_wide(wide, baseline, deep_pre, vocab_size):
    """The widened baseline differs from the baseline in its width only, and has the deep
    pre-norm encoder's parameters within 3% (the depth-against-capacity control)."""
    from deep_nmt_tf.config import config_to_dict
    from deep_nmt_tf.sizing import count_parameters

    wide_dict, base_dict = config_to_dict(wide), config_to_dict(baseline)
    assert [d["model"].pop("d_model") for d in (wide_dict, base_dict)] == [184, 128]
    for side in ("encoder", "decoder"):
        stacks = [d["model"][side]["transformer"] for d in (wide_dict, base_dict)]
        assert [stack.pop("ffn_dim") for stack in stacks] == [368, 256]
    assert wide_dict == base_dict
    params = [count_parameters(c.model, vocab_size)["total"] for c in (wide, deep_pre, baseline)]
    assert abs(params[0] / params[1] - 1) < 0.03 and params[0] > 1.6 * params[2], params


def test_the_tatoeba_suite_resolves_every_run():
    suite = load_suite(find_suite(os.path.join(ROOT, "configs", "tatoeba", "suite.yaml")))
    from deep_nmt_tf.config import load_config

    planned = {r.name: r for r in planned_runs(suite)}
    configs = {n: load_config(r.config, list(r.overrides)) for n, r in planned.items()}
    assert list(configs) == ["baseline", "deep_post", "deep_post_transparent",
                             "deep_post_deepnorm", "deep_post_deepnorm_lr1e-3",
                             "deep_post_admin", "deep_pre", "wide", "deep_post_admin_rollback"]
    assert {n for n, r in planned.items() if r.seed != 1} == {"deep_post_admin_rollback"}
    assert {n for n, c in configs.items() if c.training.spike_rollbacks} == {
        "deep_post_admin_rollback"}
    assert configs["deep_post_admin_rollback"].model == configs["deep_post_admin"].model
    assert {c.training.train_steps for c in configs.values()} == {12000}
    encoders = {name: c.model.encoder.get() for name, c in configs.items()}
    assert encoders["baseline"].num_layers == 4
    assert encoders["wide"].num_layers == 4
    assert {encoders[n].num_layers for n in configs if n not in ("baseline", "wide")} == {18}
    _check_wide(configs["wide"], configs["baseline"], configs["deep_pre"], vocab_size=7767)
    assert encoders["deep_post_deepnorm"].residual_scaling.method == "deepnorm"
    assert encoders["deep_post_admin"].residual_scaling.method == "admin"
    rates = {n: c.training.schedule.get().learning_rate for n, c in configs.items()}
    assert rates.pop("deep_post_deepnorm_lr1e-3") == 1e-3 and set(rates.values()) == {5e-3}
    assert encoders["deep_pre"].norm == "pre"
    assert configs["deep_post_transparent"].model.transparent_attention.enabled
    assert suite.tests == ("test",)


def test_suite_file_errors_name_the_key(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text("runs:\n  - {name: a, config: a.yaml, sedes: [1]}\n")
    with pytest.raises(ConfigError, match=r"suite.yaml:2: runs\[0\]\.sedes: unknown key"):
        load_suite(str(path))
    path.write_text("probe_runs: [b]\nruns:\n  - {name: a, config: a.yaml}\n")
    with pytest.raises(ConfigError, match="probe_runs: no run named 'b'"):
        load_suite(str(path))


def test_scores_are_sacrebleu_cased_lowercased_and_chrf():
    got = score(["a Cat sat .", "hello"], ["a cat sat .", "hello"])
    assert got["bleu_lc"] > got["bleu"] and 0.0 < got["chrf"] <= 100.0
    assert "case:lc" in got["bleu_lc_signature"] and "case:mixed" in got["bleu_signature"]
    assert got["brevity_penalty"] == 1.0
    # The brevity penalty is BLEU's exp(1 - r/c) for a short output: 2 words against 6.
    assert score(["a cat"], ["a cat sat on the mat"])["brevity_penalty"] == round(
        math.exp(1 - 6 / 2), 4)


@pytest.mark.slow
def test_the_table_does_not_report_training_it_did_not_time():
    from deep_nmt_tf.experiments.report import markdown as _markdown

    def run(**training):
        return {"training": dict(parameters=2e6, updates=6000, **training),
                "decoding": {"length_penalty": 1.0}, "test2016": {"bleu": 1, "bleu_lc": 2,
                                                                  "chrf": 3}}
    table = _markdown({"timed": run(seconds=1800, cpu_seconds=3600, timed_from_update=0),
                       "outside": run(seconds=0.0, timed_from_update=6000),
                       "resumed": run(seconds=600, cpu_seconds=1800, timed_from_update=4000)},
                      ["test2016"])
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[4] for line in table.splitlines()[2:5]}
    assert rows == {"timed": "30", "outside": "n/a", "resumed": "10 (from update 4000)"}
    assert table.splitlines()[-1] == (
        "Training time of the 2 timed run(s): 0.67 h wall, 1.50 CPU-hours (2 run(s) trained in "
        "part or wholly outside the tool are not fully counted).")
    # The precision is a column, and the machines are listed (wall times compare only on one).
    table = _markdown({"a": run(seconds=60, precision="mixed_bfloat16", hardware="CPU X"),
                       "b": run(seconds=60, precision="float32", hardware="CPU Y"),
                       "c": run(seconds=60, precision="float32", hardware="CPU X")}, ["test2016"])
    assert [line.split(" | ")[2] for line in table.splitlines()[2:5]] == [
        "mixed_bfloat16", "float32", "float32"]
    assert table.splitlines()[-2:] == ["Trained on CPU X: a, c.", "Trained on CPU Y: b."]
    # The gradient-norm spikes a run met (its spikes.json), and what was done about them.
    spikes = [{"step": 6700, "grad_norm": 28.4, "median": 1.136, "history": 200,
               "action": "rolled_back", "to_step": 6600, "checkpoint": "r/ckpt-6600",
               "skipped_micro_batches": 100},
              {"step": 9100, "grad_norm": 50.0, "median": 1.0, "history": 200, "action": "kept",
               "checkpoint": "r/ckpt-9000", "kept_as": "r/kept/before_spike_9100"},
              {"step": 30, "action": "none"}]
    table = _markdown({"a": run(seconds=60, spikes=spikes), "b": run(seconds=60)}, ["test2016"])
    assert table.splitlines()[-1] == (
        "Gradient-norm spikes met in training (training.grad_spike_factor; the run directory's "
        "spikes.json): a: update 6,700 (|g| 28.4, 25x the median): rolled back to 6,600, 100 "
        "micro-batch(es) skipped, update 9,100 (|g| 50, 50x the median): kept the checkpoint of "
        "update 9,000, update 30: nothing done (no checkpoint kept).")


def test_the_machine_is_named_by_family_and_model_and_a_resume_elsewhere_is_recorded():
    from deep_nmt_tf.hardware import cpu_name, record_hardware

    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
               "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
               "model name\t: AMD EPYC\n")
    assert cpu_name(cpuinfo) == "AMD EPYC (cpu family 26, model 2)"
    assert cpu_name("model name\t: Some CPU\n") == "Some CPU"
    assert cpu_name("flags\t: avx\n") == ""
    training = {}
    record_hardware(training, "A, 2 cores")
    record_hardware(training, "A, 2 cores")  # resumed on the same machine: no change
    assert training["hardware"] == "A, 2 cores"
    record_hardware(training, "B, 4 cores")
    record_hardware(training, "B, 4 cores")
    assert training["hardware"] == "A, 2 cores; then B, 4 cores"


def test_a_run_directory_of_another_seed_is_refused(tmp_path):
    """A run directory trained with another seed than its planned run's (adopted from
    deep-nmt-train, or a suite file's seed changed) is refused, naming both seeds, whether the
    seed is known from the tool's record or from the run directory's config.  ``--seeds=2``
    names a new directory for a run the suite file gives seed 1 alone."""
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.experiments.recipe import check_seed as _check_seed
    from deep_nmt_tf.experiments.state import RunState as _State
    from deep_nmt_tf.run_dir import RunDir

    def saved(run_dir):  # what _train passes: the run directory's config, read once
        return RunDir(str(run_dir)).saved_config()

    suite = load_suite(SUITE)
    assert [(r.name, r.seed) for r in planned_runs(suite, only=["baseline"], seeds=[2])] == [
        ("baseline-seed2", 2)]
    assert [(r.name, r.seed) for r in planned_runs(suite, only=["baseline"], seeds=[1, 3])] == [
        ("baseline", 1), ("baseline-seed3", 3)]  # seed 1 is the suite's run: its directory
    assert [r.name for r in planned_runs(suite, only=["deep_post"], seeds=[2])] == [
        "deep_post-seed2"]  # the suite file gives deep_post several seeds: NAME-seedN
    run = dataclasses.replace(planned_runs(suite, only=["baseline"])[0], seed=2)
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "experiment.json").write_text(json.dumps({"training": {"seed": 1}}))
    state = _State(str(recorded / "experiment.json"))
    with pytest.raises(ValueError, match=r"training.seed=1, but seed 2 .*baseline-seed1 "
                       r"\(--seeds=1 names"):
        _check_seed(run, None, str(recorded), state)
    adopted = tmp_path / "adopted"
    RunDir(str(adopted)).write_config(load_config(None, [
        "training.seed=1", "training.schedule.type=inverse_sqrt"]))
    with pytest.raises(ValueError, match="training.seed=1, but seed 2"):
        _check_seed(run, saved(adopted), str(adopted), _State(str(adopted / "experiment.json")))
    _check_seed(planned_runs(suite, only=["baseline"], seeds=[1])[0], saved(adopted),
                str(adopted), _State(str(adopted / "experiment.json")))  # the same seed: resumes
    _check_seed(run, None, str(tmp_path / "new"), _State(str(tmp_path / "new.json")))  # a new run
    # Another recipe in the same directory (a changed schedule) is refused, naming the keys;
    # how often it logs or checkpoints, how long it trains, or where the data lies may change.
    from deep_nmt_tf.experiments.recipe import check_recipe as _check_recipe

    seed1 = planned_runs(suite, only=["baseline"], seeds=[1])[0]
    base = ["training.seed=1", "training.schedule.type=inverse_sqrt"]
    _check_recipe(seed1, load_config(None, base + [
        "training.log_every=7", "training.train_steps=99", "data.train_source=/elsewhere.en"]),
        saved(adopted), str(adopted))
    with pytest.raises(ValueError, match=r"label_smoothing, "
                       r"training.schedule.inverse_sqrt.warmup_steps differ"):
        _check_recipe(seed1, load_config(None, base + [
            "training.schedule.inverse_sqrt.warmup_steps=7", "training.label_smoothing=0.2"]),
            saved(adopted), str(adopted))
    # An override of the seed would train one seed under another's name: refused up front.
    from deep_nmt_tf.experiments import run_suite

    with pytest.raises(ValueError, match="--seeds"):
        run_suite(suite, str(tmp_path), str(tmp_path / "out"), overrides=["training.seed = 3"])


def test_a_run_continues_a_copy_of_a_shorter_run_of_its_recipe(tmp_path, monkeypatch):
    """``continue_from``: a new run directory starts from a copy of another run's of the same
    seed (checkpoints, config, curves; not its average, translations or kept checkpoints) and
    trains on from its last checkpoint; the training record starts from the source's and
    names it.  Another
    recipe, another model, a source as long as the run, an unknown run and a run directory
    trained on its own are refused; a copy interrupted part-way is redone."""
    from deep_nmt_tf import experiments
    from deep_nmt_tf.experiments.suite import SuiteRun

    _without_xla(monkeypatch)
    data = _corpus(tmp_path / "data", sizes=(("train", 200), ("valid", 6), ("test2016", 5)))
    out = str(tmp_path / "out")
    config = os.path.join(os.path.dirname(SUITE), "baseline.yaml")

    def entry(name, *overrides):
        return SuiteRun(name=name, config=config, overrides=tuple(overrides))

    suite = dataclasses.replace(load_suite(find_suite(SUITE)), runs=(
        entry("short", "training.train_steps=30"), entry("long", "training.train_steps=50"),
        entry("again", "training.train_steps=50"),
        entry("smoothed", "training.train_steps=50", "training.label_smoothing=0.2"),
        entry("deeper", "training.train_steps=50", "model.encoder.transformer.norm=pre"),
        entry("as_long", "training.train_steps=30"), entry("longer", "training.train_steps=60")),
        length_penalties=(0.6,),
        length_penalty_extension=0, probe_runs=(), grad_norm_ratio_runs=())
    overrides = TINY + ["training.checkpoint_every=10", "training.log_every=10"]
    messages = []

    def run(only, continue_from=None, stop_after="train"):
        messages.clear()
        return experiments.run_suite(suite, data, out, only=[only], overrides=overrides,
                                     log=messages.append, stop_after=stop_after,
                                     continue_from=continue_from)

    def record(name):
        return json.load(open(os.path.join(out, "runs", name, "experiment.json"),
                              encoding="utf-8"))["training"]

    run("short", "short")  # the source's own runs train as usual
    source = os.path.join(out, "runs", "short")
    assert record("short")["updates"] == 30 and "continued_from" not in record("short")
    os.makedirs(os.path.join(source, "averaged"))  # what a scored source also holds
    os.makedirs(os.path.join(source, "kept", "before_spike_20"))  # and a spike's checkpoint
    open(os.path.join(source, "test2016.hyp"), "w", encoding="utf-8").write("x\n")
    for name, match in (("smoothed", "label_smoothing differ. --continue_from=short continues"),
                        ("deeper", r"another model .*transformer.norm"),
                        ("as_long", "has trained 30 updates, and 'as_long' trains 30")):
        with pytest.raises(ValueError, match=match):
            run(name, "short")
    with pytest.raises(ValueError, match=r"--continue_from=nope: no run named so .*short"):
        run("long", "nope")
    with pytest.raises(SystemExit) as exit_:  # the flag, before any work (exit 2)
        _experiment_here([f"--suite={SUITE}", f"--data_dir={data}", f"--output_dir={out}",
                          "--only=baseline", "--continue_from=nope"])
    assert exit_.value.code == 2 and not os.path.exists(os.path.join(out, "runs", "baseline"))
    # A source another process is writing (a training) is refused before anything is copied.
    from deep_nmt_tf import run_lock

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom deep_nmt_tf "
                               "import run_lock\nrun_lock.acquire(sys.argv[1], 'deep-nmt-train')"
                               "\nprint('held', flush=True)\ntime.sleep(600)\n", source],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(run_lock.RunLockError, match=rf"process {holder.pid} "):
            run("long", "short")
    finally:
        holder.kill()
        holder.wait()
    assert not [n for n in os.listdir(os.path.join(out, "runs", "long"))
                if n != run_lock.LOCK_NAME]  # no record, no copy
    run("long", "short", stop_after=None)
    assert "long: continues a copy of short from its update 30" in messages
    assert "long: training from update 30 to 50" in messages  # not from 0
    long_dir = os.path.join(out, "runs", "long")
    assert not os.path.exists(os.path.join(long_dir, "averaged", "x")) and not any(
        "short" in line for line in open(os.path.join(long_dir, "averaged",
                                                      "averaged_checkpoints.txt")))
    assert open(os.path.join(long_dir, "test2016.hyp")).read() != "x\n"  # its own
    assert not os.path.exists(os.path.join(long_dir, "kept"))  # the source's, not copied
    training = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))["long"][
        "training"]
    assert training["continued_from"] == {"run": "short", "update": 30}
    assert training["updates"] == 50 and training["timed_from_update"] == 0
    assert training["seconds"] > record("short")["seconds"]  # the source's clock, then its own
    assert "(continued from short at 30)" in open(os.path.join(out, "results.md")).read()
    run("long", "short", stop_after=None)  # done: nothing copied or trained again
    assert not any("continues a copy" in m or "training from update" in m for m in messages)
    with pytest.raises(ValueError, match="was continued from 'short', not 'again'"):
        run("long", "again")
    run("longer", "long")  # a chain: the lineage is kept
    assert record("longer")["continued_from"] == {
        "run": "long", "update": 50,
        "source_continued_from": {"run": "short", "update": 30}}
    assert record("longer")["updates"] == 60
    run("again")  # trained on its own
    with pytest.raises(ValueError, match="trained on its own: --continue_from=short starts"):
        run("again", "short")
    # A copy killed part-way (the record says so) is made again.
    partial = os.path.join(out, "runs", "smoothed")
    shutil.rmtree(partial)
    os.makedirs(partial)
    json.dump({"training": {"continued_from": {"run": "short", "update": 30,
                                               "incomplete": True}}},
              open(os.path.join(partial, "experiment.json"), "w"))
    suite = dataclasses.replace(suite, runs=suite.runs[:3] + (entry(
        "smoothed", "training.train_steps=40"),) + suite.runs[4:])
    run("smoothed", "short")
    assert "smoothed: continues a copy of short from its update 30" in messages
    assert "smoothed: training from update 30 to 40" in messages
    assert record("smoothed")["continued_from"] == {"run": "short", "update": 30}
    assert record("smoothed")["updates"] == 40


def test_a_short_baseline_run_trains_decodes_scores_and_resumes(tmp_path, monkeypatch):
    """The tool's main in this process, except the second call (nothing left to do), which is
    the installed command in a process of its own; the beam search without XLA here
    (:func:`_without_xla`)."""
    from test_training_helpers import run_tool

    _without_xla(monkeypatch)
    data = _corpus(tmp_path / "data")
    out = str(tmp_path / "out")
    # The suite with its grid fixed: the grid's extension at its edge has its own tests (a
    # tiny model's best length penalty is often at the grid's end).
    suite = tmp_path / "suite.yaml"
    suite.write_text(open(SUITE, encoding="utf-8").read().replace(
        "config: ", f"config: {os.path.dirname(SUITE)}/").replace(
        "length_penalty_extension: 10", "length_penalty_extension: 0"), encoding="utf-8")
    assert load_suite(str(suite)).length_penalty_extension == 0
    args = [f"--suite={suite}", f"--data_dir={data}", f"--output_dir={out}",
            "--only=baseline", "--max_steps=60",
            f"--extra_test=again={data}/test2016.en:{data}/test2016.de",
            f"--archive_dir={tmp_path / 'archive'}"] + [
        f"--override={o}" for o in TINY + [
            "training.checkpoint_every=20", "training.grad_norm_ratio_every=20"]]
    _experiment_here(args)
    record = json.load(open(tmp_path / "archive" / "baseline" / "record.json", encoding="utf-8"))
    assert set(record["tests"]) == {"test2016", "again"}  # the scored run, archived
    assert len(record["curves"]["train/grad_norm_ratio"][0]) == 3  # r_t at 20, 40, 60
    results = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
    entry = results["baseline"]
    assert record["entry"] == entry
    assert set(entry) == {"test2016", "again", *RESERVED_KEYS} - {"archive"}  # scored here
    for test in ("test2016", "again"):  # the suite's tokenized_bleu_lc: bleu_tok_lc too
        assert set(entry[test]) == {"bleu", "bleu_lc", "chrf", "bleu_tok_lc"}
        assert 0.0 < entry[test]["chrf"] <= 100.0 and entry[test]["bleu_lc"] >= entry[test]["bleu"]
    assert entry["test2016"] == entry["again"]  # the same set scored twice
    assert entry["training"]["updates"] == 60 and entry["training"]["averaged"] == 3
    assert entry["training"]["precision"] == "float32"
    assert re.search(r" cores, TensorFlow \d", entry["training"]["hardware"])
    assert entry["decoding"]["length_penalty"] in (0.6, 0.8, 1.0, 1.2, 1.4)
    grid = entry["decoding"]["length_penalty_grid"]  # the grid, and beyond it if it extended
    assert set(grid) >= {"0.6", "0.8", "1.0", "1.2", "1.4"}
    assert entry["decoding"]["extended"] is False and len(grid) == 5
    assert results["systems"]["baseline"]["seeds"] == [1] and results["comparisons"] == []
    run_dir = os.path.join(out, "runs", "baseline")
    assert len(open(os.path.join(run_dir, "test2016.hyp"), encoding="utf-8").readlines()) == 10
    assert "| baseline |" in open(os.path.join(out, "results.md"), encoding="utf-8").read()
    assert any(f.endswith(".png") for f in os.listdir(os.path.join(out, "figures")))
    # Run again, as the installed command: every stage is done, nothing is trained or decoded
    # again.
    before = os.path.getmtime(os.path.join(run_dir, "test2016.hyp"))
    proc = run_tool("experiment", *args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "training from update" not in proc.stderr
    assert os.path.getmtime(os.path.join(run_dir, "test2016.hyp")) == before
    assert json.load(open(os.path.join(out, "results.json"), encoding="utf-8")) == results
    # A grid that grows keeps the penalties already scored: only the new one is decoded.
    grown = tmp_path / "grown.yaml"
    grown.write_text(suite.read_text(encoding="utf-8").replace(
        "length_penalties: [0.6, 0.8, 1.0, 1.2, 1.4]",
        "length_penalties: [0.6, 0.8, 1.0, 1.2, 1.4, 1.6]"), encoding="utf-8")
    # ... and the spikes the run's spikes.json records (written by the runner) are reported.
    spike = {"step": 30, "grad_norm": 9.0, "median": 0.3, "history": 29, "action": "kept",
             "checkpoint": os.path.join(run_dir, "ckpt-20"), "kept_as": "kept/before_spike_30"}
    with open(os.path.join(run_dir, "spikes.json"), "w", encoding="utf-8") as f:
        json.dump({"spikes": [spike]}, f)
    messages = "\n".join(_experiment_here([f"--suite={grown}"] + args[1:]))
    assert "at length penalty 1.6" in messages
    assert "at length penalty 1.4" not in messages
    grown_results = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
    assert grown_results["baseline"]["training"]["spikes"] == [spike]
    assert "baseline: update 30 (|g| 9, 30x the median): kept the checkpoint of update 20." in \
        open(os.path.join(out, "results.md"), encoding="utf-8").read()
    decoding = grown_results["baseline"]["decoding"]
    assert decoding["length_penalty"] in (0.6, 0.8, 1.0, 1.2, 1.4, 1.6)
    # A moved output directory: its checkpoints are averaged again in their new place (the old
    # average names the old paths) and the same average decodes to the same scores.
    moved = str(tmp_path / "moved")
    os.rename(out, moved)
    messages = "\n".join(_experiment_here([a.replace(out, moved) for a in args]))
    assert "training from update" not in messages
    entry_moved = json.load(open(os.path.join(moved, "results.json"), encoding="utf-8"))[
        "baseline"]
    assert entry_moved["test2016"] == entry["test2016"]
    assert open(os.path.join(moved, "runs", "baseline", "averaged", "averaged_checkpoints.txt"),
                encoding="utf-8").read().count(moved) == 3


@pytest.mark.parametrize("lowercase", [False, True])
def test_a_lowercased_model_gets_its_length_penalty_from_lowercased_dev_bleu(
        tmp_path, monkeypatch, lowercase):
    """A model trained on lowercased text cannot produce case: cased dev BLEU would prefer a
    worse translation that happens to keep the case. The choice is made on lowercased BLEU (and
    recorded), and a run tuned on cased BLEU before is tuned again."""
    import types

    from deep_nmt_tf import run_dir
    from deep_nmt_tf.experiments import PlannedRun
    from deep_nmt_tf.experiments.stages import _decode
    from deep_nmt_tf.experiments.state import RunState as _State
    from deep_nmt_tf.inference import translator as translator_lib

    refs = ["Ein Hund rennt über die Wiese .", "Zwei Männer sitzen vor dem Haus ."]
    srcs = ["a dog runs across the meadow .", "two men sit in front of the house ."]
    paths = {}
    for name, lines in (("src", srcs), ("ref", refs)):
        paths[name] = str(tmp_path / name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)

    class Translator:  # alpha 1.0: the references lowercased; 0.6: cased, one word wrong each
        def translate(self, sentences, beam_size, length_penalty):
            out = ([r.lower() for r in refs] if length_penalty == 1.0 else
                   [r.replace("Hund", "Pferd").replace("Haus", "Zelt") for r in refs])
            return [[types.SimpleNamespace(text=t)] for t in out]

    class RunDir:
        def __init__(self, path):
            pass

        def load_config(self):
            return types.SimpleNamespace(data=types.SimpleNamespace(lowercase=lowercase))

    monkeypatch.setattr(run_dir, "RunDir", RunDir)
    monkeypatch.setattr(translator_lib.Translator, "from_model_dir",
                        staticmethod(lambda path: Translator()))
    suite = dataclasses.replace(load_suite(find_suite(SUITE)), length_penalties=(0.6, 1.0),
                                beam_size=2)
    run = PlannedRun("r", "r", "c.yaml", 1, (), 1)
    state = _State(str(tmp_path / "experiment.json"))
    # As recorded by a version that always tuned on cased BLEU.
    state.data["decoding"] = {"beam_size": 2, "length_penalty": 0.6, "dev_bleu": 1.0,
                              "tried": {"0.6": 1.0, "1.0": 0.0}, "candidates": [0.6, 1.0]}
    results = _decode(run, suite, "model", (paths["src"], paths["ref"]),
                      {"test2016": (paths["src"], paths["ref"])}, str(tmp_path), state,
                      log=lambda message: None)
    decoding = state.data["decoding"]
    if lowercase:
        assert decoding["metric"] == "bleu_lc" and decoding["length_penalty"] == 1.0
        assert decoding["dev_bleu"] == pytest.approx(100.0)
        assert results["test2016"]["bleu_lc"] == pytest.approx(100.0)
    else:  # a cased model keeps the earlier choice (nothing decoded again)
        assert decoding["length_penalty"] == 0.6 and decoding["tried"]["0.6"] == 1.0


@pytest.mark.parametrize("raised,code,says", [
    ("interrupted", 143, "resume with: "),
    ("keyboard", 130, "run the same command again to continue"),
    ("diverged", 1, "experiment: error: training stopped"),
])
def test_a_signal_or_a_diverged_run_ends_the_tool_with_a_message_not_a_traceback(
        tmp_path, monkeypatch, capsys, raised, code, says):
    """SIGTERM while a run trains: the checkpoint is saved by the runner, and the tool says how
    to resume (exit 143), as deep-nmt-train does; Ctrl-C between stages exits 130; a diverged
    run is an error (exit 1)."""
    from absl import flags

    from deep_nmt_tf import experiments
    from deep_nmt_tf.tools import experiment as tool
    from deep_nmt_tf.training import TrainingDiverged, TrainingInterrupted

    def run_suite(*args, **kwargs):
        if raised == "interrupted":
            raise TrainingInterrupted("SIGTERM", 7, str(tmp_path / "ckpt-7"))
        if raised == "keyboard":
            raise KeyboardInterrupt()
        raise TrainingDiverged("training stopped: the last 4 updates were all skipped")

    monkeypatch.setattr(experiments, "run_suite", run_suite)
    flags.FLAGS.unparse_flags()
    argv = flags.FLAGS(["experiment", "--suite=multi30k", f"--data_dir={tmp_path}",
                        f"--output_dir={tmp_path / 'out'}"])
    with pytest.raises(SystemExit) as exit_info:
        tool.main(argv)
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    if raised == "interrupted":
        assert "experiment: interrupted by SIGTERM at step 7" in err
        assert "experiment: resume with: " in err


@pytest.mark.slow
def test_a_training_time_budget_stops_a_run_where_its_clock_runs_out(tmp_path, monkeypatch):
    """``--max_train_minutes``: training stops at the update where the run's clock reaches the
    budget, with a checkpoint there (not a multiple of checkpoint_every), and the run is
    averaged and scored at that update; the same budget again trains nothing; a larger budget
    trains on, and no budget trains to the planned length (the budget record is dropped).
    The clock is faked: one second per update."""
    from deep_nmt_tf import experiments
    from deep_nmt_tf.run_dir import RunDir

    ticks = iter(range(1, 10 ** 6))

    class Clock:  # the tool's wall clock only (the runner keeps the real one)
        process_time = staticmethod(__import__("time").process_time)

        @staticmethod
        def perf_counter():
            return float(next(ticks))

    monkeypatch.setattr(experiments.stages, "time", Clock)  # where the stages read the clock
    _without_xla(monkeypatch)
    data = _corpus(tmp_path / "data", sizes=(("train", 200), ("valid", 6), ("test2016", 5)))
    out = str(tmp_path / "out")
    # One length penalty, no extension: the budget is the subject here, and each penalty tried
    # is a dev decoding per call (the grid has its own tests).  No layer probe among the figures
    # (each call would probe the averaged model again; the short run above draws it).
    suite = dataclasses.replace(load_suite(find_suite(SUITE)), length_penalties=(0.6,),
                                length_penalty_extension=0, probe_runs=())
    overrides = TINY + ["training.checkpoint_every=20", "training.log_every=10"]
    messages = []

    def run(minutes, max_steps=50):
        messages.clear()
        return experiments.run_suite(suite, data, out, only=["baseline"], max_steps=max_steps,
                                     overrides=overrides, log=messages.append,
                                     max_train_minutes=minutes)["baseline"]

    entry = run(0.25)  # 15 s: the clock reads 1 at the start, 1 + n after update n
    assert entry["training"]["updates"] == 15
    assert entry["training"]["budget"] == {"minutes": 0.25, "stopped_at": 15}
    assert any("0.25 minutes of training reached at update 15" in m for m in messages)
    run_dir = os.path.join(out, "runs", "baseline")
    checkpoints = [os.path.basename(c) for c in RunDir(run_dir).list_checkpoints()]
    assert checkpoints[-1] == "ckpt-15" and entry["training"]["averaged"] == len(checkpoints)
    assert set(entry["test2016"]) == {"bleu", "bleu_lc", "chrf", "bleu_tok_lc"}
    assert "15 (0.25-min budget)" in open(os.path.join(out, "results.md"),
                                          encoding="utf-8").read()
    # The same budget: spent; nothing is trained or decoded again.
    assert run(0.25) == entry and not any("training from update" in m for m in messages)
    # A larger budget trains on from update 15 (the clock restarts where it stopped).
    entry = run(0.5)
    assert any("training from update 15 to 50" in m for m in messages)
    assert entry["training"]["budget"] == {"minutes": 0.5, "stopped_at": 30}
    assert os.path.basename(RunDir(run_dir).list_checkpoints()[-1]) == "ckpt-30"
    # No budget: to the planned length; the run no longer counts as stopped by a budget.
    entry = run(None)
    assert entry["training"]["updates"] == 50 and "budget" not in entry["training"]
    with pytest.raises(ValueError, match="max_train_minutes=0: must be > 0"):
        run(0)


# --------------------------------------------------------------------------------------------
# The length-penalty grid extends at its edge (fake dev scores; nothing is decoded)
# --------------------------------------------------------------------------------------------


def _fake_decoding(tmp_path, monkeypatch, dev_score, **suite_keys):
    """``_decode`` with a fake model and a fake dev score per length penalty; returns a
    function that runs it (a fresh RunState from the run's experiment.json each time, as a
    resumed tool reads it) and the list of penalties decoded on dev."""
    import types

    from deep_nmt_tf import run_dir
    from deep_nmt_tf.experiments import PlannedRun, stages
    from deep_nmt_tf.experiments.state import RunState as _State
    from deep_nmt_tf.inference import translator as translator_lib

    class RunDir:
        def __init__(self, path):
            pass

        def load_config(self):
            return types.SimpleNamespace(data=types.SimpleNamespace(lowercase=False))

    decoded = []

    def fake_dev_score(translator, sources, references, beam, alpha, metric):
        decoded.append(alpha)
        return dev_score(alpha)

    tmp_path.mkdir(exist_ok=True)
    for name in ("src", "ref"):
        (tmp_path / name).write_text("a b c .\n", encoding="utf-8")
    monkeypatch.setattr(run_dir, "RunDir", RunDir)
    monkeypatch.setattr(translator_lib.Translator, "from_model_dir",
                        staticmethod(lambda path: object()))
    monkeypatch.setattr(stages, "_dev_score", fake_dev_score)
    suite = dataclasses.replace(load_suite(find_suite(SUITE)), **suite_keys)
    run = PlannedRun("r", "r", "c.yaml", 1, (), 1)
    messages = []

    def decode():
        state = _State(str(tmp_path / "experiment.json"))
        stages._decode(run, suite, "model", (str(tmp_path / "src"), str(tmp_path / "ref")), {},
                       str(tmp_path), state, log=messages.append)
        return _State(str(tmp_path / "experiment.json")).data["decoding"]

    return decode, decoded, messages


def test_a_best_length_penalty_at_the_grid_end_extends_the_grid_until_dev_bleu_falls(
        tmp_path, monkeypatch):
    """Dev BLEU rises past the grid's top (1.4) to 1.8 and falls after: 1.6, 1.8 and 2.0 are
    tried (the grid's spacing), 1.8 is chosen, the values and scores are recorded, and a
    resumed tool decodes nothing again."""
    decode, decoded, messages = _fake_decoding(
        tmp_path, monkeypatch, lambda a: 30.0 - (a - 1.8) ** 2,
        length_penalties=(0.6, 0.8, 1.0, 1.2, 1.4))
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
    assert decoding["length_penalty"] == 1.8 and decoding["extended"] is True
    assert decoding["dev_bleu"] == pytest.approx(30.0)
    assert list(decoding["tried"]) == ["0.6", "0.8", "1.0", "1.2", "1.4", "1.6", "1.8", "2.0"]
    assert decoding["tried"]["2.0"] == pytest.approx(30.0 - 0.2 ** 2)
    assert any("at length penalty 2.0 (beyond the grid)" in m for m in messages)
    decoded.clear()
    assert decode() == decoding and decoded == []  # resumed: nothing decoded again


def test_a_best_length_penalty_inside_the_grid_keeps_the_grid(tmp_path, monkeypatch):
    decode, decoded, _ = _fake_decoding(tmp_path, monkeypatch, lambda a: 30.0 - (a - 1.0) ** 2,
                                        length_penalties=(0.6, 0.8, 1.0, 1.2, 1.4))
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0, 1.2, 1.4]
    assert decoding["length_penalty"] == 1.0 and decoding["extended"] is False


def test_the_grid_extends_downwards_to_0_at_most_and_stops_at_its_cap(tmp_path, monkeypatch):
    # Best below the grid: 0.4, 0.2, then 0.0 (a step of 0.4 would pass 0), never below.
    decode, decoded, _ = _fake_decoding(tmp_path / "down", monkeypatch, lambda a: 30.0 - a,
                                        length_penalties=(0.6, 1.0))
    decoding = decode()
    assert decoded == [0.6, 1.0, 0.2, 0.0]
    assert decoding["length_penalty"] == 0.0 and decoding["extended"] is True
    # Ever better upwards: stopped after length_penalty_extension values, and said so.
    decode, decoded, messages = _fake_decoding(tmp_path / "up", monkeypatch, lambda a: a,
                                               length_penalties=(0.6, 0.8),
                                               length_penalty_extension=3)
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0, 1.2, 1.4] and decoding["capped"] is True
    assert decoding["length_penalty"] == 1.4
    assert any("length_penalty_extension" in m for m in messages)


def test_a_tie_at_the_grid_end_extends_nothing_and_a_tie_chooses_inside_the_grid(
        tmp_path, monkeypatch):
    """A flat dev score (a model that writes one sentence for every input) extends nothing and
    keeps the smallest penalty of the grid; a value beyond the grid that only equals the end's
    score stops the search and is not chosen."""
    decode, decoded, _ = _fake_decoding(tmp_path / "flat", monkeypatch, lambda a: 0.18,
                                        length_penalties=(0.6, 0.8, 1.0))
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0]
    assert decoding["length_penalty"] == 0.6 and decoding["extended"] is False
    # Best alone at the bottom (0.6); 0.4 only ties it: tried, then the search stops at 0.6.
    decode, decoded, _ = _fake_decoding(tmp_path / "down", monkeypatch,
                                        lambda a: 30.0 if a <= 0.6 else 29.0,
                                        length_penalties=(0.6, 0.8, 1.0))
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0, 0.4]
    assert decoding["length_penalty"] == 0.6 and decoding["extended"] is True
    # Two best values at the top (0.8 and 1.0 tie): not the best alone, no extension.
    decode, decoded, _ = _fake_decoding(tmp_path / "top", monkeypatch,
                                        lambda a: 30.0 if a >= 0.8 else 29.0,
                                        length_penalties=(0.6, 0.8, 1.0))
    decoding = decode()
    assert decoded == [0.6, 0.8, 1.0] and decoding["length_penalty"] == 0.8


def test_a_killed_length_penalty_search_resumes_without_decoding_again(tmp_path, monkeypatch):
    """Each penalty scored is saved at once: killed while decoding 1.8, the search resumes
    with 1.8 (the grid and 1.6 are not decoded again)."""
    kill = [True]

    def dev_score(alpha):
        if alpha == 1.8 and kill[0]:
            kill[0] = False
            raise KeyboardInterrupt()
        return 30.0 - (alpha - 1.8) ** 2

    decode, decoded, _ = _fake_decoding(tmp_path, monkeypatch, dev_score,
                                        length_penalties=(1.0, 1.2, 1.4))
    with pytest.raises(KeyboardInterrupt):
        decode()
    decoded.clear()
    assert decode()["length_penalty"] == 1.8
    assert decoded == [1.8, 2.0]


# --------------------------------------------------------------------------------------------
# Seed statistics and paired comparisons (hand-written translations; nothing is trained)
# --------------------------------------------------------------------------------------------

REFS = [f"ein mann fährt fahrrad nummer {i} auf der strasse ." for i in range(60)]
WEAK = [r if i % 3 == 0 else r.rsplit(" ", 2)[0] + " ." for i, r in enumerate(REFS)]


def _suite_on_disk(tmp_path, runs, compare_to=""):
    """A suite file with ``baseline`` and ``deep_pre`` (two seeds each) and ``other`` (one),
    and an output directory whose runs (name -> (seed, translations)) have their results.json
    entries and ``test2016.hyp`` files."""
    from deep_nmt_tf.experiments.state import write_lines

    path = tmp_path / "suite.yaml"
    path.write_text(compare_to + "tests: [test2016]\nruns:\n"
                    "  - {name: baseline, config: a.yaml, seeds: [1, 2]}\n"
                    "  - {name: deep_pre, config: a.yaml, seeds: [1, 2]}\n"
                    "  - {name: other, config: a.yaml}\n", encoding="utf-8")
    out = tmp_path / "out"
    write_lines(str(tmp_path / "test2016.de"), REFS)
    results = {}
    for name, (seed, hyps) in runs.items():
        (out / "runs" / name).mkdir(parents=True)
        write_lines(str(out / "runs" / name / "test2016.hyp"), hyps)
        scores = score(hyps, REFS)
        results[name] = {"training": {"seed": seed}, "decoding": {"length_penalty": 1.0},
                         "test2016": {k: scores[k] for k in ("bleu", "bleu_lc", "chrf")}}
    return load_suite(str(path)), results, str(out), {"test2016": str(tmp_path / "test2016.de")}


def test_the_report_gives_each_system_its_seed_statistics_and_paired_comparisons(
        tmp_path, monkeypatch):
    from deep_nmt_tf.decoding.significance import seed_statistics
    from deep_nmt_tf.experiments import statistics
    from deep_nmt_tf.experiments.report import markdown as _markdown

    near = WEAK[:1] + [REFS[1]] + WEAK[2:]  # one sentence better than the baseline
    suite, results, out, refs = _suite_on_disk(tmp_path, {
        "baseline": (1, WEAK),  # the seed-1 run named as a one-seed run: it stands ...
        "baseline-seed1": (1, REFS),  # ... and this second run of seed 1 is left out
        "baseline-seed2": (2, WEAK[:-1] + [REFS[-1]]),
        "deep_pre-seed1": (1, REFS), "deep_pre-seed2": (2, REFS[:-1] + [WEAK[-1]]),
        "other": (1, near), "gone": (1, REFS)})  # "gone": no longer in the suite file
    statistics.update_report(suite, results, refs, out, log=lambda m: None)
    systems = results["systems"]
    assert list(systems) == ["baseline", "deep_pre", "other"]
    assert systems["baseline"]["runs"] == ["baseline", "baseline-seed2"]
    assert systems["baseline"]["left_out"] == ["baseline-seed1"]
    assert systems["deep_pre"]["seeds"] == [1, 2] and systems["other"]["seeds"] == [1]
    got = systems["deep_pre"]["tests"]["test2016"]["bleu_lc"]
    assert got == seed_statistics([results["deep_pre-seed1"]["test2016"]["bleu_lc"],
                                   results["deep_pre-seed2"]["test2016"]["bleu_lc"]])
    assert got["n"] == 2 and got["ci95"][0] < got["mean"] < got["ci95"][1]
    assert systems["other"]["tests"]["test2016"]["chrf"]["ci95"] is None  # one seed
    # Against baseline and deep_pre (the default compare_to), each other system, both BLEUs.
    by_key = {(c["system"], c["reference"], c["metric"]): c for c in results["comparisons"]}
    assert len(by_key) == len(results["comparisons"]) == 8
    better = by_key["deep_pre", "baseline", "bleu_lc"]
    assert [(p["system_seed"], p["reference_seed"]) for p in better["pairs"]] == [(1, 1), (2, 2)]
    assert [p["reference_run"] for p in better["pairs"]] == ["baseline", "baseline-seed2"]
    assert all(p["p_value"] < 0.05 and p["delta_ci95"][0] > 0 for p in better["pairs"])
    assert better["effect"] == "better" and better["delta_seed_ci95"] is not None
    assert better["delta"] == pytest.approx(sum(p["delta"] for p in better["pairs"]) / 2)
    assert by_key["baseline", "deep_pre", "bleu"]["effect"] == "worse"
    one = by_key["other", "baseline", "bleu_lc"]  # seed 1 against seed 1 only
    assert [p["reference_seed"] for p in one["pairs"]] == [1] and one["pairs"][0]["p_value"] > .05
    assert one["effect"] == "no effect established" and one["delta_seed_ci95"] is None
    # results.md: the seed table and the comparison table.
    table = _markdown(results, ["test2016"])
    assert re.search(r"\| deep_pre \| 1, 2 \| \d+\.\d\d ± \d+\.\d\d \[", table)
    assert re.search(r"\| deep_pre \| baseline \| test2016 \| BLEU lc \| 1-1; 2-2 \| \+\d", table)
    assert "| better |" in table and "| worse |" in table
    # Rebuilt: the pairs already tested are reused (their inputs hash the same) ...
    monkeypatch.setattr(statistics, "paired_bootstrap", None)
    before = json.loads(json.dumps(results))
    statistics.update_report(suite, results, refs, out, log=lambda m: None)
    assert json.loads(json.dumps(results)) == before
    # ... and only the pairs whose translations changed are tested again.
    from deep_nmt_tf.decoding import significance
    from deep_nmt_tf.experiments.state import write_lines

    calls = []

    def counted(*args, **kwargs):
        calls.append(len(args[2]))
        return significance.paired_bootstrap(*args, **kwargs)

    monkeypatch.setattr(statistics, "paired_bootstrap", counted)
    write_lines(os.path.join(out, "runs", "other", "test2016.hyp"),
                near[:2] + REFS[2:3] + near[3:])  # a second sentence fixed
    statistics.update_report(suite, results, refs, out, log=lambda m: None)
    assert calls == [1, 1, 1, 1]  # other against baseline and deep_pre, two metrics each
    again = {(c["system"], c["reference"], c["metric"]): c for c in results["comparisons"]}
    assert again["other", "baseline", "bleu_lc"]["delta"] > one["delta"]
    assert again["deep_pre", "baseline", "bleu"] == by_key["deep_pre", "baseline", "bleu"]


def test_the_report_says_how_far_dev_predicted_test_across_the_runs(tmp_path):
    """dev_test: every run with a dev score is a point; a run that failed to train counts in
    "all" and not "near_best"; the run with the best dev score and its regret on test."""
    from deep_nmt_tf.decoding.significance import score_agreement
    from deep_nmt_tf.experiments import statistics
    from deep_nmt_tf.experiments.report import markdown as _markdown

    suite, results, out, refs = _suite_on_disk(tmp_path, {
        "baseline-seed1": (1, WEAK), "baseline-seed2": (2, WEAK), "deep_pre-seed1": (1, REFS),
        "deep_pre-seed2": (2, REFS), "other": (1, WEAK)})
    points = {"baseline-seed1": (39.1, 38.9), "baseline-seed2": (39.4, 38.5),
              "deep_pre-seed1": (41.3, 40.0), "deep_pre-seed2": (41.4, 39.6),
              "other": (2.2, 2.5)}  # "other" failed to train
    for name, (dev, test) in points.items():
        results[name]["decoding"].update(dev_bleu=dev, dev_metric="bleu")
        results[name]["test2016"]["bleu_lc"] = test
    results["gone"] = {"training": {}, "decoding": {"length_penalty": 1.0},  # no dev score
                       "test2016": {"bleu_lc": 99.0, "bleu": 99.0, "chrf": 99.0}}
    statistics.update_report(suite, results, refs, out, log=lambda m: None)
    got = results["dev_test"]["test2016"]
    assert got["metric"] == "bleu_lc" and got["dev_metric"] == "bleu"
    assert got["all"]["n"] == 5 and "gone" not in got["all"]["runs"]
    near = got["near_best"]
    assert near["runs"] == ["baseline-seed1", "baseline-seed2", "deep_pre-seed1",
                            "deep_pre-seed2"]
    names = near["runs"]
    want = score_agreement([points[n][0] for n in names], [points[n][1] for n in names])
    assert near["pearson"] == pytest.approx(want["pearson"]) and near["pearson"] < 0.99
    assert got["all"]["pearson"] > 0.99  # the failed run alone makes dev look perfect
    assert near["dev_choice"] == {"run": "deep_pre-seed2", "dev": 41.4, "test": 39.6}
    assert near["test_best"]["run"] == "deep_pre-seed1"
    assert near["regret"] == pytest.approx(0.4)
    table = _markdown(results, ["test2016"])
    assert re.search(r"test2016, runs within 5 dev points of the best: 4 runs: Pearson r "
                     r"0\.\d\d.*deep_pre-seed2 \(dev 41\.40\), scores 39\.60 on test: 0\.40 below "
                     r"the best on test, deep_pre-seed1", table)
    # Fewer than three runs with a dev score: said, not computed.
    few = {n: results[n] for n in ("baseline-seed1", "deep_pre-seed1")}
    assert statistics.dev_test_agreement(few, ["test2016"])["test2016"]["all"] is None
    assert statistics.dev_test_agreement({}, ["test2016"]) == {}


def test_moses_lowercased_bleu_scores_the_official_tokenised_text():
    """bleu_tok_lc: both sides lowercased and Moses-tokenised with aggressive hyphen splitting,
    then BLEU on those tokens; differs from 13a where the two tokenisers split differently."""
    pytest.importorskip("sacremoses")
    from deep_nmt_tf.decoding.scoring import moses_lowercased_bleu

    hyp, ref = ["Ein Mann im T-Shirt spielt Gitarre."], ["ein Mann im T-Shirt spielt Gitarre ."]
    got = moses_lowercased_bleu(hyp, ref, "de")
    assert got["bleu_tok_lc"] == 100.0  # case and the final period's spacing are tokenised away
    assert score(hyp, ref)["bleu_lc"] == 100.0
    assert "moses:de+lc+aggressive-dash" in got["bleu_tok_lc_signature"]
    assert "tok:none" in got["bleu_tok_lc_signature"]
    # A hyphenated compound: one 13a token "t-shirt", three Moses tokens "t @-@ shirt", so
    # a hypothesis that drops the hyphen matches more n-grams under Moses.
    hyp, ref = ["ein mann im t shirt spielt laut gitarre"], ["ein mann im t-shirt spielt gitarre"]
    assert moses_lowercased_bleu(hyp, ref, "de")["bleu_tok_lc"] != score(hyp, ref)["bleu_lc"]
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        moses_lowercased_bleu(["a", "b"], ["a"], "de")


def test_the_report_fills_in_tokenised_bleu_for_runs_scored_or_archived_before(
        tmp_path, monkeypatch):
    """A suite with tokenized_bleu_lc: the entries without bleu_tok_lc get it from their
    translations (run directory or archive), it joins the seed table, and a missing sacremoses
    stops the tool before any run, naming the suite file and key."""
    pytest.importorskip("sacremoses")
    from deep_nmt_tf.decoding import scoring
    from deep_nmt_tf.experiments import stages, statistics
    from deep_nmt_tf.experiments.report import markdown as _markdown

    suite, results, out, refs = _suite_on_disk(tmp_path, {
        "baseline-seed1": (1, WEAK), "baseline-seed2": (2, REFS), "deep_pre-seed1": (1, REFS)},
        compare_to="tokenized_bleu_lc: true\n")
    assert suite.tokenized_bleu_lc
    archived = tmp_path / "archived"  # deep_pre-seed1's translations only in an "archive"
    os.rename(os.path.join(out, "runs", "deep_pre-seed1"), archived)
    results["deep_pre-seed1"]["archive"] = {"dir": str(archived), "archived": "then"}
    results["baseline-seed2"]["test2016"]["bleu_tok_lc"] = 12.5  # scored already: kept
    statistics.update_report(suite, results, refs, out, log=lambda m: None)
    assert results["baseline-seed1"]["test2016"]["bleu_tok_lc"] == scoring.moses_lowercased_bleu(
        WEAK, REFS, "de")["bleu_tok_lc"] < 100.0
    assert results["deep_pre-seed1"]["test2016"]["bleu_tok_lc"] == 100.0
    assert results["baseline-seed2"]["test2016"]["bleu_tok_lc"] == 12.5
    stats = results["systems"]["baseline"]["tests"]["test2016"]["bleu_tok_lc"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(
        (results["baseline-seed1"]["test2016"]["bleu_tok_lc"] + 12.5) / 2)
    assert {c["metric"] for c in results["comparisons"]} == {"bleu_lc", "bleu"}  # not tested
    table = _markdown(results, ["test2016"])
    assert "test2016 BLEU tok lc" in table and "| 12.50 |" in table
    # A run whose translations are gone keeps its entry without the score (said so).
    del results["baseline-seed1"]["test2016"]["bleu_tok_lc"]
    os.remove(os.path.join(out, "runs", "baseline-seed1", "test2016.hyp"))
    said = []
    statistics.add_tokenized_bleu(suite, results, refs, out, {}, said.append)
    assert "bleu_tok_lc" not in results["baseline-seed1"]["test2016"]
    assert "baseline-seed1: test2016: no tokenised lowercased BLEU" in said[0]
    statistics.update_report(suite, results, refs, out, log=lambda m: None)  # one seed has it:
    assert "bleu_tok_lc" not in results["systems"]["baseline"]["tests"]["test2016"]  # no stats

    # Without sacremoses the tool stops before training anything.
    def missing(language):
        raise scoring.MosesMissing("the tokenised lowercased BLEU (bleu_tok_lc) needs the "
                                   "sacremoses package")

    monkeypatch.setattr(scoring, "_moses_tokenizer", missing)
    monkeypatch.setattr(stages, "run_one", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ConfigError, match=r"suite.yaml: tokenized_bleu_lc: .*sacremoses"):
        stages.run_suite(suite, str(tmp_path), out, log=lambda m: None)


def test_compare_to_names_runs_of_the_suite(tmp_path):
    suite, _, _, _ = _suite_on_disk(tmp_path, {}, compare_to="compare_to: [other]\n")
    assert suite.compare_to == ("other",)
    path = tmp_path / "bad.yaml"
    path.write_text("compare_to: [baseline, deep_pre]\nruns:\n  - {name: baseline, config: a}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:1: compare_to: no run named 'deep_pre'"):
        load_suite(str(path))
    # The default keeps those of baseline and deep_pre the suite has.
    path.write_text("runs:\n  - {name: baseline, config: a}\n")
    assert load_suite(str(path)).compare_to == ("baseline",)
    path.write_text("runs:\n  - {name: a, config: a}\n")
    assert load_suite(str(path)).compare_to == ()
    path.write_text("runs:\n  - {name: systems, config: a}\n")
    with pytest.raises(ConfigError, match=r"runs\[0\]\.name: 'systems' is a key of results"):
        load_suite(str(path))


def test_a_run_of_one_system_keeps_every_other_systems_statistics(tmp_path, monkeypatch):
    """``--only``: the report is rebuilt from every run in results.json and on disk, not only
    the runs of this invocation (the run itself is faked: nothing is trained)."""
    from deep_nmt_tf.experiments import stages

    suite, results, out, refs = _suite_on_disk(tmp_path, {
        "baseline-seed1": (1, WEAK), "baseline-seed2": (2, WEAK),
        "deep_pre-seed1": (1, REFS), "deep_pre-seed2": (2, REFS), "other": (1, WEAK)})
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in results.items() if k != "other"}, f)
    for split in ("train", "valid", "test2016"):
        for side in ("en", "de"):
            if not (tmp_path / f"{split}.{side}").exists():
                (tmp_path / f"{split}.{side}").write_text("a\n", encoding="utf-8")
    monkeypatch.setattr(stages, "run_one", lambda run, *args, **kwargs: results[run.name])
    monkeypatch.setattr(stages, "figures", lambda *args: [])
    got = stages.run_suite(suite, str(tmp_path), out, only=["other"], log=lambda m: None)
    assert list(got["systems"]) == ["baseline", "deep_pre", "other"]
    assert got["systems"]["deep_pre"]["runs"] == ["deep_pre-seed1", "deep_pre-seed2"]
    assert {(c["system"], c["reference"]) for c in got["comparisons"]} == {
        ("deep_pre", "baseline"), ("other", "baseline"), ("baseline", "deep_pre"),
        ("other", "deep_pre")}
    assert json.load(open(os.path.join(out, "results.json"), encoding="utf-8")) == got
    assert "| other | deep_pre | test2016 | BLEU lc |" in open(
        os.path.join(out, "results.md"), encoding="utf-8").read()


def test_a_run_trained_with_fit_and_averaged_elsewhere_is_scored_here_not_retrained(
        tmp_path, monkeypatch):
    """--route=fit --stop_after=average (what a GPU machine with only JAX runs), then the run
    directory copied without its checkpoints and the suite run again: decoded and scored, not
    trained or averaged again."""
    import shutil

    _without_xla(monkeypatch)
    data = _corpus(tmp_path / "data", sizes=(("train", 200), ("valid", 6), ("test2016", 5)))
    out, copy = str(tmp_path / "out"), str(tmp_path / "copy")
    suite = tmp_path / "suite.yaml"
    suite.write_text(open(SUITE, encoding="utf-8").read().replace(
        "config: ", f"config: {os.path.dirname(SUITE)}/").replace(
        "length_penalties: [0.6, 0.8, 1.0, 1.2, 1.4]", "length_penalties: [1.0]"),
        encoding="utf-8")
    common = [f"--suite={suite}", f"--data_dir={data}", "--only=baseline", "--max_steps=6"] + [
        f"--override={o}" for o in TINY + ["training.checkpoint_every=2",
                                           "training.log_every=2"]]
    from absl import flags

    with pytest.raises(flags.IllegalFlagValueError, match="preprocess|train|average"):
        _experiment_here(common + [f"--output_dir={out}", "--stop_after=decode"])
    assert not os.path.exists(out)  # refused before any work
    messages = "\n".join(_experiment_here(common + [f"--output_dir={out}", "--route=fit",
                                                    "--stop_after=average"]))
    assert "training with fit" in messages and "grad-norm ratio" in messages
    run_dir = os.path.join(out, "runs", "baseline")
    state = json.load(open(os.path.join(run_dir, "experiment.json"), encoding="utf-8"))
    assert state["training"]["route"] == "fit" and state["training"]["updates"] == 6
    assert len(state["averaged"]) == 3 and os.path.isdir(os.path.join(run_dir, "averaged"))
    assert not os.path.exists(os.path.join(out, "results.json"))  # nothing decoded yet
    assert not os.path.exists(os.path.join(run_dir, "test2016.hyp"))
    # The copy a GPU machine sends back: no checkpoints, no token ids.
    shutil.copytree(run_dir, os.path.join(copy, "runs", "baseline"), ignore=shutil.ignore_patterns(
        "ckpt-*.weights.h5", "data"))
    messages = "\n".join(_experiment_here(common + [f"--output_dir={copy}"]))
    assert "training from update" not in messages and "Averaging" not in messages
    entry = json.load(open(os.path.join(copy, "results.json"), encoding="utf-8"))["baseline"]
    assert entry["training"]["route"] == "fit" and entry["training"]["updates"] == 6
    assert 0.0 <= entry["test2016"]["bleu"] <= 100.0
    assert len(open(os.path.join(copy, "runs", "baseline", "test2016.hyp"),
                    encoding="utf-8").readlines()) == 5


def test_a_results_archive_keeps_scored_runs_beyond_their_machine(tmp_path, monkeypatch):
    """--archive_dir: the scored runs of one output directory are archived; with that output
    directory gone (a lost machine), another one gets them back from the archive, in results,
    seed statistics and paired tests, and trains none of them again."""
    from deep_nmt_tf.experiments import stages
    from deep_nmt_tf.experiments.archive import RECORD, Archive

    runs = {"baseline-seed1": (1, WEAK), "baseline-seed2": (2, WEAK[:-1] + [REFS[-1]]),
            "deep_pre-seed1": (1, REFS), "deep_pre-seed2": (2, REFS[:-1] + [WEAK[-1]])}
    suite, results, out, refs = _suite_on_disk(tmp_path, runs)
    for name in runs:  # scored by the tool: each run directory has its experiment.json
        (tmp_path / "out" / "runs" / name / "experiment.json").write_text("{}")
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)
    for split in ("train", "valid"):
        for side in ("en", "de"):
            (tmp_path / f"{split}.{side}").write_text("a\n", encoding="utf-8")
    (tmp_path / "test2016.en").write_text("a\n" * len(REFS), encoding="utf-8")
    monkeypatch.setattr(stages, "figures", lambda *args: [])
    trained = []

    def fake_run_one(run, *args, **kwargs):
        trained.append(run.name)
        return results.get(run.name)  # "other": never scored (as if stopped after training)

    monkeypatch.setattr(stages, "run_one", fake_run_one)
    archive_dir = str(tmp_path / "repo" / "results")
    first = stages.run_suite(suite, str(tmp_path), out, only=["baseline"],
                             archive_dir=archive_dir, log=lambda m: None)
    assert trained == ["baseline-seed1", "baseline-seed2"]
    archive = Archive(archive_dir, suite.name, refs)
    assert archive.runs() == sorted(runs)  # the runs scored before this invocation too
    record = json.load(open(os.path.join(archive_dir, "deep_pre-seed2", RECORD), encoding="utf-8"))
    assert record["entry"] == results["deep_pre-seed2"] and record["suite"] == suite.name
    assert open(os.path.join(archive_dir, "deep_pre-seed2", "test2016.hyp"),
                encoding="utf-8").read().splitlines() == runs["deep_pre-seed2"][1]
    assert not archive.store("deep_pre-seed2", results["deep_pre-seed2"],
                             os.path.join(out, "runs", "deep_pre-seed2"))  # current: kept
    # The machine is lost: a new output directory, the archive only.
    import shutil

    shutil.rmtree(out)
    trained.clear()
    from deep_nmt_tf.experiments import report

    monkeypatch.setattr(stages, "figures", report.figures)  # no run directory: none drawn
    messages = []
    again = stages.run_suite(suite, str(tmp_path), str(tmp_path / "new"),
                             archive_dir=archive_dir, log=messages.append)
    assert trained == ["other"]  # the one run never scored; the archived ones are taken
    assert sum("taken from the archive" in m for m in messages) == 4
    assert again["deep_pre-seed1"]["archive"]["dir"] == os.path.join(
        os.path.abspath(archive_dir), "deep_pre-seed1")
    assert again["systems"]["deep_pre"]["seeds"] == [1, 2]
    by_key = {(c["system"], c["reference"], c["metric"]): c for c in again["comparisons"]}
    before = {(c["system"], c["reference"], c["metric"]): c for c in first["comparisons"]}
    assert by_key["deep_pre", "baseline", "bleu_lc"]["delta"] == pytest.approx(
        before["deep_pre", "baseline", "bleu_lc"]["delta"])
    assert len(by_key["deep_pre", "baseline", "bleu_lc"]["pairs"]) == 2
    table = open(os.path.join(tmp_path / "new", "results.md"), encoding="utf-8").read()
    assert "From the results archive" in table and "deep_pre-seed2" in table
    # A changed translation file or another reference: that test is dropped, with the reason.
    with open(os.path.join(archive_dir, "baseline-seed1", "test2016.hyp"), "a",
              encoding="utf-8") as f:
        f.write("extra\n")
    said = []
    assert "test2016" not in Archive(archive_dir, suite.name, refs, said.append).entry(
        "baseline-seed1")
    assert "missing or changed" in said[0]
    other_ref = tmp_path / "other.de"
    other_ref.write_text("x\n", encoding="utf-8")
    said.clear()
    entry = Archive(archive_dir, suite.name, {"test2016": str(other_ref)}, said.append).entry(
        "deep_pre-seed1")
    assert "test2016" not in entry and "another reference file" in said[0]
    # A record of another suite is refused, naming its file.
    with pytest.raises(ValueError, match=r"deep_pre-seed1/record.json: a record of the suite"):
        Archive(archive_dir, "tatoeba", refs).entry("deep_pre-seed1")


def test_an_archived_run_of_another_recipe_is_refused(tmp_path):
    from deep_nmt_tf.config import load_config
    from deep_nmt_tf.config.loading import save_config
    from deep_nmt_tf.experiments import stages
    from deep_nmt_tf.experiments.archive import Archive
    from deep_nmt_tf.experiments.suite import planned_runs

    suite = load_suite(SUITE)
    run = [r for r in planned_runs(suite, ["baseline"], ()) if r.name == "baseline"][0]
    archive = Archive(str(tmp_path / "archive"), suite.name, {})
    os.makedirs(archive.run_dir("baseline"))
    save_config(load_config(run.config, ["training.label_smoothing=0.2"]),
                os.path.join(archive.run_dir("baseline"), "config.yaml"))
    with pytest.raises(ValueError, match=r"another recipe .*training.label_smoothing"):
        stages._check_archived_recipe(run, archive, [f"training.seed={run.seed}"])
    save_config(load_config(run.config, [f"training.seed={run.seed}"]),
                os.path.join(archive.run_dir("baseline"), "config.yaml"))
    stages._check_archived_recipe(run, archive, [f"training.seed={run.seed}"])  # the same


def test_an_archived_runs_curves_draw_its_grad_norm_ratio(tmp_path):
    """A results archive's record keeps the run's scalar curves: read back as the run's
    scalars (no event files) and drawn in the suite's r_t figure."""
    from deep_nmt_tf.analysis.events import read_run
    from deep_nmt_tf.experiments.report import figures
    from deep_nmt_tf.experiments.suite import planned_runs

    archived = tmp_path / "archive" / "deep_post_admin-seed1"
    archived.mkdir(parents=True)
    (archived / "record.json").write_text(json.dumps({"curves": {
        "train/grad_norm_ratio": [[100, 200, 300], [0.23, 0.88, 0.89]],
        "train/grad_norm_h1": [[100], [0.01]], "train/grad_norm_hN": [[100], [0.04]],
        "eval/bleu": [[1000], [24.9]]}}), encoding="utf-8")
    data = read_run(str(archived))
    steps, values = data.scalar("grad_norm_ratio", ("train",))
    assert list(steps) == [100, 200, 300] and list(values) == [0.23, 0.88, 0.89]
    assert list(data.scalar("bleu", ("eval",))[1]) == [24.9]
    suite = load_suite(SUITE)
    runs = planned_runs(suite, ["deep_post_admin-seed1"])
    out = tmp_path / "out"
    assert figures(suite, runs, str(out), ("a", "b"), lambda m: None) == []  # nothing here
    written = figures(suite, runs, str(out), ("a", "b"), lambda m: None,
                      {"deep_post_admin-seed1": str(archived)})
    assert [os.path.basename(p) for p in written] == ["grad_norm_ratio.png", "grad_norms.png"]
