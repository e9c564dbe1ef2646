"""Reliability at the edges (issue 34), table-driven like ``tests/test_robustness.py``: one
writer per run directory, impossible sizes, compiled code bound to a CPU, and ``python -m
deep_nmt_tf.tools.<name>`` from a checkout with a regular and an editable install.

Each row is one case: its input (a lock left in a run directory, a config, a cache entry of
another CPU, an install kind) and the expected outcome (refused with which message, taken over
with which WARNING, files untouched, the step a run resumes from).  The tools run in this
process on a tiny trained run (``tests/test_robustness.py``'s ``RUN``); XLA's cache and the
installs need fresh processes.
"""

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import types

import pytest
import yaml

from deep_nmt_tf import run_lock, sizing
from deep_nmt_tf.config import config_from_dict, load_config
from test_robustness import RUN, _digest, _messages, _tool, _write, robustness_run

from deep_nmt_tf.tools import average_checkpoints as average_tool  # noqa: E402
from deep_nmt_tf.tools import evaluate as evaluate_tool  # noqa: E402
from deep_nmt_tf.tools import export as export_tool  # noqa: E402
from deep_nmt_tf.tools import fit as fit_tool  # noqa: E402
from deep_nmt_tf.tools import preprocess as preprocess_tool  # noqa: E402
from deep_nmt_tf.tools import train as train_tool  # noqa: E402
from deep_nmt_tf.tools import translate as translate_tool  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A trained run directory (ckpt-2, ckpt-4) of ``RUN`` (the session's, shared with
    ``tests/test_robustness.py``: tests copy it before they change it)."""
    return robustness_run(tmp_path_factory)


def _copy(real_run, tmp_path, name="copy"):
    target = str(tmp_path / name)
    shutil.copytree(real_run, target)
    return target


def _config_file(tmp_path, **training):
    tree = dict(RUN, training=dict(RUN["training"], **training))
    return _write(tmp_path / "c.yaml", yaml.safe_dump(tree))


# =============================================================================================
# 1. One writer per run directory
# =============================================================================================


@pytest.fixture
def processes():
    """Starts processes for a test and ends them after it."""
    started = []

    def start(*argv):
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _hold(processes, directory, tool="deep-nmt-train"):
    """A live process holding ``directory``'s lock (as a training would); returns its pid."""
    code = ("import sys, time\nfrom deep_nmt_tf import run_lock\n"
            "run_lock.acquire(sys.argv[1], sys.argv[2])\nprint('held', flush=True)\n"
            "time.sleep(600)\n")
    proc = processes(sys.executable, "-c", code, directory, tool)
    assert proc.stdout.readline().strip() == "held"
    return proc.pid


def _ended_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _leave_lock(directory, age=0.0, text=None, **fields):
    """Writes the lock file a process described by ``fields`` would have left, ``age`` seconds
    after its last heartbeat."""
    os.makedirs(directory, exist_ok=True)
    here = run_lock._machine()
    record = dict(here, pid=os.getppid(), pid_start=run_lock._process_start(os.getppid()),
                  tool="deep-nmt-train", started=time.time() - 3600, token="left-behind")
    record.update(fields)
    path = os.path.join(directory, run_lock.LOCK_NAME)
    _write(path, json.dumps(record) if text is None else text)
    os.utime(path, (time.time() - age, time.time() - age))
    return record


def _sleeper(processes):
    proc = processes("sleep", "600")
    return {"pid": proc.pid, "pid_start": run_lock._process_start(proc.pid)}


LOCK_CASES = [
    # (case, the lock left in the run directory: processes -> fields of _leave_lock, refusal
    #  (regex) or None when it is taken over, the take-over WARNING (regex))
    ("a live process on this host", _sleeper,
     rf"in use by another writer: process \d+ on host {re.escape(HOST)} \(deep-nmt-train\), "
     r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", None),
    ("its process has ended", lambda p: {"pid": _ended_pid()}, None,
     rf"taking over the lock .*run\.lock of process \d+ on host {re.escape(HOST)} "
     r"\(deep-nmt-train\), started .*: that process has ended"),
    ("its process id now belongs to a later process",
     lambda p: {"pid": os.getppid(), "pid_start": "1"}, None, r": that process has ended"),
    ("the machine has restarted since", lambda p: dict(_sleeper(p), boot_id="another-boot"),
     None, r"the machine has restarted since"),
    ("another host, heartbeat 20 s ago", lambda p: {"host": "gpu-7", "pid": 4242, "age": 20},
     r"in use by another writer: process 4242 on host gpu-7 \(deep-nmt-train\), started .*, "
     r"last heartbeat 2\d s ago .*from another host after 300 s without a heartbeat", None),
    ("another host, no heartbeat for 10 minutes",
     lambda p: {"host": "gpu-7", "pid": 4242, "age": 600}, None,
     r"process 4242 on host gpu-7 .*: no heartbeat for 6\d\d s \(more than 300 s\)"),
    ("another container of this host, heartbeat 20 s ago",
     lambda p: {"pid": 4242, "pid_namespace": "pid:[1]", "age": 20},
     r"in use by another writer: process 4242 on host", None),
    ("an unreadable lock file, a minute old", lambda p: {"text": "{not json", "age": 60}, None,
     r"of an unreadable lock file: the lock file cannot be read and is 6\d s old"),
]


@pytest.mark.parametrize("case,left,refusal,warning", LOCK_CASES,
                         ids=[c[0] for c in LOCK_CASES])
def test_lock_cases(tmp_path, processes, caplog, case, left, refusal, warning):
    run = str(tmp_path / "run")
    fields = dict(left(processes))
    _leave_lock(run, **fields)
    path = os.path.join(run, run_lock.LOCK_NAME)
    before = open(path, encoding="utf-8").read()
    lock = run_lock.RunLock(run, "deep-nmt-train", heartbeat=0)
    if refusal:
        with pytest.raises(run_lock.RunLockError, match=refusal):
            lock.acquire()
        assert open(path, encoding="utf-8").read() == before  # The holder's file untouched.
        return
    with caplog.at_level(logging.WARNING):
        lock.acquire()
    assert re.search(warning, _messages(caplog)), _messages(caplog)
    assert json.load(open(path))["pid"] == os.getpid()
    lock.release()
    assert not os.path.exists(path)


def test_the_lock_is_reentrant_heartbeats_and_notices_a_take_over(tmp_path, caplog):
    run = str(tmp_path / "run")
    with run_lock.hold(run, "deep-nmt-train", heartbeat=0.05):
        path = os.path.join(run, run_lock.LOCK_NAME)
        with run_lock.hold(run, "deep-nmt-experiment"):  # The same process: re-entrant.
            assert json.load(open(path))["tool"] == "deep-nmt-train"
        assert os.path.exists(path)
        os.utime(path, (0, 0))
        time.sleep(0.3)
        assert time.time() - os.stat(path).st_mtime < 5  # The heartbeat refreshed it.
        with caplog.at_level(logging.ERROR):  # Another host took it over after a timeout.
            _leave_lock(run, host="gpu-7", pid=4242, token="theirs")
            time.sleep(0.3)
        assert "was taken over by process 4242 on host gpu-7" in _messages(caplog, logging.ERROR)
    assert json.load(open(path))["token"] == "theirs"  # Not removed: it is not this lock's.


def test_only_the_chief_of_a_multi_worker_run_holds_the_lock(tmp_path, monkeypatch):
    assert run_lock.chief_task(None, None, []) is True
    assert run_lock.chief_task("chief", 0, ["chief", "worker"]) is True
    assert run_lock.chief_task("worker", 0, ["worker"]) is True
    assert run_lock.chief_task("worker", 0, ["chief", "worker"]) is False
    assert run_lock.chief_task("worker", 1, ["worker"]) is False
    cluster = {"worker": ["a:1", "b:2"]}
    for index, held in ((1, False), (0, True)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                    "task": {"type": "worker", "index": index}}))
        run = str(tmp_path / f"run{index}")
        with run_lock.acquire(run, "deep-nmt-train", multi_worker=True):
            assert os.path.exists(os.path.join(run, run_lock.LOCK_NAME)) == held
        assert not os.path.exists(os.path.join(run, run_lock.LOCK_NAME))


def _writers(run, tmp_path):
    """(tool, arguments) of every tool that writes a run directory."""
    config = _config_file(tmp_path, train_steps=6)
    return [(train_tool, [f"--config={config}", f"--model_dir={run}"]),
            (fit_tool, [f"--model_dir={run}"]),
            (preprocess_tool, [f"--config={config}", f"--model_dir={run}"])]


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, processes, capfd):
    """deep-nmt-train (a second terminal, a re-submitted job), deep-nmt-fit, deep-nmt-preprocess
    and deep-nmt-experiment on a run directory another training holds: refused, exit 2, the
    holder named, nothing written (the refusal comes before any work)."""
    run = str(tmp_path / "run")
    _write(os.path.join(run, "checkpoint"), 'model_checkpoint_path: "ckpt-4"\n')
    _write(os.path.join(run, "ckpt-4.index"), "the holder's checkpoint\n")
    pid = _hold(processes, run)
    before = _digest(run)
    for tool, args in _writers(run, tmp_path):
        capfd.readouterr()
        assert _tool(tool, *args) == "2", tool.__name__
        err = capfd.readouterr().err
        assert re.search(rf"error: {re.escape(run)} is in use by another writer: process {pid} "
                         rf"on host {re.escape(HOST)} \(deep-nmt-train\), started \d{{4}}-", err)
        assert "Traceback" not in err
        assert _digest(run) == before

    from deep_nmt_tf.experiments import load_suite, run_suite

    data = tmp_path / "data"
    for name in ("train", "valid", "test2016"):
        for suffix in ("en", "de"):
            _write(data / f"{name}.{suffix}", "a b\n")
    out = tmp_path / "out"
    held = str(out / "runs" / "baseline")
    pid = _hold(processes, held, "deep-nmt-experiment")
    suite = load_suite(os.path.join(ROOT, "configs", "multi30k", "suite.yaml"))
    with pytest.raises(run_lock.RunLockError, match=rf"process {pid} .*deep-nmt-experiment"):
        run_suite(suite, str(data), str(out), only=["baseline"])
    assert os.listdir(held) == [run_lock.LOCK_NAME]  # The run's stages never started.


@pytest.mark.slow
def test_read_only_tools_work_beside_a_training(real_run, tmp_path, processes, capfd):
    """translate, evaluate, export and averaging into another directory never take the
    lock."""
    run = _copy(real_run, tmp_path)
    _hold(processes, run)
    lock = open(os.path.join(run, run_lock.LOCK_NAME)).read()
    text = _write(tmp_path / "in.txt", "Ta broku glimo.\n")
    assert _tool(translate_tool, f"--model_dir={run}", f"--input={text}",
                 f"--output={tmp_path / 'out.txt'}", "--nojit_compile", "--noprogress") == ""
    assert open(tmp_path / "out.txt").read().strip()
    assert _tool(evaluate_tool, f"--model_dir={run}", f"--output={tmp_path / 'test.hyp'}",
                 "--beam_size=1", "--nojit_compile") == ""
    assert _tool(export_tool, f"--model_dir={run}", f"--export_dir={tmp_path / 'export'}",
                 "--nojit_compile") == ""
    assert _tool(average_tool, f"--model_dir={run}", f"--output={tmp_path / 'avg'}") == ""
    assert open(os.path.join(run, run_lock.LOCK_NAME)).read() == lock


@pytest.mark.slow
def test_a_dead_trainings_lock_is_taken_over_and_training_resumes(real_run, tmp_path, caplog):
    """A training killed with SIGKILL leaves its lock: the next one takes it over with a
    WARNING and resumes from the newest checkpoint (step 4), then releases it."""
    run = _copy(real_run, tmp_path)
    dead = _leave_lock(run, pid=_ended_pid())
    with caplog.at_level(logging.INFO, logger="absl"):
        assert _tool(train_tool, f"--config={_config_file(tmp_path, train_steps=6)}",
                     f"--model_dir={run}", "--verbosity=0") == ""
    logs = _messages(caplog, logging.INFO)
    assert re.search(rf"taking over the lock .* of process {dead['pid']} on host "
                     rf"{re.escape(HOST)} \(deep-nmt-train\).*: that process has ended", logs)
    assert "Training from step 4 to 6" in logs, logs[-3000:]
    assert not os.path.exists(os.path.join(run, run_lock.LOCK_NAME))
    assert os.path.exists(os.path.join(run, "ckpt-6.index"))


# =============================================================================================
# 3. Impossible sizes: the estimate before anything is built
# =============================================================================================

STACK = dict(num_layers=2, num_heads=2, ffn_dim=24, input_dropout=0.0, residual_dropout=0.0)
RNMT = dict(num_layers=2, units=8, embedding_dropout=0.0, dropout=0.0)
PARAMETER_CASES = [
    # (case, model section): the estimate must equal the built model's count_params()
    ("transformer post-norm", {"encoder": {"transformer": STACK},
                               "decoder": {"transformer": STACK}}),
    ("pre-norm, DLCL learnable, normalised embedding, untied softmax",
     {"encoder": {"transformer": dict(STACK, norm="pre", dlcl={
         "enabled": True, "normalize_embedding": True})},
      "decoder": {"transformer": dict(STACK, norm="pre", num_layers=3, tie_softmax=False,
                                      dlcl={"enabled": True})}}),
    ("DLCL fixed weights without layer norms, post-norm",
     {"encoder": {"transformer": dict(STACK, dlcl={"enabled": True, "weights": "avg",
                                                   "layer_norm": False, "window": 2})},
      "decoder": {"transformer": STACK}}),
    ("lexical shortcuts (encoder) and feature fusion on both decoder attentions",
     {"encoder": {"transformer": dict(STACK, lexical_shortcuts={"enabled": True,
                                                                "source": "non_lexical"})},
      "decoder": {"transformer": dict(STACK, lexical_shortcuts={
          "enabled": True, "variant": "feature_fusion", "placement": "both"})}}),
    ("Admin (a learnable omega per residual) in both stacks",
     {"encoder": {"transformer": dict(STACK, residual_scaling={"method": "admin"})},
      "decoder": {"transformer": dict(STACK, residual_scaling={"method": "admin"})}}),
    ("DeepNorm in both stacks (constants, no weights)",
     {"encoder": {"transformer": dict(STACK, residual_scaling={"method": "deepnorm"})},
      "decoder": {"transformer": dict(STACK, residual_scaling={"method": "deepnorm"})}}),
    ("transparent attention, untied embeddings",
     {"tie_source_target_embeddings": False, "transparent_attention": {"enabled": True},
      "encoder": {"transformer": dict(STACK, num_layers=3)},
      "decoder": {"transformer": STACK}}),
    ("RNMT+ with transparent attention (embedding not mixed)",
     {"d_model": 12, "tie_source_target_embeddings": False,
      "transparent_attention": {"enabled": True},
      "encoder": {"type": "rnmt_plus", "rnmt_plus": dict(RNMT, num_layers=3)},
      "decoder": {"type": "rnmt_plus", "rnmt_plus": dict(RNMT, attention_dim=12)}}),
    ("RNMT+ with transparent attention (embedding mixed: d = 2U)",
     {"d_model": 16, "tie_source_target_embeddings": False,
      "transparent_attention": {"enabled": True},
      "encoder": {"type": "rnmt_plus", "rnmt_plus": RNMT},
      "decoder": {"type": "rnmt_plus", "rnmt_plus": dict(RNMT, units=0, num_layers=3)}}),
    ("hybrid: Transformer encoder, RNMT+ decoder",
     {"tie_source_target_embeddings": False, "encoder": {"transformer": STACK},
      "decoder": {"type": "rnmt_plus", "rnmt_plus": RNMT}}),
    ("hybrid: RNMT+ encoder, Transformer decoder",
     {"tie_source_target_embeddings": False, "encoder": {"type": "rnmt_plus",
                                                         "rnmt_plus": RNMT},
      "decoder": {"transformer": STACK}}),
    ("cascaded: RNMT+ then Transformer",
     {"tie_source_target_embeddings": False, "encoder": {"type": "cascaded", "cascaded": {
         "stages": [{"type": "rnmt_plus", "rnmt_plus": RNMT},
                    {"type": "transformer", "transformer": STACK}]}},
      "decoder": {"type": "rnmt_plus", "rnmt_plus": RNMT}}),
    ("multi-column: RNMT+, Transformer and a cascade",
     {"tie_source_target_embeddings": False, "encoder": {"type": "multi_column",
                                                         "multi_column": {"columns": [
         {"type": "rnmt_plus", "rnmt_plus": RNMT},
         {"type": "transformer", "transformer": STACK},
         {"type": "cascaded", "cascaded": {"stages": [
             {"type": "transformer", "transformer": STACK},
             {"type": "rnmt_plus", "rnmt_plus": RNMT}]}}]}},
      "decoder": {"transformer": STACK}}),
]


@pytest.mark.parametrize("case,model", PARAMETER_CASES, ids=[c[0] for c in PARAMETER_CASES])
def test_parameter_estimate_equals_the_built_model(case, model):
    from deep_nmt_tf.models import build_model

    config = config_from_dict({"model": dict({"d_model": 16, "vocab_size": 97}, **model),
                               "data": {"corpus": "synthetic"}}, source=case)
    counted = sizing.count_parameters(config.model)
    assert counted["total"] == build_model(config).count_params()
    assert counted["total"] == sum(v for k, v in counted.items() if k != "total")


DEMO = os.path.join(ROOT, "configs", "demo.yaml")
HUGE = "model.encoder.transformer.num_layers=100000"
SIZE_CASES = [
    # (case, flags besides --model_dir, exit status, expected stdout (regex), expected stderr)
    ("100,000 encoder layers", [f"--config={DEMO}", f"--override={HUGE}"], "2", None,
     r"train: error: the model has 19,\d{3},\d{3},\d{3} parameters and its training needs about "
     r"[\d.]+ TiB \(weights [\d.]+ GiB, .*activations .*\), but only [\d.]+ GiB of memory is "
     r"available \((MemAvailable in /proc/meminfo|the cgroup memory limit)\)"),
    ("a billion tokens per batch",
     [f"--config={DEMO}", "--override=training.batch_tokens=1000000000"], "2", None,
     r"train: error: the model has 1,517,056 parameters .* activations [\d.]+ TiB"),
    ("--check: the demo config", [f"--config={DEMO}", "--check"], "0",
     r"config: .*demo\.yaml: valid; .* is a new run\nparameters: 1,517,056 \(vocabulary 1,000 "
     r"from data\.vocab_size.*\n(.|\n)*training memory \(float32; largest micro-batch 24 x 64 "
     r"source \+ 64 target positions\): [\d.]+ GiB\n(.|\n)*available memory: [\d.]+ GiB "
     r"(.|\n)*verdict: fits", None),
    ("--check: 100,000 encoder layers", [f"--config={DEMO}", "--check", f"--override={HUGE}"],
     "2", r"parameters: 19,\d{3},\d{3},\d{3}", r"train: error: the model has 19,"),
]


@pytest.mark.parametrize("case,args,status,out,err", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_size_cases(tmp_path, capfd, case, args, status, out, err):
    """Decided from the config in seconds (no TensorFlow, nothing built), and nothing written:
    the run directory is not even created."""
    run = str(tmp_path / "run")
    capfd.readouterr()
    start = time.perf_counter()
    assert _tool(train_tool, f"--model_dir={run}", *args) == status
    assert time.perf_counter() - start < 20
    stdout, stderr = capfd.readouterr()
    if out:
        assert re.search(out, stdout), stdout
    if err:
        assert re.search(err, stderr), stderr
    assert "Traceback" not in stderr
    assert not os.path.exists(run)


def test_fit_refuses_an_impossible_size_before_preprocessing(tmp_path, capfd):
    run = str(tmp_path / "run")
    assert _tool(fit_tool, f"--model_dir={run}", f"--config={DEMO}", f"--override={HUGE}") == "2"
    assert re.search(r"fit: error: the model has 19,\d{3},\d{3},\d{3} parameters",
                     capfd.readouterr().err)
    assert not os.path.exists(os.path.join(run, "data"))


def test_memory_check_and_its_opt_out(monkeypatch, capfd):
    """--nomemory_check trains a config the estimate refuses (the estimate may be wrong)."""
    from absl import flags

    config = load_config(DEMO)
    monkeypatch.setattr(sizing, "available_memory", lambda: (2**20, "a test's 1 MiB"))
    for extra, refused in (([], True), (["--nomemory_check"], False)):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["train", f"--config={DEMO}", "--model_dir=unused", *extra])
        if refused:
            with pytest.raises(SystemExit):
                train_tool._check_size(config)
            assert "only 1.0 MiB of memory is available (a test's 1 MiB)" in capfd.readouterr().err
        else:
            train_tool._check_size(config)


def test_memory_estimate_parts(tmp_path):
    config = load_config(DEMO)
    base = sizing.estimate(config, gpu=False)
    p = base.parameters["total"]
    assert base.memory["weights"] == base.memory["gradients"] == 4 * p
    assert base.memory["optimizer state"] == 8 * p  # Adam's two moments
    assert base.batch.sentences == 3072 // 128
    # Accumulators with gradient accumulation; half-precision copies and activations in
    # mixed precision; half the batch per worker of a two-worker run.
    accumulate = sizing.estimate(load_config(DEMO, ["training.gradient_accumulation_steps=2"]))
    assert accumulate.memory["gradient accumulators"] == 4 * p
    mixed = sizing.estimate(load_config(DEMO, ["training.precision=mixed_bfloat16"]))
    assert mixed.memory["half-precision weights"] == 2 * p
    assert mixed.memory["activations"] < base.memory["activations"]
    two = {"cluster": {"chief": ["a:1"], "worker": ["b:2"]}, "task": {"type": "chief"}}
    assert sizing.workers_of_tf_config(json.dumps(two)) == 2
    assert sizing.workers_of_tf_config(None) == 1
    assert sizing.estimate(config, workers=2).batch.sentences == base.batch.sentences // 2
    # The vocabulary: a run directory's vocab.txt once it exists.
    _write(tmp_path / "vocab.txt", "".join(f"t{i}\n" for i in range(321)))
    sized = sizing.estimate(config, tmp_path)
    assert (sized.vocab_size, sized.vocab_source) == (321, str(tmp_path / "vocab.txt"))
    # With a GPU the host holds all but the activations.
    gpu = sizing.estimate(config, gpu=True)
    assert gpu.host_bytes == gpu.total_bytes - gpu.memory["activations"]
    sizing.check_fits(gpu, gpu.host_bytes, "test")
    with pytest.raises(sizing.SizeError):
        sizing.check_fits(base, base.host_bytes - 1, "test")
    # An encoder type from outside the package: not estimated, never refused.
    foreign = types.SimpleNamespace(model=types.SimpleNamespace(
        vocab_size=10, d_model=8, encoder=types.SimpleNamespace(type="conv", get=lambda: None)),
        training=config.training, data=config.data)
    unknown = sizing.estimate(foreign, gpu=False)
    assert unknown.parameters is None and "not estimated" in unknown.report()
    sizing.check_fits(unknown, 1, "test")
    available, where = sizing.available_memory()
    assert available is None or available > 0, where


# =============================================================================================
# 4. Compiled code bound to a CPU
# =============================================================================================

ZEN3 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2\n\nprocessor\t: 1\n"
        "flags\t\t: other\n")


def test_cpu_feature_key_follows_the_instruction_set():
    from deep_nmt_tf.hardware import cpu_feature_key

    key = cpu_feature_key(ZEN3)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert cpu_feature_key(ZEN3.replace("fpu sse avx avx2", "avx2 avx sse fpu")) == key
    assert cpu_feature_key(ZEN3.replace("flags\t\t: other", "flags\t\t: x")) == key  # CPU 0's
    assert cpu_feature_key(ZEN3.replace("model name\t: AMD EPYC", "model name\t: X")) == key
    for other in (ZEN3.replace("avx2", "avx2 avx512f"),
                  ZEN3.replace("model\t\t: 1", "model\t\t: 17"),
                  ZEN3.replace("cpu family\t: 25", "cpu family\t: 26"),
                  ZEN3.replace("AuthenticAMD", "GenuineIntel")):
        assert cpu_feature_key(other) != key
    assert re.fullmatch(r"[0-9a-f]{16}", cpu_feature_key())  # This machine's.


def test_xla_cache_lives_in_a_directory_per_cpu_and_prunes_all_of_them(tmp_path, monkeypatch):
    from deep_nmt_tf import cli, hardware

    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    assert cli.enable_compilation_cache(str(tmp_path))
    keyed = os.path.join(str(tmp_path), f"cpu-{hardware.cpu_feature_key()}")
    assert os.environ["TF_XLA_FLAGS"].split("=")[-1] == keyed and os.path.isdir(keyed)
    for i, directory in enumerate((keyed, str(tmp_path / "cpu-other"), str(tmp_path))):
        path = _write(os.path.join(directory, f"xla_compile_cache__{i}__XLA_CPU_JIT.pb"), "x" * 99)
        os.utime(path, (1000 + i, 1000 + i))
    assert cli.prune_compilation_cache(str(tmp_path), max_bytes=100) == 2  # The oldest two.
    assert os.listdir(str(tmp_path)) != [] and not os.listdir(keyed)


@pytest.mark.slow
def test_a_search_cache_entry_of_another_cpu_is_not_loaded(tmp_path_factory, tmp_path,
                                                          monkeypatch):
    from deep_nmt_tf import hardware
    from deep_nmt_tf.inference import Translator
    from test_decoding_helpers import trained_model_dir

    model_dir = trained_model_dir(tmp_path_factory)
    cache = str(tmp_path / "searches")
    monkeypatch.setattr(hardware, "cpu_feature_key", lambda cpuinfo=None: "0" * 16)
    foreign = Translator.from_model_dir(model_dir, jit_compile=False, search_cache=cache)
    expected = [[h.text for h in nbest] for nbest in foreign.translate(["a b c"])]
    written = _digest(cache)
    monkeypatch.undo()
    here = Translator.from_model_dir(model_dir, jit_compile=False, search_cache=cache)
    assert [[h.text for h in nbest] for nbest in here.translate(["a b c"])] == expected
    assert here._model is not None  # Traced for this CPU, not loaded from the other's entry.
    assert set(_digest(cache)) > set(written)
    assert all(_digest(cache)[name] == digest for name, digest in written.items())


_XLA_PROGRAM = """
import sys
from deep_nmt_tf import cli, hardware
if sys.argv[1] != "this":
    hardware.cpu_feature_key = lambda cpuinfo=None: sys.argv[1]
if sys.argv[2] == "keyed":
    assert cli.enable_compilation_cache(sys.argv[3])
else:  # What an unkeyed cache does: one directory for every CPU.
    import os
    os.environ["TF_XLA_FLAGS"] = "--tf_xla_persistent_cache_directory=" + sys.argv[3]
import tensorflow as tf
f = tf.function(lambda x: tf.reduce_sum(tf.nn.relu(x @ tf.transpose(x))), jit_compile=True)
print("result", float(f(tf.ones([8, 8]))))
"""


def _xla(key, mode, directory):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    env.pop("TF_XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", _XLA_PROGRAM, key, mode, directory],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "result 512.0" in proc.stdout, proc.stderr[-3000:]
    return proc.stderr


def _entries(directory):
    return sorted(os.path.join(r, n) for r, _, names in os.walk(directory) for n in names
                  if n.startswith("xla_compile_cache__"))


@pytest.mark.slow
def test_an_xla_entry_of_another_cpu_is_ignored_without_a_warning(tmp_path):
    """An entry compiled on a CPU with an extension this one lacks (made here: an entry of this
    CPU whose recorded target features claim one of the extensions it was compiled without, as
    an AVX-512 machine's would) is what XLA warns about when it loads it from a shared
    directory.  In the cache of the tools it sits under the other CPU's key: XLA never reads
    it, compiles for this CPU, and says nothing."""
    mismatch = "Machine type used for XLA:CPU compilation doesn't match"
    cache = str(tmp_path / "xla")
    _xla("f0f0f0f0f0f0f0f0", "keyed", cache)  # Compiled "on the other machine".
    (entry,) = _entries(cache)
    assert os.path.dirname(entry) == os.path.join(cache, "cpu-f0f0f0f0f0f0f0f0")
    data = open(entry, "rb").read()
    missing = re.search(rb"-(avx512f|amx-tile|avx512bw|avx10\.1|sse4a),", data)
    assert missing, "no feature this CPU lacks in the entry's target features"
    with open(entry, "wb") as f:
        f.write(data.replace(missing.group(0), b"+" + missing.group(0)[1:], 1))
    foreign = open(entry, "rb").read()
    # The control: one unkeyed directory, as before; XLA loads it and warns.
    assert mismatch in _xla("this", "unkeyed", os.path.dirname(entry))
    err = _xla("this", "keyed", cache)
    assert mismatch not in err and "Target machine feature" not in err, err[-3000:]
    from deep_nmt_tf import cli

    mine = [e for e in _entries(cache) if e != entry]
    assert [os.path.dirname(e) for e in mine] == [cli.xla_cache_dir(cache)]
    assert open(entry, "rb").read() == foreign  # The other CPU's entry is left alone.


# =============================================================================================
# 5. python -m deep_nmt_tf.tools.<name> from a checkout, with a regular and an editable install
# =============================================================================================


def _run(argv, cwd, **kwargs):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the source tree (what a user cloned) and a directory holding only absl-py
    (the tools' only import before their flags are checked), for fresh virtual environments."""
    import absl

    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for name in ("deep_nmt_tf", "tools"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    deps = base / "deps"
    deps.mkdir()
    os.symlink(os.path.dirname(absl.__file__), deps / "absl")
    return {"base": base, "src": str(src), "deps": str(deps)}


def _venv(checkout, name, wheel):
    """A fresh virtual environment with ``wheel`` installed (no dependencies but absl)."""
    venv = checkout["base"] / name
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                str(checkout["base"])).returncode == 0
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                str(checkout["base"])).stdout.strip()
    _write(os.path.join(site, "deps.pth"), checkout["deps"] + "\n")
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                 wheel], str(checkout["base"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def _wheel(checkout, editable):
    out = str(checkout["base"] / ("edist" if editable else "dist"))
    build = "build_editable" if editable else "build_wheel"
    proc = _run([sys.executable, "-c", "import sys, setuptools.build_meta as b; "
                 f"print(b.{build}(sys.argv[1]))", out], checkout["src"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(out, proc.stdout.strip().splitlines()[-1])


INSTALL_CASES = [
    # (case, editable install, directory the command runs in: the checkout's root or another)
    ("pip install ., from the repository root", False, "src"),
    ("pip install ., from another directory", False, "base"),
    ("pip install -e ., from the repository root", True, "src"),
    ("pip install -e ., from another directory", True, "base"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,editable,where", INSTALL_CASES, ids=[c[0] for c in INSTALL_CASES])
def test_python_m_tools_work_from_any_directory(checkout, case, editable, where):
    """README's ``python -m deep_nmt_tf.tools.<name>`` (here: train without flags, which
    reaches its own usage check) and the console script, in a fresh environment."""
    name = "editable" if editable else "regular"
    python = checkout.get(name) or checkout.setdefault(
        name, _venv(checkout, f"venv-{name}", _wheel(checkout, editable)))
    cwd = checkout["src"] if where == "src" else str(checkout["base"])
    for argv in ([python, "-m", "deep_nmt_tf.tools.train"],
                 [os.path.join(os.path.dirname(python), "deep-nmt-train")]):
        proc = _run(argv, cwd)
        assert "--config=FILE and --model_dir=DIR are required" in proc.stderr, proc.stderr
        assert "No module named" not in proc.stderr
    where_is = _run([python, "-c", "import deep_nmt_tf.tools.train as t; print(t.__file__)"],
                    cwd).stdout.strip()
    if editable or where == "src":  # The checkout's own code.
        assert where_is == os.path.join(checkout["src"], "tools", "train.py")
    else:
        assert where_is.endswith(os.path.join("site-packages", "deep_nmt_tf", "tools",
                                              "train.py"))
